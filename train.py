"""
Train a GPT whose attention is one of the four variants of arXiv 2403.01643.

Single process (laptop CPU, one GPU):
    python train.py config/train_shakespeare_char_cpu.py --attention=efficient
Resume (the same config file and overrides again, plus init_from; out_dir holds ckpt.pt):
    python train.py config/train_shakespeare_char_cpu.py --init_from=resume
DDP, one node with 8 GPUs:
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
DDP, two nodes (run on each, node_rank 0 on the master):
    torchrun --nnodes=2 --nproc_per_node=8 --node_rank=0 --master_addr=10.0.0.1 --master_port=29500 train.py config/train_gpt2.py
DDP with train.py as its own torchrun (launcher.py: a SIGINT/SIGTERM stops it with exit status 0):
    python train.py --standalone --nproc_per_node=2 config/quickstart.py --gradient_accumulation_steps=2
FSDP2 (sharded parameters, gradients and AdamW state; distributed.py): the same lines with --parallelism=fsdp

The configuration (configurator.py) works as in NanoGPT: defaults, then config files, then
--key=value overrides; `python train.py --help` lists every key with its meaning. The whole run is
also a function, `train(config) -> summary`, so tests and scripts can run it in-process.

What the run writes to out_dir (rank 0 only):
    ckpt.pt       model_args, model, optimizer, iter_num, evaluated, best_val_loss, config, rng, meta, totals,
                  run_id (checkpoint.py); written atomically, loadable with torch.load(weights_only=True),
                  never with "_orig_mod."; none at all with save_checkpoints=False (throughput runs)
    log.jsonl     one JSON object per logged iteration, per evaluation and per HellaSwag score (runlog.py)
    summary.json  parameters, FLOPs, final losses, speed, peak memory and wall time of the run (all its
                  processes, when it was resumed)
    train.lock    held while the run lives, so that a second run on the same out_dir stops at once
Under FSDP, ckpt.pt holds the gathered model without the optimizer, whose state stays in the shards:
the resume point is the folder ckpt_sharded/ (every rank writes its shards; distributed.py).
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
from checkpoint import (CHECKPOINT_NAME, CheckpointError, check_out_dir_free, first_non_finite, load_checkpoint,
                        load_resume_checkpoint, load_weights, resume_hint, save_checkpoint)
from configurator import (DEFAULT_CONFIG, MODEL_ARG_KEYS, ConfigError, get_config, help_text,
                          naming_config_files, resolve_config, world_size_problem)
from data import Batches, DataError, check_data, choose_vocab_size, config_data_dir
from launcher import LaunchError, launch, planned_world_size, split_launcher_args
from model import GPT, PRETRAINED_GPT2, GPTConfig, PretrainedUnavailableError
from runlog import NO_EARLIER_PROCESS, RunLog, read_summary, run_totals, trim_log, write_summary
from runtime import (CpuThreads, StopSignals, autocast_context, peak_flops, resolve_device, resolve_dtype,
                     is_rank_zero, run_script, silence_stdout)


# the most training losses left on the device unread: with logging and evaluation far apart, the steps
# between them still read theirs back now and then, so that the unread ones never fill the GPU's memory
MAX_UNREAD_LOSSES = 1000


class NonFiniteLossError(RuntimeError):
    """The loss or the weights became NaN or inf; the last good checkpoint is left as it was."""


@dataclass
class Run:
    """Everything one training run holds; train() fills it in, the loop advances it."""
    c: dict  # the resolved config
    out_dir: Path
    data_dir: Path
    meta: dict  # the dataset's meta.json
    model_args: dict
    device: str
    dtype: str
    ddp: bool = False  # launched by torchrun (DDP or FSDP)
    rank: int = 0
    world_size: int = 1
    verbose: bool = True
    wall_start: float = 0.0
    iter_num: int = 0
    start_iter: int = 0
    best_val_loss: float = 1e9
    evaluated_at_start: bool = False  # the checkpoint resumed from was written after its evaluation
    last_losses: dict = field(default_factory=lambda: {"train": None, "val": None})
    last_eval_iter: int = None  # the iteration of last_losses
    step_times: list = field(default_factory=list)  # this process's
    logged_steps: int = 0  # len(step_times) at the last train record
    earlier_processes: dict = field(default_factory=lambda: dict(NO_EARLIER_PROCESS))  # runlog.run_totals
    stop_reason: str = "max_iters"
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # kept across resumes: ties a summary to its checkpoint
    # built by build_run
    model: object = None  # what trains: compiled, DDP- or FSDP-wrapped
    raw_model: object = None  # the GPT itself (sharded in place under FSDP): state dicts, FLOPs
    eval_model: object = None  # what evaluates: without DDP's hooks
    optimizer: object = None
    scaler: object = None
    autocast: object = None
    peak: float = None  # the MFU denominator, None when not known
    generator: object = None  # the training batches' random offsets
    train_batches: object = None
    val_batches: object = None
    eval_group: int = 1  # batches per forward pass in estimate_loss
    log: object = None
    hellaswag: tuple = None
    out_dir_lock: object = None
    # a new run in an out_dir an earlier run checkpointed replaces that run's files at its first save
    keeps_earlier_run: bool = False
    stdout_closed: bool = False  # its reader stopped reading: the run stops as on a SIGTERM

    def __post_init__(self):
        self.master = self.rank == 0
        self.fsdp = self.ddp and self.c["parallelism"] == "fsdp"
        self.accum = self.c["gradient_accumulation_steps"] // self.world_size  # micro-steps per rank per iteration
        self.tokens_per_iter = self.c["gradient_accumulation_steps"] * self.c["batch_size"] * self.c["block_size"]

    def say(self, *args):
        if self.verbose and self.master:
            try:
                print(*args, flush=True)
            except BrokenPipeError:  # `train.py | head`: the loop stops at its next step, with a checkpoint
                silence_stdout()
                self.stdout_closed = True

    def elapsed(self):
        """Seconds since this process started the run."""
        return time.time() - self.wall_start

    def wall_time(self):
        """Seconds the run has taken, over every process that trained it."""
        return self.earlier_processes["wall_time_s"] + self.elapsed()


def get_lr(it, c):
    """Linear warmup for warmup_iters steps, then cosine decay to min_lr at lr_decay_iters."""
    if not c["decay_lr"]:
        return c["learning_rate"]
    if it < c["warmup_iters"]:
        return c["learning_rate"] * (it + 1) / (c["warmup_iters"] + 1)
    if it > c["lr_decay_iters"]:
        return c["min_lr"]
    progress = (it - c["warmup_iters"]) / (c["lr_decay_iters"] - c["warmup_iters"])
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * progress)) * (c["learning_rate"] - c["min_lr"])


# -----------------------------------------------------------------------------
# set-up: everything that can be wrong is checked before anything trains

def train(config, verbose=True):
    """Run one training as configured (a dict of config keys; missing keys take their defaults) and
    return the summary dict that is also written to out_dir/summary.json."""
    started = time.time()
    c = resolve_config(config)
    ddp, rank, local_rank, world_size = distributed.setup()
    if ddp:
        distributed.stop_with_launcher()
    problem = world_size_problem(c, world_size) if ddp else None
    if problem:  # every rank finds this: rank 0 says it
        distributed.refuse(str, problem, error=ConfigError)
    device, dtype = choose_device(c, ddp, local_rank)
    out_dir = Path(c["out_dir"])
    data_dir = config_data_dir(c)
    meta, n_tokens, model_args, checkpoint = read_data_and_checkpoint(c, out_dir, data_dir, ddp, device)
    if checkpoint is not None and has_finished(checkpoint, out_dir, c) and not c["eval_only"]:
        return nothing_to_train(out_dir, checkpoint["iter_num"], c, verbose and rank == 0)

    run = Run(c=c, out_dir=out_dir, data_dir=data_dir, meta=meta, model_args=model_args, device=device, dtype=dtype,
              ddp=ddp, rank=rank, world_size=world_size, verbose=verbose, wall_start=started)
    if checkpoint is not None and checkpoint.get("run_id"):
        run.run_id = checkpoint["run_id"]  # the run this one continues
    threads = CpuThreads(c["num_threads"], device)
    # from here on a SIGINT/SIGTERM stops the run after a step and a checkpoint, even one that
    # arrives while the process group or the model is being set up, or while they are torn down
    with StopSignals() as signals:
        if ddp:  # waits for every rank to join; a stop meanwhile ends the process (nothing trained or written yet)
            with signals.end_process():
                distributed.init_process_group(backend(c, device), device)
        try:
            if ddp:
                distributed.stop_if_any_rank_failed(None)  # a rank on another node may not see out_dir or the data
            # rank 0 creates out_dir and holds its lock until the run or its process ends; all ranks stop if it
            # is taken, before a word of this run's is printed
            run.out_dir_lock = distributed.claim_out_dir(run.out_dir, run.ddp)
            announce(run, n_tokens)
            build_run(run, checkpoint)
            checkpoint = None  # its weights and AdamW moments are copied in: free them for the whole run
            summary = train_loop(run, signals, threads)
            if ddp:
                dist.barrier()  # no rank tears down its connections while another still uses them
            # saved and stopped; one process ends as for any closed pipe, the ranks of DDP with 0, as for a signal
            # (torchrun would call a rank's 141 a failure)
            if run.stdout_closed and not ddp:
                raise BrokenPipeError(f"stdout was closed; the run stopped at iteration {run.iter_num}")
            return summary
        finally:
            if run.out_dir_lock is not None:
                run.out_dir_lock.close()
            if ddp:
                distributed.teardown(run)


def read_data_and_checkpoint(c, out_dir, data_dir, ddp, device):
    """(meta, n_tokens, model_args, the resume checkpoint or None), each checked. A rank that cannot read
    them under torchrun (another node, out_dir not shared) stops every rank, not only itself."""
    try:
        meta, n_tokens, max_token = check_data(data_dir, c["block_size"])
        model_args = {key: c[key] for key in MODEL_ARG_KEYS} | {"vocab_size": choose_vocab_size(c, meta, max_token, data_dir)}
        checkpoint = None
        if c["init_from"] == "resume":
            checkpoint = load_resume_checkpoint(out_dir, model_args, sharded=ddp and c["parallelism"] == "fsdp",
                                                data=(meta, data_dir))
            # a GPT-2 fine-tune's are OpenAI's; dropout is the config's, as no weight depends on it
            model_args = {key: checkpoint["model_args"][key] for key in model_args} | {"dropout": c["dropout"]}
        return meta, n_tokens, model_args, checkpoint
    except (DataError, CheckpointError) as e:
        if isinstance(e, CheckpointError):
            check_out_dir_free(out_dir)  # a live run mid-save, or before its first checkpoint, is the real cause
        error = type(e)(f"{e}{resume_hint(out_dir, c)}")
        if not ddp:
            raise error from None
        # every rank joins the process group (those that found their files wait there) to stop with one error line
        distributed.init_process_group(backend(c, device), device)
        try:
            distributed.stop_if_any_rank_failed(error)  # raises, on every rank
        finally:
            dist.destroy_process_group()  # before the interpreter's shutdown, where gloo's threads would abort it


def choose_device(c, ddp, local_rank):
    """(device, dtype) of this process (resolve_config has checked both): under torchrun each process
    takes its local rank's GPU."""
    device = resolve_device(c["device"])
    if ddp and device.startswith("cuda"):
        if device != "cuda":  # on every rank alike
            distributed.refuse(str, f"device={device!r} names one GPU, but under torchrun each process takes the GPU "
                               f"of its LOCAL_RANK: set device='cuda' (or 'auto'), and CUDA_VISIBLE_DEVICES to choose "
                               f"GPUs", error=ConfigError)
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK={local_rank}, but torch sees {torch.cuda.device_count()} GPU(s) on this "
                              f"node: start at most that many processes per node (--nproc_per_node)")
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    return device, resolve_dtype(c["dtype"], device)


