"""
Train a GPT whose attention is one of the four variants of arXiv 2403.01643.

    python train.py config/quickstart.py --attention=efficient  # one process: a CPU, one GPU
    python train.py config/quickstart.py --init_from=resume     # go on where out_dir's run stopped
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py  # DDP on 8 GPUs
    (FSDP2: add --parallelism=fsdp; several nodes: torchrun's own flags, docs/training.md)

The config is NanoGPT's: defaults, then config files, then --key=value overrides (configurator.py;
`python train.py --help` lists every key). The run is also a function, train(config) -> summary.
Rank 0 writes ckpt.pt (checkpoint.py), log.jsonl and summary.json (runlog.py) to out_dir. A SIGINT
or SIGTERM saves a checkpoint after the current step and stops; a resume from it is exact.
"""

import math
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

import distributed
import eval_hellaswag
from checkpoint import (CHECKPOINT_NAME, SHARDED_NAME, CheckpointError, commit_shards,
                        first_non_finite, full_model_state, holds_checkpoint, load_sharded,
                        load_resume_checkpoint, load_weights, lock_out_dir, save_checkpoint,
                        write_shards)
from configurator import (MODEL_ARG_KEYS, ConfigError, get_config, help_text, resolve_config,
                          world_size_problem)
from data import Batches, DataError, check_data, choose_vocab_size, config_data_dir
from model import GPT, PRETRAINED_GPT2, GPTConfig, PretrainedUnavailableError
from runlog import NO_EARLIER_PROCESS, open_log, read_summary, run_totals, write_summary
from runtime import (CpuThreads, StopSignals, autocast_context, is_rank_zero, peak_flops,
                     resolve_device, resolve_dtype, run_script)

# the most training losses left unread on the device: they are read at log steps, all at once, so
# that the CPU queues the next steps while a GPU runs this one
MAX_UNREAD_LOSSES = 1000


class NonFiniteLossError(RuntimeError):
    """The loss or the weights became NaN or inf; the last good checkpoint is left as it was."""


def get_lr(it, c):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters. A warmup longer than the decay
    is cut to lr_decay_iters - 1 steps, so that a short run still decays."""
    if not c["decay_lr"]:
        return c["learning_rate"]
    warmup = min(c["warmup_iters"], max(c["lr_decay_iters"] - 1, 0))
    if it < warmup:
        return c["learning_rate"] * (it + 1) / (warmup + 1)
    if it > c["lr_decay_iters"]:
        return c["min_lr"]
    progress = (it - warmup) / max(c["lr_decay_iters"] - warmup, 1)
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    return c["min_lr"] + coeff * (c["learning_rate"] - c["min_lr"])


@dataclass
class Run:
    """One run's state: what train() builds, what the loop advances, what a checkpoint keeps."""
    c: dict  # the resolved config
    rank: int
    world_size: int
    ddp: bool  # launched by torchrun (DDP or FSDP)
    device: str
    dtype: str
    out_dir: Path
    data_dir: Path
    meta: dict  # the dataset's meta.json
    model_args: dict
    verbose: bool = True
    iter_num: int = 0
    start_iter: int = 0
    best_val_loss: float = 1e9  # of a saved checkpoint
    evaluated_at_start: bool = False  # the checkpoint resumed from was saved after its evaluation
    last_losses: dict = field(default_factory=lambda: {"train": None, "val": None})
    last_eval_iter: int = None
    step_times: list = field(default_factory=list)
    logged_steps: int = 0  # len(step_times) at the last log
    earlier_processes: dict = field(default_factory=lambda: dict(NO_EARLIER_PROCESS))
    stop_reason: str = "max_iters"
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # kept across resumes
    wall_start: float = field(default_factory=time.time)

    def __post_init__(self):
        self.fsdp = self.ddp and self.c["parallelism"] == "fsdp"
        steps = self.c["gradient_accumulation_steps"]
        self.accum = steps // self.world_size  # micro-steps per rank
        self.tokens_per_iter = steps * self.c["batch_size"] * self.c["block_size"]

    def say(self, *args):
        if self.verbose and self.rank == 0:
            print(*args, flush=True)

    def elapsed(self):
        return time.time() - self.wall_start


# -----------------------------------------------------------------------------
# set-up

