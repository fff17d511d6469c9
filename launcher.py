"""
`python train.py --standalone --nproc_per_node=N ...`: torchrun's own launcher (torch's elastic
agent) run inside train.py's process, with one difference. torchrun turns a SIGINT or SIGTERM it
receives into a SignalException, a traceback and exit status 1, whatever the training processes
did; this launcher passes the signal to them instead, they finish their step, save and exit 0, and
then it exits 0 too, so that a scheduler or a shell script can tell a clean stop from a failure.
"""

import argparse
import os
import signal
import sys
from pathlib import Path


class LaunchError(RuntimeError):
    """A training process started by `python train.py --nproc_per_node=N ...` failed."""


def split_launcher_args(argv, config_keys):
    """(torchrun's options, train.py's arguments) of one command line, or None when it holds no
    torchrun option. Launcher options are written --name=value (or a bare flag), as config overrides
    are; an option that is neither a config key nor torchrun's stays with train.py's arguments, whose
    parser names the unknown key."""
    from torch.distributed.run import get_args_parser

    candidates = [a for a in argv if a.startswith("--") and a[2:].split("=", 1)[0] not in config_keys]
    if not candidates:
        return None
    parser = get_args_parser()
    # torchrun's own spelling only (--nproc=2 stays a config key, which the config parser names), and
    # a malformed option is one error line rather than torchrun's whole usage
    parser.allow_abbrev, parser.exit_on_error = False, False
    try:
        for arg in candidates:  # "x x": a script and one argument, unless the option takes the first as its value
            if "=" not in arg and parser.parse_known_args([arg, "x", "x"])[0].training_script_args != ["x"]:
                raise LaunchError(f"write the launcher option {arg} with its value, as {arg}=VALUE, so that no "
                                  f"value is taken for a config file")
        _, unknown = parser.parse_known_args([*candidates, "x"])  # what torchrun does not know stays with train.py
    except argparse.ArgumentError as e:
        raise LaunchError(f"launcher option {e}") from None
    launcher = [a for a in candidates if a not in unknown]
    return (launcher, [a for a in argv if a not in launcher]) if launcher else None


def child_pids(parent):
    """The pids of the processes whose parent is `parent`, from Linux's /proc: for the launcher, the
    training processes torch's elastic agent started (each in a session of its own)."""
    pids = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = stat_file.read_text().rsplit(")", 1)[1].split()[1]  # after "pid (name) state"
        except (OSError, IndexError):
            continue  # the process ended meanwhile
        if ppid == str(parent):
            pids.append(int(stat_file.parent.name))
    return pids


def _pass_signal_to_workers(signum, frame):
    pids = child_pids(os.getpid())
    if not pids:  # no training process yet: nothing to save, stop at once
        raise SystemExit(128 + signum)
    print(f"launcher: received {signal.Signals(signum).name}, passing it to the {len(pids)} training process(es)",
          file=sys.stderr, flush=True)
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def planned_world_size(launcher_args):
    """How many training processes torchrun will start: None where an elastic --nnodes (1:4) leaves it
    open. A LaunchError unless --nproc_per_node names at least one process (a number, or torchrun's
    auto, cpu or gpu where they apply): torchrun itself answers a bare AssertionError or a traceback."""
    from torch.distributed.run import determine_local_world_size, get_args_parser

    args = get_args_parser().parse_known_args([*launcher_args, "x"])[0]
    try:
        processes = determine_local_world_size(args.nproc_per_node)
    except ValueError as e:
        processes, problem = 0, str(e).rstrip(".")
    else:
        problem = "no process to start"
    if processes < 1:
        raise LaunchError(f"--nproc_per_node={args.nproc_per_node}: {problem}; give the number of training "
                          f"processes per node (at least 1), or auto")
    least, _, most = ("1" if args.standalone else str(args.nnodes)).partition(":")  # torchrun's default is 1:1
    return processes * int(least) if least.isdigit() and most in ("", least) else None


def keep_our_signal_handlers(launcher_args):
    """torch's agent installs its own SIGINT and SIGTERM handlers as it starts the workers. From torch
    2.10 an option leaves them out; before, the handler it installs is looked up in its module, so
    one that passes these two signals on (and leaves SIGHUP and SIGQUIT to torch's) takes its place."""
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.run import get_args_parser

    _, unknown = get_args_parser().parse_known_args(["--signals-to-handle=SIGHUP,SIGQUIT", "x"])
    if not unknown:
        return [*launcher_args, "--signals-to-handle=SIGHUP,SIGQUIT"]
    torch_handler = api._terminate_process_handler

    def handler(signum, frame):
        if signum in (signal.SIGINT, signal.SIGTERM):
            return _pass_signal_to_workers(signum, frame)
        return torch_handler(signum, frame)

    api._terminate_process_handler = handler
    return launcher_args


def launch(launcher_args, script, script_args):
    """Run `script` under torch's elastic agent in this process, passing SIGINT and SIGTERM to the
    training processes. Returns 0, or raises LaunchError naming the ranks that failed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    if Path("/proc/self/stat").exists():  # how the workers are found to pass them a signal
        launcher_args = keep_our_signal_handlers(launcher_args)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _pass_signal_to_workers)
    try:
        torchrun_main([*launcher_args, str(script), *script_args])
    except ChildFailedError as e:
        codes = ", ".join(f"rank {rank} exit code {f.exitcode}" for rank, f in sorted(e.failures.items()))
        raise LaunchError(f"a training process failed ({codes}); its messages are above") from None
    except (ValueError, RuntimeError) as e:  # torchrun's own checks, its rendezvous (e.g. a port in use)
        first_line = (str(e).strip().splitlines() or [""])[0]
        raise LaunchError(f"torchrun could not start the training processes: {type(e).__name__}: {first_line}") from None
    return 0