def backend(c, device):
    return c["backend"] if c["backend"] != "auto" else ("nccl" if device.startswith("cuda") else "gloo")


def has_finished(checkpoint, out_dir, c):
    """Whether the run that wrote the checkpoint has trained to max_iters and evaluated there (a signal in
    its last iteration leaves that evaluation owed). With always_save_checkpoint=False its checkpoint
    may be an earlier, better iteration: then its own summary.json says that it reached the end."""
    if checkpoint["iter_num"] >= c["max_iters"]:
        return checkpoint.get("evaluated", True)
    summary = read_summary(out_dir)
    return (summary is not None and summary.get("run_id") == checkpoint.get("run_id") is not None
            and summary["stop_reason"] == "max_iters" and summary["iterations"] >= c["max_iters"])


def nothing_to_train(out_dir, iter_num, c, say):
    """A resume of a finished run: say so, change nothing, and return the run's summary."""
    if say:
        print(f"nothing to train: the run in {out_dir} has reached max_iters={c['max_iters']} (its checkpoint is "
              f"at iteration {iter_num}); raise max_iters (and lr_decay_iters with it) to train on", flush=True)
    return read_summary(out_dir) or {"iterations": iter_num}


def announce(run, n_tokens):
    run.say("config:")
    for key in sorted(run.c):
        run.say(f"  {key} = {run.c[key]!r}")
    run.say(f"device {run.device}, dtype {run.dtype}, {run.world_size} process(es), {run.accum} micro-step(s) per "
            f"process, {run.tokens_per_iter:,} tokens per iteration; data {run.data_dir}: {n_tokens['train']:,} "
            f"train / {n_tokens['val']:,} val tokens ({run.meta['tokenizer']}, vocab {run.meta['vocab_size']})")
    for note in config_notes(run):
        run.say(f"note: {note}")
    if run.master:
        for stale in run.out_dir.glob(CHECKPOINT_NAME + ".*.tmp"):  # left by a crash while saving
            stale.unlink(missing_ok=True)
    run.keeps_earlier_run = finds_earlier_run(run)
    if run.keeps_earlier_run and not run.c["save_checkpoints"]:  # a resume that saves nothing is refused earlier
        distributed.refuse(str, f"{run.out_dir / CHECKPOINT_NAME} is an earlier run's, and with save_checkpoints=False "
                           f"this run would write its log and summary beside it and no checkpoint of its own: give "
                           f"an --out_dir without one", error=ConfigError)
    if run.keeps_earlier_run and run.c["init_from"] == "resume":
        run.say(f"note: {run.out_dir / CHECKPOINT_NAME} is another run's than the shards this run continues (a stop "
                f"cut their first save short); this run replaces it, its log and its summary at its first save")
    elif run.keeps_earlier_run:
        run.say(f"note: {run.out_dir / CHECKPOINT_NAME} is an earlier run's; this run replaces it, its log and its "
                f"summary at its first save, and a stop before then leaves them as they are (to continue that run "
                f"instead: --init_from=resume)")


