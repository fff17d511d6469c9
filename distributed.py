"""
How train.py spreads a model over torchrun's processes (config key `parallelism`): DDP, a full
replica per process, or FSDP2 (`fully_shard`: each holds 1/world_size of every parameter, gradient
and AdamW moment). Also activation checkpointing and gradient sync. checkpoint.py saves the shards.
"""

import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def setup():
    """(ddp, rank, local_rank, world_size). Under torchrun (RANK set) the DDP path is taken even
    with one process, as NanoGPT does."""
    if int(os.environ.get("RANK", -1)) == -1:
        return False, 0, 0, 1
    return (True, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
            int(os.environ["WORLD_SIZE"]))


def init_process_group(backend, device):
    """The default process group, torch._dynamo imported before it: else some of its default
    arguments hold the group and gloo's threads outlive it, now and then aborting the exit."""
    import torch._dynamo  # noqa: F401

    on_gpu = backend == "nccl" and str(device).startswith("cuda")
    dist.init_process_group(backend=backend, device_id=torch.device(device) if on_gpu else None)


def first_on_any_rank(value):
    """The lowest rank's value that is not None (a collective): what every rank then decides on."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return next((v for v in gathered if v is not None), None)


def gather_rng_state(generator, device, ddp):
    """The batch generator's state and every rank's dropout stream (torch, and CUDA on a GPU), so
    that a resume continues each rank's stream exactly (a collective under torchrun)."""
    on_cuda = torch.device(device).type == "cuda"
    mine = {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if on_cuda else None}
    ranks = [mine]
    if ddp:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    state = {"batches": generator.get_state(), "torch": [r["torch"] for r in ranks]}
    if on_cuda:
        state["cuda"] = [r["cuda"] for r in ranks]
    return state


def checkpoint_activations(model):
    """Each Block keeps only its input for the backward pass and runs its forward again there: about
    1/3 more compute for the activation memory of all layers but one. The same dropout masks are
    replayed, so the loss and gradients are the plain model's; the state_dict is unchanged."""
    from torch.utils.checkpoint import checkpoint

    for block in model.transformer.h:
        def forward(x, cache=None, rope=None, _plain=block.forward):
            if cache is not None or not torch.is_grad_enabled():  # decoding and evaluation
                return _plain(x, cache, rope)
            return checkpoint(_plain, x, cache, rope, use_reentrant=False)

        block.forward = forward  # an instance attribute: nn.Module.__call__ finds it first


def shard(model, device, dtype, compile):
    """FSDP2: each Block a unit (gathered just before it runs, freed after), the root the rest.
    Under bf16, parameters are gathered in bf16 and gradients reduced in fp32; the master weights
    and AdamW stay fp32. Blocks are compiled before sharding, so FSDP's hooks stay out of graphs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy()
    if dtype == "bfloat16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        if compile:
            block.compile()
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def wrap_model(model, c, ddp, device, dtype):
    """The model to train for config c: compiled, and under torchrun DDP-wrapped or sharded (without
    torchrun, parallelism='fsdp' is one plain process)."""
    if c["activation_checkpointing"]:
        checkpoint_activations(model)
    if ddp and c["parallelism"] == "fsdp":
        return shard(model, device, dtype, c["compile"])
    if c["compile"]:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[torch.device(device).index] if device.startswith("cuda")
                    else None)
    return model


def gradient_sync(model, sync):
    """A context for one micro-step: gradients are reduced over the ranks only when sync is True
    (the last micro-step), else they accumulate locally. DDP: no_sync(); FSDP2: its own switch."""
    if isinstance(model, DDP):
        return nullcontext() if sync else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
    return nullcontext()
