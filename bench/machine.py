"""The first lines of a benchmark's output: the machine it ran on (the GPU, or the CPU model and its
cores), torch's version, and the command, so that every table carries where and how it was made."""
import shlex

import torch

from runtime import machine_name


def header(script, argv, device):
    """'# <machine>; torch <version>' and '# command: python bench/<script> <argv>', measured on `device`."""
    return f"# {machine_name(device)}; torch {torch.__version__}\n# command: python bench/{script} {shlex.join(argv)}"