def config_notes(run):
    """What the config asks for that is valid but seldom meant."""
    c, notes = run.c, []
    if c["eval_only"] and c["init_from"] == "scratch":
        notes.append("eval_only with init_from='scratch' evaluates a new, untrained model" +
                     (f"; --init_from=resume evaluates {run.out_dir / CHECKPOINT_NAME}"
                      if (run.out_dir / CHECKPOINT_NAME).exists() else ""))
    elif not c["eval_only"] and c["decay_lr"] and 0 < c["max_iters"] < c["lr_decay_iters"]:  # 0: no step, no rate
        fix = "lr_decay_iters=max_iters" + (", and warmup_iters below it," if c["warmup_iters"] >= c["max_iters"] else "")
        notes.append(f"the run stops at max_iters={c['max_iters']}, before its learning-rate schedule ends "
                     f"(warmup_iters={c['warmup_iters']}, lr_decay_iters={c['lr_decay_iters']}): its last step's rate "
                     f"is {get_lr(c['max_iters'] - 1, c):.2e} (set {fix} to decay within the run)")
    if c["hellaswag_file"] and not c["hellaswag_interval"] and not c["eval_only"]:
        notes.append(f"hellaswag_file={c['hellaswag_file']!r} is not scored, as hellaswag_interval=0 (off); set "
                     f"--hellaswag_interval=N to score it every N iterations")
    if c["hellaswag_limit"] and not c["hellaswag_file"]:
        notes.append(f"hellaswag_limit={c['hellaswag_limit']} is unused: no hellaswag_file is scored")
    if c["mlp"] == "swiglu" and c["gelu_approximate"] != DEFAULT_CONFIG["gelu_approximate"]:
        notes.append(f"gelu_approximate={c['gelu_approximate']!r} is unused: mlp='swiglu' has no GELU")
    if run.device == "cpu" and run.dtype == "float16":
        notes.append("float16 on the CPU is emulated, many times slower than float32 or bfloat16")
    return notes


