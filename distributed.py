"""
How train.py spreads a model over processes: DDP (the default) or sharded training with PyTorch's
FSDP2 (`torch.distributed.fsdp.fully_shard`), picked by the config key `parallelism`; both are
launched with torchrun. Also optional activation checkpointing of each Block, gradient-sync control
for gradient accumulation, and the sharded checkpoint of an FSDP run.

Under FSDP every rank holds 1/world_size of each parameter, gradient and AdamW moment. A checkpoint
is then two things in out_dir, written at the same evaluation:
    ckpt_sharded/   model + optimizer shards (torch.distributed.checkpoint: one file per rank and a
                    metadata file) and train_state.pt (iter_num, best_val_loss, every rank's RNG,
                    model_args); what `init_from='resume'` reads back, also on another world size
    ckpt.pt         the consolidated export in the single-process format (the full model gathered
                    on rank 0, model_args, meta, config, iter_num; no optimizer): what sample.py,
                    eval_hellaswag.py and checkpoint.load_model_and_tokenizer read
The folder is written as ckpt_sharded.tmp and renamed into place once every rank has finished and
train_state.pt, written last, marks it complete; a crash at any moment, even a second one during the
next save, leaves the newest complete folder under one of three names (settle_shards), where a resume
finds it (docs/training.md, "Sharded training").
"""

import ctypes
import gc
import os
import shutil
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from atomic import sync_folder
from checkpoint import (CHECKPOINT_NAME, CheckpointError, load_checkpoint, lock_out_dir, read_checkpoint_file,
                        save_checkpoint)
from configurator import ConfigError
from runtime import is_rank_zero

PARALLELISMS = ("ddp", "fsdp")
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets
SHARDED_NAME = "ckpt_sharded"  # the folder in out_dir
REFUSE_WAIT_SECONDS = 60  # how long a rank other than 0 waits to be stopped when a resume is refused
TRAIN_STATE_NAME = "train_state.pt"  # inside it, beside the shards


# -----------------------------------------------------------------------------
# the processes

def setup():
    """(ddp, rank, local_rank, world_size). Under torchrun (RANK set) the DDP path is taken even with
    one process, as NanoGPT does."""
    if os.environ.get("RANK", "-1") == "-1":
        return False, 0, 0, 1
    try:
        rank, local_rank, world_size, _ = (int(os.environ[name]) for name in
                                           ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"))
        consistent = 0 <= rank < world_size and local_rank >= 0 and "MASTER_ADDR" in os.environ
    except (KeyError, ValueError):
        consistent = False
    if not consistent:
        found = ", ".join(f"{name}={os.environ.get(name)!r}" for name in LAUNCH_VARIABLES)
        raise ConfigError(f"RANK is set, so this is a launched training process, but the launcher's variables "
                          f"are incomplete or inconsistent ({found}): start it with torchrun, or unset RANK")
    return True, rank, local_rank, world_size


def init_process_group(backend, device):
    """Create the default process group, importing torch._dynamo first. DDP imports it anyway, and
    with it torch.distributed.nn.functional, whose functions take `group=group.WORLD` as a default
    argument: imported after the group exists, those defaults hold the group for the life of the
    process, destroy_process_group cannot free it, and gloo's threads still run while the
    interpreter shuts down ("terminate called without an active exception", now and then, at exit).
    An NCCL group is bound to this rank's GPU (device_id), so that a barrier knows its device rather
    than taking the current one with a warning at every run."""
    import torch._dynamo  # noqa: F401

    on_gpu = backend == "nccl" and str(device).startswith("cuda")
    dist.init_process_group(backend=backend, device_id=torch.device(device) if on_gpu else None)


def teardown(run_state):
    """Free the process group now, while the interpreter is whole: drop what the run holds (the
    attributes of run_state: DDP's reducer and FSDP's sharded parameters hold the group), collect
    whatever cycle may still hold it, then destroy it, which joins gloo's threads."""
    vars(run_state).clear()
    gc.collect()
    dist.destroy_process_group()


def gather_rng_state(generator, device, launched):
    """The RNG state a checkpoint holds: the batch generator's, and the torch (and CUDA) dropout
    stream of every rank, gathered from all of them when launched (a collective), so that a resume
    under DDP or FSDP continues each rank's stream exactly."""
    on_cuda = torch.device(device).type == "cuda"
    state = {"batches": generator.get_state(), "torch": [torch.get_rng_state()]}
    if on_cuda:
        state["cuda"] = [torch.cuda.get_rng_state(device)]
    if launched:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, {k: v for k, v in state.items() if k != "batches"})
        state["torch"] = [g["torch"][0] for g in gathered]
        if on_cuda:
            state["cuda"] = [g["cuda"][0] for g in gathered]
    return state