def train(config, verbose=True):
    """Run one training as configured (a dict of config keys; missing keys take their defaults) and
    return the summary that is also written to out_dir/summary.json."""
    c = resolve_config(config)
    ddp, rank, local_rank, world_size = distributed.setup()
    if ddp and (problem := world_size_problem(c, world_size)):
        raise ConfigError(problem)
    device = resolve_device(c["device"])
    if ddp and device.startswith("cuda"):  # each process takes its local rank's GPU
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    run = Run(c, rank, world_size, ddp, device, resolve_dtype(c["dtype"], device),
              Path(c["out_dir"]), config_data_dir(c), None, None, verbose)

    # the data, and the checkpoint to resume from
    run.meta, n_tokens, max_token = check_data(run.data_dir, c["block_size"])
    run.model_args = {key: c[key] for key in MODEL_ARG_KEYS}
    run.model_args["vocab_size"] = choose_vocab_size(c, run.meta, max_token, run.data_dir)
    checkpoint = None
    if c["init_from"] == "resume":
        checkpoint = load_resume_checkpoint(run.out_dir, run.model_args, run.fsdp,
                                            (run.meta, run.data_dir))
        # dropout is the config's, as no weight depends on it
        run.model_args = {k: checkpoint["model_args"][k] for k in MODEL_ARG_KEYS}
        run.model_args["dropout"] = c["dropout"]
        finished = checkpoint["iter_num"] >= c["max_iters"] and checkpoint["evaluated"]
        if finished and not c["eval_only"]:
            run.say(f"nothing to train: the run in {run.out_dir} has reached max_iters")
            return read_summary(run.out_dir) or {"iterations": checkpoint["iter_num"]}
    elif not c["eval_only"] and holds_checkpoint(run.out_dir):
        raise CheckpointError(f"{run.out_dir} already holds a checkpoint: --init_from=resume to "
                              f"continue, or another out_dir")

    if ddp:
        auto = "nccl" if device.startswith("cuda") else "gloo"
        distributed.init_process_group(auto if c["backend"] == "auto" else c["backend"], device)
    lock = lock_out_dir(run.out_dir) if rank == 0 else None  # held while the run lives
    try:
        with StopSignals() as signals:  # a SIGINT or SIGTERM stops the loop after a step and a save
            threads = CpuThreads(c["num_threads"], device)
            run.say(f"device {device}, dtype {run.dtype}, {world_size} process(es), {run.accum} "
                    f"micro-step(s) per process, {run.tokens_per_iter:,} tokens per iteration; "
                    f"{run.data_dir}: {n_tokens['train']:,} train / {n_tokens['val']:,} val tokens")
            build(run, checkpoint)
            del checkpoint  # its weights and moments are copied in: free them for the whole run
            return train_loop(run, signals, threads)
    finally:
        if lock is not None:
            lock.close()
        if ddp:
            run.__dict__.clear()  # DDP's reducer and FSDP's parameters hold the group: free them
            dist.destroy_process_group()