def finds_earlier_run(run):
    """Whether ckpt.pt in out_dir, with the log and summary beside it, is another run's, as rank 0 sees
    it (the rank that writes there), on every rank alike: for a new run (not a resume), any ckpt.pt; for
    an FSDP resume, one of another run than the shards it continues, which a stop between a new run's
    first shards and its ckpt.pt leaves (checkpoints from before run ids count as the same run)."""
    found = None
    if run.master and not run.c["eval_only"]:
        path = run.out_dir / CHECKPOINT_NAME
        if run.c["init_from"] != "resume":
            found = path.exists()
        elif run.fsdp:
            try:
                found = load_checkpoint(path, mmap=True).get("run_id") not in (None, run.run_id)
            except CheckpointError:
                found = False
    return distributed.first_on_any_rank(found) if run.ddp else found


def build_run(run, checkpoint):
    """Model, optimizer, batches, RNG state (from the checkpoint when resuming), logs."""
    c = run.c
    build_model(run, checkpoint)
    build_optimizer(run, checkpoint)
    run.train_batches = Batches(run.data_dir / "train.bin", c["block_size"], c["batch_size"], run.device)
    run.val_batches = Batches(run.data_dir / "val.bin", c["block_size"], c["batch_size"], run.device)
    run.generator = torch.Generator().manual_seed(c["seed"])
    if checkpoint is not None:
        restore(run, checkpoint)
    run.start_iter = run.iter_num
    # On CPU, small evaluation batches waste time in small matmuls: evaluate up to ~16K tokens per
    # forward pass instead (the same sequences, so the same mean loss up to float rounding). On GPU,
    # and with compile (fixed shapes), one batch per forward pass as in training.
    if run.device == "cpu" and not c["compile"]:
        run.eval_group = max(1, 16384 // (c["batch_size"] * c["block_size"]))
    open_logs(run)


def build_model(run, checkpoint):
    """The same initialisation on every rank, then per-rank dropout streams."""
    c = run.c
    torch.manual_seed(c["seed"])
    if c["init_from"] in PRETRAINED_GPT2:
        model = GPT.from_pretrained(c["init_from"], dict(dropout=c["dropout"], attention=c["attention"]))
        if c["block_size"] < model.config.block_size:
            model.crop_block_size(c["block_size"])
        run.model_args = {k: getattr(model.config, k) for k in MODEL_ARG_KEYS}
    else:
        model = GPT(GPTConfig(**run.model_args))
    if checkpoint is not None and not run.fsdp:  # FSDP loads its shards with the optimizer
        load_weights(model, checkpoint["model"], checkpoint["source"])
    run.raw_model = model.to(run.device)  # under FSDP, sharded in place
    tied = " (the tied head counted once)" if model.config.tie_embeddings else ""
    run.say(f"model: {model.config.attention} attention, {model.get_num_params(non_embedding=False):,} parameters"
            f"{tied}, {model.flops_per_token():,} training FLOPs per token")  # as summary.json counts them
    torch.manual_seed(c["seed"] + run.rank)
    # compile, then DDP or FSDP; evaluation runs without DDP's hooks
    run.model, run.eval_model = distributed.wrap_model(model, c, run.ddp, run.device, run.dtype, run.say)


def build_optimizer(run, checkpoint):
    c = run.c
    run.autocast = autocast_context(run.device, run.dtype)
    run.peak = peak_flops(c["peak_flops"], run.device)  # None: no MFU (CPU, or a GPU without a known peak)
    if run.peak is None and run.device.startswith("cuda"):
        run.say(f"note: no MFU: {torch.cuda.get_device_name(run.device)} is not in runtime.PEAK_BF16_FLOPS; "
                f"set peak_flops")
    run.scaler = torch.amp.GradScaler(torch.device(run.device).type, enabled=(run.dtype == "float16"))
    run.optimizer = run.raw_model.configure_optimizers(c["weight_decay"], c["learning_rate"],
                                                       (c["beta1"], c["beta2"]), torch.device(run.device).type)
    if checkpoint is None:
        return
    if run.fsdp:  # the model and optimizer shards, into the sharded model
        distributed.load_sharded(run.raw_model, run.optimizer, checkpoint["sharded_dir"])
    else:
        load_optimizer_state(run, checkpoint)
    bad = first_non_finite_on_any_rank(run, {"model": run.raw_model.state_dict(), "optimizer": run.optimizer.state_dict()})
    if bad is not None:
        raise CheckpointError(f"cannot resume from {checkpoint['source']}: its {bad} holds NaN or inf values, which "
                              f"train.py never saves, so the file is damaged: resume from a copy of it, or start again")
    # the moments are the checkpoint's, the hyperparameters the config's: a resume may change betas and
    # weight decay as it may the learning rate (set at every step). Group 0 is the decayed one.
    for group in run.optimizer.param_groups:
        group["betas"] = (c["beta1"], c["beta2"])
    run.optimizer.param_groups[0]["weight_decay"] = c["weight_decay"]


def load_optimizer_state(run, checkpoint):
    try:
        run.optimizer.load_state_dict(checkpoint["optimizer"])
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise CheckpointError(f"the optimizer state in {checkpoint['source']} does not fit the model "
                              f"({type(e).__name__}: {e}): it was not written by this train.py") from None
    if "scaler" in checkpoint and run.scaler.is_enabled():
        run.scaler.load_state_dict(checkpoint["scaler"])


def restore(run, checkpoint):
    run.iter_num, run.best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    run.run_id = checkpoint.get("run_id", run.run_id)
    # checkpoints from before the flag were taken as evaluated, as they were then
    run.evaluated_at_start = checkpoint.get("evaluated", True)
    run.earlier_processes = checkpoint.get("totals", run.earlier_processes)  # older checkpoints: none counted
    rng, rank = checkpoint["rng"], run.rank
    run.generator.set_state(rng["batches"])
    # dropout: a rank the checkpoint has no state for (it was saved by fewer processes) keeps the
    # stream build_model seeded it with, so that no two ranks draw the same masks
    if rank < len(rng["torch"]):
        torch.set_rng_state(rng["torch"][rank])
    if run.device.startswith("cuda") and rank < len(rng.get("cuda") or ()):
        torch.cuda.set_rng_state(rng["cuda"][rank], run.device)
    best = "none saved yet" if run.best_val_loss >= 1e9 else f"{run.best_val_loss:.4f}"
    run.say(f"resuming from {checkpoint['source']} at iteration {run.iter_num} (best val loss {best})")
    changed = [f"{key} {was!r} -> {run.c[key]!r}" for key, was in (checkpoint.get("config") or {}).items()
               if key in run.c and key not in ("init_from", "eval_only") and was != run.c[key]]
    if changed:  # a forgotten override resumes with another learning rate or batch, say: visible, not refused
        run.say(f"note: changed since the checkpoint: {', '.join(changed)}")


def open_logs(run):
    """log.jsonl and wandb on rank 0, and the HellaSwag examples if asked for."""
    c = run.c
    resuming = c["init_from"] == "resume"
    wandb_run = None
    if c["wandb_log"] and run.master:
        import wandb

        # the id is the run's own, kept across resumes, so that a resume goes on in the same wandb run (an
        # evaluation alone gets a wandb run of its own, as it leaves the training run's records be)
        wandb_run = wandb.init(project=c["wandb_project"], name=c["wandb_run_name"], config=dict(c),
                               id=None if c["eval_only"] else run.run_id, resume=None if c["eval_only"] else "allow")
    if resuming and run.master and not c["eval_only"] and not run.keeps_earlier_run:
        dropped = trim_log(run.out_dir / "log.jsonl", run.start_iter)
        if dropped:
            run.say(f"dropped {dropped} record(s) past iteration {run.start_iter} from log.jsonl: steps after the "
                    f"checkpoint, which this run does again")
    # eval_only leaves the out_dir's log and summary as the training run wrote them
    run.log = RunLog(run.out_dir, append=resuming, enabled=run.master and not c["eval_only"], wandb_run=wandb_run,
                     held=run.keeps_earlier_run)
    if c["hellaswag_interval"]:
        run.hellaswag = hellaswag_examples(run)


def hellaswag_examples(run):
    """(examples, tokenizer) for HellaSwag during training, on every rank, each of which scores its share
    (FSDP is refused in resolve_config); or None on every rank, saying why, where any rank cannot have
    them (on several nodes, a file on one node only): training goes on without the scores."""
    problems = []
    try:
        import eval_hellaswag
    except ImportError as e:
        problems.append(f"warning: HellaSwag evaluation is off: {e}")
    else:
        loaded = eval_hellaswag.examples_for_training(run.c["hellaswag_file"], run.c["hellaswag_limit"], run.meta,
                                                      problems.append)
    if run.ddp:  # a collective: every rank decides alike, so none waits in another's evaluation
        gathered = [None] * run.world_size
        dist.all_gather_object(gathered, problems[:1])
        problems = [f"{problem} (rank {rank})" for rank, mine in enumerate(gathered) for problem in mine]
    if problems:
        run.say(problems[0])
        return None
    return loaded


# -----------------------------------------------------------------------------
# the loop

def train_loop(run, signals, threads):
    """Evaluate (and checkpoint) every eval_interval iterations and at the end; step; log; stop at
    max_iters, or on a signal after saving. Returns the summary."""
    c = run.c
    run.model.train()
    try:
        if c["eval_only"]:
            evaluate(run)
            run.stop_reason = "eval_only"
        unread = []  # (iteration, loss on the device) of the steps whose loss is not read back yet
        while not c["eval_only"]:
            # a resume does not repeat the evaluation its checkpoint was written after; a signal's
            # checkpoint comes before its iteration's evaluation, so that one still runs
            resumed_here = run.iter_num == run.start_iter and run.evaluated_at_start
            evaluates = (run.iter_num % c["eval_interval"] == 0 or run.iter_num >= c["max_iters"]) and not resumed_here
            scores = run.hellaswag and run.iter_num % c["hellaswag_interval"] == 0 and run.iter_num > 0 and not resumed_here
            if evaluates or scores:
                read_losses(run, unread)  # no evaluation or save after a non-finite training loss
            if evaluates:
                evaluate(run)
            if scores:
                run_hellaswag(run)
            if run.iter_num >= c["max_iters"]:
                break
            t0 = time.time()
            lr = get_lr(run.iter_num, c)
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            loss, stop = forward_backward(run, signals)
            unread.append((run.iter_num, loss))
            logs = (run.iter_num + 1) % c["log_interval"] == 0 or run.iter_num + 1 == c["max_iters"]
            # On a GPU a read waits for every kernel queued before it, so that the CPU could not queue the next
            # step while the GPU runs this one: the losses are read at log steps (before their step is taken,
            # as ever), on a signal, before an evaluation, at every step under DDP, which reads its stop flag
            # there anyway, and when enough are unread. A non-finite loss between reads stops the run at the
            # next, naming its iteration.
            if logs or stop or run.ddp or len(unread) >= MAX_UNREAD_LOSSES:
                loss = read_losses(run, unread)
            if c["grad_clip"]:
                run.scaler.unscale_(run.optimizer)
                torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), c["grad_clip"])
            run.scaler.step(run.optimizer)
            run.scaler.update()
            run.optimizer.zero_grad(set_to_none=True)
            run.iter_num += 1
            run.step_times.append(time.time() - t0)
            if logs:
                log_step(run, loss, lr)
            if stop:
                stop_on_signal(run, signals)
                break
            threads.adjust()
    except NonFiniteLossError:
        record_divergence(run)
        raise
    finally:
        run.log.close()
    return write_summary(run)  # runlog.py


