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
The folder is written as ckpt_sharded.tmp and renamed into place only when every rank has
finished, so a crash leaves the previous complete folder (docs/training.md, "Sharded training").
"""

import ctypes
import os
import shutil
import signal
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoint import CheckpointError, load_checkpoint, save_checkpoint

PARALLELISMS = ("ddp", "fsdp")
SHARDED_NAME = "ckpt_sharded"  # the folder in out_dir
TRAIN_STATE_NAME = "train_state.pt"  # inside it, beside the shards


# -----------------------------------------------------------------------------
# the processes

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
    if dist.get_rank() == 0:  # left by a crash while saving
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(tmp))
    # dcp.save returns on rank 0 only after every rank's shard and the metadata are written


def commit_shards(out_dir, train_state):
    """Rank 0, after write_shards: put train_state.pt beside the shards and rename the folder into
    place. Two renames, yet never a moment without a complete folder: load_train_state falls back
    on ckpt_sharded.old when a crash came between them. The other ranks do not wait: the next
    write_shards starts with a barrier."""
    final, tmp, old = _folders(out_dir)
    save_checkpoint(train_state, tmp / TRAIN_STATE_NAME)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def full_model_state(model):
    """The unsharded model state dict, gathered to rank 0 on CPU ({} on the other ranks): a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_train_state(out_dir):
    """What an FSDP resume needs before the model exists: train_state.pt of the newest complete
    sharded folder (iter_num, best_val_loss, rng, model_args), with "sharded_dir" naming the folder."""
    final, _, old = _folders(out_dir)
    folder = final if final.is_dir() else old  # .old alone: a crash between save_sharded's renames
    if not (folder / TRAIN_STATE_NAME).is_file():
        hint = ""
        try:
            if "optimizer" in load_checkpoint(out_dir):
                hint = " Its ckpt.pt was written by a DDP or single-process run: resume it with parallelism='ddp'."
        except CheckpointError:
            pass
        raise CheckpointError(f"no sharded checkpoint at {final} to resume an FSDP run from.{hint}")
    state = load_checkpoint_state(folder / TRAIN_STATE_NAME)
    state["sharded_dir"] = str(folder)
    return state


def load_checkpoint_state(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read {path}: {type(e).__name__}: {e}") from e


def load_sharded(model, optimizer, folder):
    """Load the model and optimizer shards of `folder` into the sharded model and its optimizer
    (a collective). torch.distributed.checkpoint reshards, so the world size may differ from the
    saving run's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