def build(run, checkpoint):
    """The model (the same initialisation on every rank, then per-rank dropout streams), the
    optimizer, the batches and the logs, each from the checkpoint when resuming."""
    c = run.c
    torch.manual_seed(c["seed"])
    if c["init_from"] in PRETRAINED_GPT2:
        model = GPT.from_pretrained(c["init_from"], {k: c[k] for k in ("dropout", "attention")})
        if c["block_size"] < model.config.block_size:
            model.crop_block_size(c["block_size"])
        run.model_args = {k: getattr(model.config, k) for k in MODEL_ARG_KEYS}
    else:
        model = GPT(GPTConfig(**run.model_args))
    if checkpoint is not None and not run.fsdp:  # FSDP loads its shards with the optimizer's
        load_weights(model, checkpoint["model"], checkpoint["source"])
    run.raw_model = model.to(run.device)  # the GPT itself (sharded in place under FSDP)
    run.say(f"model: {c['attention']} attention, {model.get_num_params(non_embedding=False):,} "
            f"parameters, {model.flops_per_token():,} training FLOPs per token")
    torch.manual_seed(c["seed"] + run.rank)
    run.model = distributed.wrap_model(model, c, run.ddp, run.device, run.dtype)  # what trains

    run.autocast = autocast_context(run.device, run.dtype)
    run.peak = peak_flops(c["peak_flops"], run.device)  # None: no MFU (CPU, a GPU not in the table)
    device_type = torch.device(run.device).type
    run.scaler = torch.amp.GradScaler(device_type, enabled=run.dtype == "float16")
    run.optimizer = model.configure_optimizers(c["weight_decay"], c["learning_rate"],
                                               (c["beta1"], c["beta2"]), device_type)
    batches = (c["block_size"], c["batch_size"], run.device)
    run.train_batches = Batches(run.data_dir / "train.bin", *batches)
    run.val_batches = Batches(run.data_dir / "val.bin", *batches)
    run.generator = torch.Generator().manual_seed(c["seed"])  # the training batches' offsets
    # On CPU, small evaluation batches waste time in small matmuls: evaluate up to ~16K tokens per
    # forward pass instead (the same sequences). With compile (fixed shapes) and on GPU, one batch.
    run.eval_group = 1
    if run.device == "cpu" and not c["compile"]:
        run.eval_group = max(1, 16384 // (c["batch_size"] * c["block_size"]))
    if checkpoint is not None:
        restore(run, checkpoint)
    run.start_iter = run.iter_num
    run.log = open_log(c, run.out_dir, run.run_id, run.start_iter, run.rank)
    run.hellaswag = c["hellaswag_interval"] and eval_hellaswag.examples_for_training(
        c["hellaswag_file"], c["hellaswag_limit"], run.meta)


def restore(run, checkpoint):
    """The optimizer, step, RNG streams and totals of the checkpoint."""
    if run.fsdp:
        load_sharded(run.raw_model, run.optimizer, checkpoint["source"])
    else:
        run.optimizer.load_state_dict(checkpoint["optimizer"])
        if "scaler" in checkpoint and run.scaler.is_enabled():
            run.scaler.load_state_dict(checkpoint["scaler"])
    # the moments are the checkpoint's, the hyperparameters the config's (as is the rate)
    for group in run.optimizer.param_groups:
        group["betas"] = (run.c["beta1"], run.c["beta2"])
    run.optimizer.param_groups[0]["weight_decay"] = run.c["weight_decay"]  # group 0 decays
    run.iter_num, run.best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    run.run_id = checkpoint.get("run_id", run.run_id)
    run.evaluated_at_start = checkpoint["evaluated"]
    run.earlier_processes = checkpoint.get("totals", run.earlier_processes)
    rng = checkpoint["rng"]
    run.generator.set_state(rng["batches"])
    # a rank the checkpoint has no stream for (it was saved by fewer processes) keeps its own seed's
    if run.rank < len(rng["torch"]):
        torch.set_rng_state(rng["torch"][run.rank])
    if run.device.startswith("cuda") and run.rank < len(rng.get("cuda") or ()):
        torch.cuda.set_rng_state(rng["cuda"][run.rank], run.device)
    run.say(f"resuming from {checkpoint['source']} at iteration {run.iter_num}")


# -----------------------------------------------------------------------------
# the loop

def train_loop(run, signals, threads):
    """Evaluate (and save) every eval_interval iterations and at the end; step; log; stop at
    max_iters, or after a step and a save on a signal. Returns the summary."""
    c, model, optimizer = run.c, run.model, run.optimizer
    unread = []  # (iteration, loss on the device) of the steps not yet read back
    try:
        if c["eval_only"]:
            evaluate(run)
            run.stop_reason = "eval_only"
        while not c["eval_only"]:
            # a resume does not repeat the evaluation its checkpoint was saved after
            fresh = not (run.iter_num == run.start_iter and run.evaluated_at_start)
            last = run.iter_num >= c["max_iters"]
            evaluates = fresh and (run.iter_num % c["eval_interval"] == 0 or last)
            scores = fresh and run.hellaswag and run.iter_num % c["hellaswag_interval"] == 0
            scores = scores and run.iter_num > 0
            if evaluates or scores:
                read_losses(run, unread)  # nothing is evaluated or saved after a non-finite loss
            if evaluates:
                evaluate(run)
            if scores:
                run_hellaswag(run)
            if last:
                break

            t0 = time.time()
            lr = get_lr(run.iter_num, c)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss, stop = forward_backward(run, signals)
            unread.append((run.iter_num, loss))
            logs = (run.iter_num + 1) % c["log_interval"] == 0 or run.iter_num + 1 == c["max_iters"]
            if logs or stop or run.ddp or len(unread) >= MAX_UNREAD_LOSSES:
                loss = read_losses(run, unread)
            if c["grad_clip"]:
                run.scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), c["grad_clip"])
            run.scaler.step(optimizer)
            run.scaler.update()
            optimizer.zero_grad(set_to_none=True)
            run.iter_num += 1
            run.step_times.append(time.time() - t0)
            if logs:
                log_step(run, loss, lr)
            if stop:
                run.stop_reason = signals.received or "signal on another rank"
                run.say(f"received {run.stop_reason}: stopping at iteration {run.iter_num}")
                if c["save_checkpoints"]:
                    save(run, run.stop_reason, evaluated=False)  # its evaluation is to come
                break
            threads.adjust()
    except NonFiniteLossError:
        run.stop_reason = "diverged"  # summary.json says so, with no final losses
        run.last_losses.update(train=None, val=None)
        write_summary(run)
        raise
    finally:
        run.log.close()
    summary = write_summary(run)
    val = run.last_losses["val"]
    run.say(f"done: {len(run.step_times)} iterations in {run.elapsed():.1f}s"
            + (f", final val loss {val:.4f}" if val is not None else ""))
    return summary