def stop_on_signal(run, signals):
    """Save a checkpoint to resume from, unless that would replace an earlier run's before this run has
    saved once: a Ctrl-C meant to stop a command that forgot --init_from=resume must not cost that run."""
    run.stop_reason = signals.received or ("closed stdout" if run.stdout_closed else "signal on another rank")
    if not run.c["save_checkpoints"]:
        run.say(f"received {run.stop_reason}: stopping at iteration {run.iter_num} (save_checkpoints=False: no "
                f"checkpoint)")
        return
    if run.keeps_earlier_run:
        run.say(f"received {run.stop_reason}: stopping at iteration {run.iter_num} without a checkpoint, as this run "
                f"has not saved yet and {run.out_dir / CHECKPOINT_NAME} is an earlier run's, kept as it was")
        return
    run.say(f"received {run.stop_reason}: saving a checkpoint at iteration {run.iter_num} and stopping")
    save(run, run.stop_reason, evaluated=False)  # the next iteration's evaluation is to come


def read_losses(run, unread):
    """Read the losses of the steps in `unread` (iteration, loss) back to the host, all at once, and empty
    it; returns the last one (None if none), or stops at the first that is not finite, as of its iteration:
    the steps after it, on its non-finite gradients, are not counted, and nothing is saved after them."""
    if not unread:
        return None
    iterations, losses = zip(*unread)
    unread.clear()
    if torch.is_tensor(losses[0]):  # on the device (one process): one read for them all; under DDP, floats
        losses = torch.stack(losses).tolist()
    for it, loss in zip(iterations, losses):
        if not math.isfinite(loss):
            run.iter_num = it
            del run.step_times[it - run.start_iter:]  # iterations_this_run counts them
            raise diverged(run, f"the training loss became {loss}")
    return losses[-1]