def stop_with_launcher():
    """Have the kernel send this training process SIGTERM when its launcher (torchrun's agent, the
    parent) dies, even by SIGKILL: the worker then saves a checkpoint and exits, as on any SIGTERM,
    instead of training on unsupervised while a restarted run writes the same out_dir. Linux only
    (prctl PR_SET_PDEATHSIG); elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def first_on_any_rank(value):
    """The lowest rank's value that is not None (a collective): what every rank then decides on."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return next((v for v in gathered if v is not None), None)


def stop_if_any_rank_failed(error):
    """Every rank, once the process group exists: stop them all if any rank could not start (its data
    or checkpoint missing or unreadable), with the lowest such rank's error on rank 0. Each rank reads
    out_dir and the data folder where it runs, which on several nodes may differ: a rank that stopped
    alone would leave the others waiting for it in init_process_group until its timeout."""
    failed = first_on_any_rank(None if error is None else (dist.get_rank(), error))
    if failed is None:
        return
    rank, error = failed
    if rank != 0:  # rank 0 found what this rank did not
        error = type(error)(f"rank {rank} of {dist.get_world_size()}: {error} (rank 0 found its own: on several nodes, "
                            f"out_dir and the data folder must be at the same path on a filesystem every node sees)")
    refuse(str, str(error), error=type(error))


def claim_out_dir(out_dir, launched):
    """Every rank, once the process group exists: rank 0 takes out_dir's lock (checkpoint.lock_out_dir)
    and tells the others whether it got it, so that a run that finds out_dir in use stops on every
    rank, with one error line (rank 0's), instead of leaving ranks to fail in their next collective.
    Returns the lock file on rank 0 (keep it open for the run's life), None on the other ranks."""
    rank = dist.get_rank() if launched else 0
    lock, error = None, [None]
    if rank == 0:
        try:
            lock = lock_out_dir(out_dir)
        except CheckpointError as e:
            error = [str(e)]
    if launched:
        dist.broadcast_object_list(error, src=0)
    if error[0] is not None:
        refuse(str, error[0])
    return lock


# -----------------------------------------------------------------------------
# wrapping the model

def checkpoint_activations(model):
    """Activation checkpointing: each Block keeps only its input for the backward pass and runs its
    forward again there, trading ~1/3 more compute for the activation memory of all layers but one.
    The recomputation replays the same dropout masks (checkpoint restores the RNG state), so the
    loss and gradients are those of the plain model. Generation (a KV cache) and evaluation (no
    grad) run the plain forward. The state_dict keys do not change."""
    from torch.utils.checkpoint import checkpoint

    for block in model.transformer.h:
        def forward(x, cache=None, rope=None, _plain=block.forward):
            if cache is not None or not torch.is_grad_enabled():
                return _plain(x, cache, rope)
            return checkpoint(_plain, x, cache, rope, use_reentrant=False)

        block.forward = forward  # an instance attribute: nn.Module.__call__ finds it first


def shard(model, device, dtype, compile):
    """FSDP2: each Block its own unit (its parameters gathered just before it runs and freed after),
    then the root for the embeddings, the final norm and the head (the tied wte / lm_head weight is
    one parameter of the root). With bf16, parameters are gathered in bf16 and gradients reduced in
    fp32 while the sharded master weights and AdamW stay fp32. With compile, each Block is compiled
    in place before it is sharded (the torchtitan recipe: FSDP's hooks stay outside the graphs,
    and the state_dict keys keep no "_orig_mod." prefix)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    if dtype == "bfloat16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    for block in model.transformer.h:
        if compile:
            block.compile()
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def wrap_model(model, c, launched, device, dtype, say=print):
    """(the model to train, the model to evaluate) for config c. `launched`: under torchrun. Without
    torchrun both parallelisms are one plain process; activation checkpointing works in all three."""
    if c["activation_checkpointing"]:
        checkpoint_activations(model)
    if launched and c["parallelism"] == "fsdp":
        if c["compile"]:
            say("compiling each block with torch.compile...")
        model = shard(model, device, dtype, c["compile"])
        return model, model
    if c["compile"]:
        say("compiling the model with torch.compile...")
        model = torch.compile(model)
    if launched:
        device_ids = [torch.device(device).index] if torch.device(device).type == "cuda" else None
        model = DDP(model, device_ids=device_ids)
        return model, model.module  # evaluation needs no DDP hooks
    return model, model


def is_sharded(model):
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def gradient_sync(model, sync):
    """A context for one micro-step of gradient accumulation: gradients are reduced over the ranks
    only when sync is True (the last micro-step), and accumulate locally before it. DDP: no_sync().
    FSDP2: set_requires_gradient_sync, which keeps the unsharded gradients (in fp32 under bf16
    mixed precision) until the reduce-scatter of the last micro-step."""
    if isinstance(model, DDP):
        return nullcontext() if sync else model.no_sync()
    if is_sharded(model):
        model.set_requires_gradient_sync(sync)
    return nullcontext()


# -----------------------------------------------------------------------------
# the sharded checkpoint

def _folders(out_dir):
    out_dir = Path(out_dir)
    return out_dir / SHARDED_NAME, out_dir / (SHARDED_NAME + ".tmp"), out_dir / (SHARDED_NAME + ".old")


def write_shards(model, optimizer, out_dir):
    """Write the model and optimizer shards into out_dir/ckpt_sharded.tmp (a collective: every rank
    writes its own file, rank 0 the metadata). The out_dir must be one folder for all ranks:
    multi-node, a shared filesystem. commit_shards then makes it the checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _, tmp, _ = _folders(out_dir)
    if dist.get_rank() == 0:  # a complete folder a crash left under another name becomes the checkpoint first
        settle_shards(out_dir)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(tmp))
    # dcp.save returns on rank 0 only after every rank's shard and the metadata are written