def forward_backward(run, signals):
    """This rank's micro-batches of one iteration, gradients accumulated; returns (the mean loss,
    whether any rank was signalled to stop). The loss stays on the device in one process; under
    DDP one small all-reduce per step agrees on both, so that all ranks stop after the same step."""
    offsets = run.train_batches.offsets(run.c["gradient_accumulation_steps"], run.generator)
    offsets = offsets[run.rank * run.accum:(run.rank + 1) * run.accum]  # this rank's share
    loss_sum = torch.zeros((), dtype=torch.float32, device=run.device)
    for micro in range(run.accum):
        x, y = run.train_batches.get(offsets[micro])
        with distributed.gradient_sync(run.model, micro == run.accum - 1):  # on the last only
            with run.autocast:
                _, loss = run.model(x, y)
            loss_sum += loss.detach().float()
            run.scaler.scale(loss / run.accum).backward()
    stop = signals.received is not None
    if not run.ddp:
        return loss_sum / run.accum, stop
    flags = torch.stack([loss_sum / run.accum, torch.full_like(loss_sum, float(stop))])
    dist.all_reduce(flags)
    flags[0] /= run.world_size
    loss, stop = flags.tolist()
    return loss, bool(stop)


def read_losses(run, unread):
    """Read the unread losses back at once and empty the list; returns the last one. The first that
    is not finite stops the run as of its iteration: nothing after it is counted or saved."""
    if not unread:
        return None
    iterations, losses = zip(*unread)
    unread.clear()
    if torch.is_tensor(losses[0]):  # under DDP they are floats already
        losses = torch.stack(losses).tolist()
    for it, loss in zip(iterations, losses):
        if not math.isfinite(loss):
            run.iter_num = it
            del run.step_times[it - run.start_iter:]
            raise diverged(run, f"the training loss became {loss}")
    return losses[-1]


@torch.no_grad()  # not inference_mode: FSDP2 writes into the buffers it gathers parameters into
def estimate_loss(run):
    """Mean loss over eval_iters batches per split. The batches are the same at every evaluation
    (their own generator, seeded afresh), so estimates compare, and the training RNG is left alone.
    Under DDP the batches are shared out between the ranks."""
    out = {}
    model = getattr(run.model, "module", run.model)  # without DDP's hooks
    model.eval()
    for split, batches in (("train", run.train_batches), ("val", run.val_batches)):
        g = torch.Generator().manual_seed(run.c["seed"] + 1)
        ix = batches.offsets(run.c["eval_iters"], g)[run.rank::run.world_size]
        wide = torch.float32 if torch.device(run.device).type == "mps" else torch.float64
        total = torch.zeros(2, dtype=wide, device=run.device)
        for k in range(0, len(ix), run.eval_group):
            group = ix[k:k + run.eval_group]
            x, y = batches.get(group.reshape(-1))
            with run.autocast:
                _, loss = model(x, y)
            total[0] += loss.double() * len(group)  # a mean over len(group) equal batches
            total[1] += len(group)
        if run.ddp:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


def evaluate(run):
    """Estimate the losses, log them, and save a checkpoint (always, or when val loss improved)."""
    losses = estimate_loss(run)
    if not all(map(math.isfinite, losses.values())):
        raise diverged(run, f"the evaluated losses became {losses}")
    run.last_losses.update(losses)
    run.last_eval_iter = run.iter_num
    run.say(f"step {run.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    run.log.write({"type": "eval", "iter": run.iter_num, "train_loss": losses["train"],
                   "val_loss": losses["val"], "elapsed_s": run_totals(run)["wall_time_s"]})
    # a resume from a signal's checkpoint, saved before this evaluation, saves it again as
    # evaluated; the initial weights' evaluation is not saved
    owed = run.iter_num == run.start_iter > 0 and not run.evaluated_at_start
    owed = owed and not run.c["eval_only"]
    improved = losses["val"] < run.best_val_loss
    if run.c["save_checkpoints"] and (owed or run.iter_num > run.start_iter
                                      and (improved or run.c["always_save_checkpoint"])):
        run.best_val_loss = min(run.best_val_loss, losses["val"])
        save(run, "evaluation", evaluated=True)