def forward_backward(run, signals):
    """This rank's micro-batches of one iteration, gradients accumulated; returns (the mean loss over all
    ranks, whether any rank was signalled to stop). The loss stays on the device in one process; under DDP
    the stop flag is agreed on by a collective and read back, the mean loss with it, as a float."""
    accum = run.accum
    offsets = run.train_batches.offsets(run.c["gradient_accumulation_steps"], run.generator)
    offsets = offsets[run.rank * accum:(run.rank + 1) * accum]  # this rank's share
    loss_sum = torch.zeros((), dtype=torch.float32, device=run.device)
    for micro in range(accum):
        x, y = run.train_batches.get(offsets[micro])
        # under DDP or FSDP, synchronise gradients only on the last micro-step
        with distributed.gradient_sync(run.model, micro == accum - 1):
            with run.autocast:
                _, loss = run.model(x, y)
            loss_sum += loss.detach().float()
            run.scaler.scale(loss / accum).backward()
    stop = signals.received is not None or run.stdout_closed
    if not run.ddp:
        return loss_sum / accum, stop
    # one small collective per step: the mean loss over all ranks, and whether any rank was signalled. Its
    # read is the one host read of every step under DDP: all ranks stop after the same step, the one a signal
    # came in (full_like fills on the device, where torch.tensor would copy from the host and wait too)
    flags = torch.stack([loss_sum / accum, torch.full_like(loss_sum, float(stop))])
    dist.all_reduce(flags)
    flags[0] /= run.world_size
    loss, stop = flags.tolist()
    return loss, bool(stop)