def commit_shards(out_dir, train_state):
    """Rank 0, after write_shards: put train_state.pt beside the shards, which marks the folder
    complete (it is written last), and make the folder the checkpoint. The other ranks do not wait:
    the next write_shards starts with a barrier."""
    _, tmp, _ = _folders(out_dir)
    save_checkpoint(train_state, tmp / TRAIN_STATE_NAME)
    settle_shards(out_dir, newest=tmp)


def settle_shards(out_dir, newest=None):
    """Rank 0: rename the newest complete folder (default: newest_shards) to ckpt_sharded and remove
    the others. A directory cannot be renamed over another, so the previous checkpoint moves aside
    to ckpt_sharded.old first; each step leaves the newest complete folder under one of the three
    names, where newest_shards finds it, so no kill, nor a second one during the next save, loses it."""
    final, tmp, old = _folders(out_dir)
    newest = newest or newest_shards(out_dir)
    if newest == tmp:
        if final.exists():
            _remove(old)
            os.replace(final, old)
        os.replace(tmp, final)
    elif newest == old:
        _remove(final)  # only ever older, or damaged: the newest is the .old one
        os.replace(old, final)
    sync_folder(out_dir)  # the renames on disk before the previous checkpoint goes
    _remove(tmp)  # incomplete: a crash while writing it
    _remove(old)


def _remove(folder):
    """The marker first: a folder half deleted is never taken for complete."""
    (folder / TRAIN_STATE_NAME).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def newest_shards(out_dir):
    """The complete sharded folder (train_state.pt present) with the highest iteration, or None.
    On a tie, the one written last: .tmp (its commit was cut short), then the canonical name, then .old."""
    final, tmp, old = _folders(out_dir)
    complete = [(train_state_iteration(folder), order, folder)
                for order, folder in enumerate((old, final, tmp)) if (folder / TRAIN_STATE_NAME).is_file()]
    return max(complete)[2] if complete else None


def train_state_iteration(folder):
    """The iteration of a complete sharded folder; one whose train_state.pt cannot be read is a
    CheckpointError, not passed over: its shards may still be what the user wants back."""
    try:
        return read_checkpoint_file(Path(folder) / TRAIN_STATE_NAME)["iter_num"]
    except (CheckpointError, KeyError, TypeError) as e:
        raise CheckpointError(damaged(folder, f"its {TRAIN_STATE_NAME} cannot be read: {e}")) from None


