"""What the benchmarks share: the first lines of their output (the machine, torch's version and
the command), so that every table says where and how it was made; options that list names."""
import argparse
import itertools
import shlex

import torch

from runtime import machine_name


def header(script, argv, device):
    """'# <machine>; torch <version>' and '# command: python bench/<script> <argv>'."""
    return (f"# {machine_name(device)}; torch {torch.__version__}\n"
            f"# command: python bench/{script} {shlex.join(argv)}")


def names_among(choices):
    """An argparse type for an nargs="+" option that takes names space- or comma-separated, as
    compare.py's (--variants standard efficient, or --variants=standard,efficient)."""
    def parse(text):
        listed = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in listed if name not in choices]
        if unknown or not listed:
            wrong = f"{', '.join(unknown)} unknown" if unknown else "no name"
            choose = ", ".join(choices)
            raise argparse.ArgumentTypeError(f"{text!r}: {wrong}; choose among {choose}")
        return listed
    return parse


def names(groups):
    """The names of a names_among option (a list per word of the command line), each once."""
    return list(dict.fromkeys(itertools.chain.from_iterable(groups)))