@torch.no_grad()  # not inference_mode: FSDP2 reuses the buffers it gathers parameters into, and
def estimate_loss(run):  # inference tensors cannot be written outside inference mode
    """Mean loss over eval_iters batches per split. The batches are the same at every evaluation
    (their own generator, seeded fresh), so successive estimates are comparable and evaluation
    never disturbs the training RNG. Under DDP the batches are shared out between the ranks."""
    out = {}
    run.model.eval()
    for split, batches in (("train", run.train_batches), ("val", run.val_batches)):
        g = torch.Generator().manual_seed(run.c["seed"] + 1)
        ix = batches.offsets(run.c["eval_iters"], g)[run.rank::run.world_size]  # this rank's share
        no_float64 = torch.device(run.device).type == "mps"
        total = torch.zeros(2, dtype=torch.float32 if no_float64 else torch.float64, device=run.device)
        for k in range(0, len(ix), run.eval_group):
            group = ix[k:k + run.eval_group]
            x, y = batches.get(group.reshape(-1))
            with run.autocast:
                _, loss = run.eval_model(x, y)
            total[0] += loss.double() * len(group)  # a mean over len(group) equal batches
            total[1] += len(group)
        if run.ddp:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    run.model.train()
    return out


def evaluate(run):
    """Estimate the losses, log them, and save a checkpoint (always, or when val loss improved)."""
    losses = estimate_loss(run)
    if not all(map(math.isfinite, losses.values())):
        raise diverged(run, f"the evaluated losses became train {losses['train']}, val {losses['val']}")
    run.last_losses.update(losses)
    run.last_eval_iter = run.iter_num
    run.say(f"step {run.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    run.log.write({"type": "eval", "iter": run.iter_num, "train_loss": losses["train"], "val_loss": losses["val"],
                   "elapsed_s": run.wall_time()})
    improved = losses["val"] < run.best_val_loss
    # a resume from a signal's checkpoint, written before this evaluation, saves it again as evaluated,
    # so that the next resume neither skips nor repeats the evaluation
    owed = run.iter_num == run.start_iter > 0 and not run.evaluated_at_start and not run.c["eval_only"]
    # best_val_loss is that of a checkpoint: the evaluation of a fresh run's initial (or pretrained) weights,
    # which is not saved, sets none, or with always_save_checkpoint=False nothing worse would be saved after it
    saves = owed or (run.iter_num > run.start_iter and (improved or run.c["always_save_checkpoint"]))
    if saves and run.c["save_checkpoints"]:
        run.best_val_loss = min(run.best_val_loss, losses["val"])
        save(run, "evaluation", evaluated=True)


def first_non_finite_on_any_rank(run, state):
    """checkpoint.first_non_finite of a model and optimizer state, the same on every rank: under FSDP
    each rank sees its own shards only, so the ranks agree through a collective, and all stop together."""
    bad = first_non_finite(state)
    return distributed.first_on_any_rank(bad) if run.fsdp else bad


def diverged(run, what):
    """The error for a run whose loss or weights are no longer finite: nothing more is saved."""
    path = run.out_dir / CHECKPOINT_NAME
    kept = (f"no checkpoint was written to {run.out_dir}" if not path.exists() else
            f"{path}, an earlier run's, is kept as it was" if run.keeps_earlier_run else
            f"the last good checkpoint {path} is kept as it was")
    return NonFiniteLossError(f"{what} at iteration {run.iter_num}; stopping, and {kept}. Lower learning_rate, "
                              f"raise warmup_iters or lower grad_clip, then resume or restart")


def record_divergence(run):
    """summary.json says that the run diverged, with no final losses (a learning-rate sweep reads this as
    a result, not a failure); the checkpoint stays the last good one."""
    run.stop_reason = "diverged"
    run.last_losses.update(train=None, val=None)
    write_summary(run)


def save(run, reason, evaluated):
    """Write the checkpoint (rank 0). `evaluated`: whether the evaluation of this iteration is done,
    so that a resume from it neither skips nor repeats that evaluation."""
    state = {"model": run.raw_model.state_dict(),  # the uncompiled module: no "_orig_mod." prefix
             "optimizer": run.optimizer.state_dict()}
    bad = first_non_finite_on_any_rank(run, state)
    if bad is not None:
        raise diverged(run, f"{bad} holds NaN or inf values (not saving the {reason} checkpoint)")
    rng = distributed.gather_rng_state(run.generator, run.device, run.ddp)  # a collective under DDP
    if run.fsdp:  # collectives: every rank writes its shards, then the whole model is gathered on rank 0
        distributed.write_shards(run.raw_model, run.optimizer, run.out_dir)
        state = {"model": distributed.full_model_state(run.raw_model), "sharded": distributed.SHARDED_NAME}
    replaces_earlier_run, run.keeps_earlier_run = run.keeps_earlier_run, False  # on every rank: out_dir is this run's
    if not run.master:
        return
    ckpt = {"model_args": run.model_args, **state, "iter_num": run.iter_num, "evaluated": evaluated,
            "run_id": run.run_id, "best_val_loss": run.best_val_loss, "config": dict(run.c), "rng": rng, "meta": run.meta,
            "totals": run_totals(run)}
    if run.scaler.is_enabled():
        ckpt["scaler"] = run.scaler.state_dict()
    t = time.time()
    try:
        if run.fsdp:  # the shards become the resume point, with the training state beside them; ckpt.pt follows
            distributed.commit_shards(run.out_dir, {k: v for k, v in ckpt.items() if k != "model"})
        save_checkpoint(ckpt, run.out_dir / CHECKPOINT_NAME)
    except OSError as e:  # a full disk, a folder gone or made read-only: the writes above leave the last one whole
        raise CheckpointError(unsaved(run, reason, e, replaces_earlier_run)) from e
    if not run.fsdp and distributed.remove_shards(run.out_dir):
        run.say(f"removed {run.out_dir / distributed.SHARDED_NAME}, an earlier FSDP run's checkpoint, which this "
                f"one replaces")
    run.log.write_held_records()  # the earlier run's log, if any, is replaced with its checkpoint
    run.say(f"saved checkpoint to {run.out_dir / CHECKPOINT_NAME} at iteration {run.iter_num} "
            f"({reason}, {time.time() - t:.2f}s)")