def diverged(run, what):
    kept = ("the last good checkpoint is kept as it was" if (run.out_dir / CHECKPOINT_NAME).exists()
            else "no checkpoint was written")
    return NonFiniteLossError(f"{what} at iteration {run.iter_num}; {kept}. Lower learning_rate, "
                              f"raise warmup_iters or lower grad_clip, then resume or restart")


def save(run, reason, evaluated):
    """Write the checkpoint (rank 0; under FSDP every rank writes its shards first). `evaluated`:
    whether this iteration's evaluation is done, so that a resume neither skips nor repeats it."""
    state = {"model": run.raw_model.state_dict(), "optimizer": run.optimizer.state_dict()}
    bad = first_non_finite(state)
    if run.fsdp:  # each rank sees its own shards: they agree on what to do
        bad = distributed.first_on_any_rank(bad)
    if bad is not None:
        raise diverged(run, f"{bad} holds NaN or inf values (not saving the {reason} checkpoint)")
    rng = distributed.gather_rng_state(run.generator, run.device, run.ddp)
    if run.fsdp:
        write_shards(run.raw_model, run.optimizer, run.out_dir)
        state = {"model": full_model_state(run.raw_model), "sharded": SHARDED_NAME}
    if run.rank != 0:
        return
    ckpt = {"model_args": run.model_args, **state, "iter_num": run.iter_num, "evaluated": evaluated,
            "run_id": run.run_id, "best_val_loss": run.best_val_loss, "config": dict(run.c),
            "rng": rng, "meta": run.meta, "totals": run_totals(run)}
    if run.scaler.is_enabled():
        ckpt["scaler"] = run.scaler.state_dict()
    t = time.time()
    if run.fsdp:  # the shards become the resume point first; ckpt.pt, the gathered model, follows
        commit_shards(run.out_dir, {k: v for k, v in ckpt.items() if k != "model"})
    save_checkpoint(ckpt, run.out_dir / CHECKPOINT_NAME)
    run.say(f"saved checkpoint to {run.out_dir / CHECKPOINT_NAME} at iteration {run.iter_num} "
            f"({reason}, {time.time() - t:.2f}s)")


def run_hellaswag(run):
    examples, tok = run.hellaswag
    result = eval_hellaswag.evaluate(run.raw_model, examples, tok, run.device,
                                     run.c["hellaswag_batch_size"], run.dtype, run.rank,
                                     run.world_size)
    run.log.write({"type": "hellaswag", "iter": run.iter_num, **result,
                   "elapsed_s": run_totals(run)["wall_time_s"]})
    run.say(f"iter {run.iter_num}: hellaswag {eval_hellaswag.accuracies_line(result)}")


def log_step(run, loss, lr):
    # the mean step time since the last log: a step that reads nothing back is timed as the CPU
    # queues it on a GPU, and the log step, which reads the loss, waits for those before it
    timed = run.step_times[max(run.logged_steps, 1):] or run.step_times[-1:]
    run.logged_steps = len(run.step_times)
    dt = sum(timed) / len(timed)
    sequences = run.c["batch_size"] * run.accum
    mfu = None if run.peak is None else run.raw_model.estimate_mfu(sequences, dt, run.peak)
    tokens_per_s = run.tokens_per_iter / dt
    run.say(f"iter {run.iter_num}: loss {loss:.4f}, lr {lr:.2e}, {dt * 1000:.2f} ms/iter, "
            f"{tokens_per_s:,.0f} tokens/s" + ("" if mfu is None else f", mfu {mfu * 100:.2f}%"))
    run.log.write({"type": "train", "iter": run.iter_num, "loss": loss, "lr": lr,
                   "ms_per_iter": dt * 1000, "tokens_per_s": tokens_per_s, "mfu": mfu,
                   "elapsed_s": run_totals(run)["wall_time_s"]})


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(f"{__doc__.strip()}\n\nconfig keys, their defaults and meanings:\n{help_text()}")
        return 0
    try:
        train(get_config(argv))
    except (ConfigError, DataError, CheckpointError, PretrainedUnavailableError, NonFiniteLossError,
            OSError) as e:
        if is_rank_zero():  # every rank finds the same: one line for all
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    run_script(main, "error: stopped by Ctrl-C; the last checkpoint in out_dir, if any, is whole")