def full_model_state(model):
    """The unsharded model state dict, gathered to rank 0 on CPU ({} on the other ranks): a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_train_state(out_dir):
    """What an FSDP resume needs before the model exists: train_state.pt of the newest complete
    sharded folder (iter_num, best_val_loss, rng, model_args), with "sharded_dir" naming the folder
    (the path to name as what the run resumes from). Called by every rank, before the process group
    exists; a missing or damaged folder is a CheckpointError on each rank that finds it, which
    stop_if_any_rank_failed then says for all (a node may see other files than rank 0's)."""
    folder = newest_shards(out_dir)
    if folder is None:
        raise CheckpointError(missing(out_dir))
    problem = shards_problem(folder)
    if problem:
        raise CheckpointError(damaged(folder, problem))
    if superseded_by(out_dir, folder) is not None:
        raise CheckpointError(superseded(out_dir, folder))
    state = read_checkpoint_file(folder / TRAIN_STATE_NAME)
    state["sharded_dir"] = str(folder)
    return state


def missing(out_dir):
    hint = ""
    try:
        if "optimizer" in load_checkpoint(out_dir, mmap=True):  # mapped: the keys alone are read
            hint = " Its ckpt.pt was written by a DDP or single-process run: resume it with parallelism='ddp'."
    except CheckpointError:
        pass
    return f"no sharded checkpoint at {_folders(out_dir)[0]} to resume an FSDP run from.{hint}"


def superseded_by(out_dir, folder):
    """ckpt.pt if a run without FSDP wrote it after `folder`'s shards, which are then an earlier FSDP
    run's (left by a kill before that run's first save removed them, or by a train.py that did not);
    else None. An FSDP run's own export is always written after its shards, and says so."""
    path = Path(out_dir) / CHECKPOINT_NAME
    try:
        if path.stat().st_mtime_ns <= (Path(folder) / TRAIN_STATE_NAME).stat().st_mtime_ns:
            return None
        checkpoint = load_checkpoint(out_dir, mmap=True)  # mapped: the keys alone are read
    except (OSError, CheckpointError):
        return None
    return None if "sharded" in checkpoint else checkpoint


def superseded(out_dir, folder):
    later = superseded_by(out_dir, folder)["iter_num"]
    ckpt = Path(out_dir) / CHECKPOINT_NAME
    return (f"{folder} holds an earlier FSDP run (iteration {train_state_iteration(folder)}): {ckpt} (iteration "
            f"{later}) was written after it by a run without FSDP. Resume that run with parallelism='ddp', or move "
            f"{ckpt} out of {out_dir} to resume the FSDP run")


def remove_shards(out_dir):
    """Rank 0, after a run without FSDP saved its ckpt.pt: remove an earlier FSDP run's sharded folders,
    which that save replaced (a later FSDP resume would otherwise take them up). Whether there were any."""
    found = [folder for folder in _folders(out_dir) if folder.exists()]
    for folder in found:
        _remove(folder)
    return bool(found)


def shards_problem(folder):
    """What makes the shard files of a complete folder unreadable, read from DCP's metadata without
    loading a tensor: a missing or unreadable .metadata, a missing or truncated .distcp file. None if
    none."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
        needed = {}
        for info in metadata.storage_data.values():
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    except Exception as e:  # FileNotFoundError, or whatever unpickling a damaged file raises
        return f"its .metadata cannot be read: {type(e).__name__}: {e}"
    for name, size in sorted(needed.items()):
        path = Path(folder) / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size < size:
            return f"{name} holds {path.stat().st_size:,} of its {size:,} bytes"
    return None


def damaged(folder, problem):
    """The message for a sharded checkpoint that cannot be loaded: what is wrong, and what to do."""
    out_dir = Path(folder).parent
    try:
        export = f"; {out_dir / CHECKPOINT_NAME} holds the weights of iteration {load_checkpoint(out_dir, mmap=True)['iter_num']}"
    except CheckpointError:
        export = ""
    return (f"the sharded checkpoint {folder} is damaged ({problem}); nothing in {out_dir} was changed{export}, "
            f"without the optimizer state (sample.py and eval_hellaswag.py read it). Restore the folder from a copy, "
            f"or start again with init_from='scratch'")


def refuse(message, *args, error=CheckpointError):
    """Stop a start that every rank finds wrong alike (a checkpoint that cannot be read, a config that
    does not fit the world size) with one error line: error(message(*args)) on rank 0, which train.py
    prints. The other ranks say nothing (nor compute the message, which may read ckpt.pt): they wait
    for the launcher to stop them once rank 0 has exited, since a rank that exited first would have
    the launcher stop rank 0 before it said why; without a launcher that does, they exit with status
    1 after a minute."""
    if not is_rank_zero():
        for stop in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop, signal.SIG_DFL)  # end quietly, with no handler's save or traceback
        time.sleep(REFUSE_WAIT_SECONDS)
        raise SystemExit(1)
    raise error(message(*args))


def load_sharded(model, optimizer, folder):
    """Load the model and optimizer shards of `folder` into the sharded model and its optimizer
    (a collective). torch.distributed.checkpoint reshards, so the world size may differ from the
    saving run's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    try:
        dcp.load(state, checkpoint_id=str(folder))
    except Exception as e:  # DCP raises on every rank when one cannot read its part
        refuse(damaged, folder, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