def unsaved(run, reason, error, replaces_earlier_run):
    """The error of a save the disk refused: what out_dir still holds, and how to go on."""
    path = run.out_dir / CHECKPOINT_NAME
    if not path.exists():
        kept, then = "this run has no checkpoint yet", "start the run again"
    elif replaces_earlier_run:
        kept, then = f"{path} is still the earlier run's, as it was", "start the run again"
    else:
        kept, then = f"{path}, this run's last checkpoint, is as it was", "continue from it with --init_from=resume"
    return (f"could not save the {reason} checkpoint at iteration {run.iter_num}: {error}; {kept}. Make room (or fix "
            f"the folder), then {then}")


def run_hellaswag(run):
    import eval_hellaswag

    examples, tok = run.hellaswag
    run.raw_model.eval()
    try:
        with run.autocast:
            result = eval_hellaswag.evaluate(run.raw_model, examples, tok, run.device, run.c["hellaswag_batch_size"],
                                             rank=run.rank, world_size=run.world_size)
    finally:
        run.raw_model.train()
    run.log.write({"type": "hellaswag", "iter": run.iter_num, **result, "elapsed_s": run.wall_time()})
    run.say(f"iter {run.iter_num}: hellaswag {eval_hellaswag.accuracies_line(result)}")


def log_step(run, loss, lr):
    # the mean step time since the last train record: a step that reads nothing back is timed as the CPU
    # queues it on a GPU, and the log step, which reads the loss, waits for the ones before it as well
    # (not the run's first step, which compiles, unless it is the only one, as in summary.json's mean)
    timed = run.step_times[max(run.logged_steps, 1):] or run.step_times[-1:]
    run.logged_steps = len(run.step_times)
    dt = sum(timed) / len(timed)
    mfu = None if run.peak is None else run.raw_model.estimate_mfu(run.c["batch_size"] * run.accum, dt, run.peak)
    tokens_per_s = run.tokens_per_iter / dt
    run.say(f"iter {run.iter_num}: loss {loss:.4f}, lr {lr:.2e}, {dt * 1000:.2f} ms/iter, "
            f"{tokens_per_s:,.0f} tokens/s" + ("" if mfu is None else f", mfu {mfu * 100:.2f}%"))
    run.log.write({"type": "train", "iter": run.iter_num, "loss": loss, "lr": lr, "ms_per_iter": dt * 1000,
                   "tokens_per_s": tokens_per_s, "mfu": mfu, "elapsed_s": run.wall_time()})


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(f"{__doc__.strip()}\n\nconfig keys, their defaults and meanings (choices in brackets):\n{help_text()}")
        return 0
    set_by = {}
    try:
        launcher = split_launcher_args(argv, DEFAULT_CONFIG)
        if launcher:  # the config checked here first: a bad key is one error line, not one per process
            c = resolve_config(get_config(launcher[1], set_by=set_by))
            world_size = planned_world_size(launcher[0])
            problem = world_size and world_size_problem(c, world_size)
            if problem:
                raise ConfigError(problem)
            return launch(launcher[0], Path(__file__).resolve(), launcher[1])
        train(get_config(argv, set_by=set_by))
    except ConfigError as e:
        print(f"error: {naming_config_files(e, set_by)}", file=sys.stderr, flush=True)
        return 1
    except (DataError, CheckpointError, PretrainedUnavailableError, NonFiniteLossError, LaunchError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    except BrokenPipeError:  # a closed stdout: run_script's quiet exit (141), as for the other scripts
        raise
    except OSError as e:  # the log or summary on a disk that filled up, say: a checkpoint is written whole or not at all
        print(f"error: {e}; the last checkpoint saved in out_dir, if any, is whole", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:  # before the run's own signal handling starts, or a second Ctrl-C during it
        if is_rank_zero():
            print("error: stopped by Ctrl-C; the last checkpoint saved in out_dir, if any, is whole", file=sys.stderr,
                  flush=True)
        return 130
    return 0


if __name__ == "__main__":  # `train.py --help | head`: a closed stdout ends it quietly
    run_script(main, "error: stopped by Ctrl-C")
