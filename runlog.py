"""
What a training run writes beside its checkpoint, on rank 0: log.jsonl, one JSON object per
logged step, evaluation and HellaSwag score (and the same to wandb when asked), and summary.json.
A checkpoint carries the run's totals so far (run_totals), so that a resumed run goes on counting.
"""

import json
from pathlib import Path

import torch

from atomic import write_text_atomic
from checkpoint import LOG_NAME, SUMMARY_NAME
from runtime import peak_memory_bytes

NO_EARLIER_PROCESS = {"wall_time_s": 0.0, "timed_steps": 0, "timed_seconds": 0.0,
                      "peak_memory_bytes": None, "setups": []}


class RunLog:
    """log.jsonl (and optionally wandb) on rank 0; a no-op elsewhere."""

    def __init__(self, out_dir, append, enabled, wandb_run=None):
        self.file = open(Path(out_dir) / LOG_NAME, "a" if append else "w", encoding="utf-8",
                         buffering=1) if enabled else None
        self.wandb = wandb_run

    def write(self, record):
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            values = {k: v for k, v in record.items() if k not in ("type", "iter")}
            self.wandb.log({f"{record['type']}/{k}": v for k, v in values.items()},
                           step=record["iter"])

    def close(self):
        if self.file is not None:
            self.file.close()


def open_log(c, out_dir, run_id, start_iter, rank):
    """The run's log on rank 0 (none for eval_only): a resume appends to log.jsonl, once the records
    past its checkpoint are dropped (those steps come again), and goes on in the same wandb run."""
    enabled = rank == 0 and not c["eval_only"]
    wandb_run = None
    if c["wandb_log"] and rank == 0:
        import wandb

        own = not c["eval_only"]  # an evaluation alone is a wandb run of its own
        wandb_run = wandb.init(project=c["wandb_project"], name=c["wandb_run_name"], config=dict(c),
                               id=run_id if own else None, resume="allow" if own else None)
    resuming = c["init_from"] == "resume"
    if resuming and enabled:
        trim_log(Path(out_dir) / LOG_NAME, start_iter)
    return RunLog(out_dir, append=resuming, enabled=enabled, wandb_run=wandb_run)


def trim_log(path, last_iter):
    """Drop from log.jsonl what a stopped or killed run logged past the checkpoint resumed from."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["iter"] <= last_iter:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):  # a line torn by a kill
            pass
    write_text_atomic(path, "".join(kept))


def read_summary(out_dir):
    """out_dir's summary.json, or None."""
    try:
        return json.loads((Path(out_dir) / SUMMARY_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def setup_of(summary):
    """'2 x cuda, bfloat16': what a process trained on, as far as its speed and memory go."""
    return f"{summary['world_size']} x {summary['device'].split(':')[0]}, {summary['dtype']}"


def run_totals(run):
    """The run's wall time, timed steps, peak memory and set-ups over its processes so far: this
    one's, plus the earlier ones' up to the checkpoint resumed from (steps past it are redone)."""
    earlier = run.earlier_processes
    timed = run.step_times[1:]  # each process's first step pays for its warm-up or compile
    memory = [earlier["peak_memory_bytes"], peak_memory_bytes(run.device)]
    memory = [m for m in memory if m is not None]
    setup = setup_of({"world_size": run.world_size, "device": run.device, "dtype": run.dtype})
    setups = earlier.get("setups", [])
    return {"wall_time_s": earlier["wall_time_s"] + run.elapsed(),
            "timed_steps": earlier["timed_steps"] + len(timed),
            "timed_seconds": earlier["timed_seconds"] + sum(timed),
            "peak_memory_bytes": max(memory, default=None),
            "setups": setups + [setup] * (setup not in setups)}


def write_summary(run):
    totals = run_totals(run)
    steps, seconds = totals["timed_steps"], totals["timed_seconds"]
    if not steps:  # a run of one step: its warm-up is all there is
        steps, seconds = len(run.step_times), sum(run.step_times)
    mean_dt = seconds / steps if steps else None
    model = run.raw_model.eval()
    summary = {
        "run_id": run.run_id,
        "attention": run.model_args["attention"],
        "model_args": run.model_args,
        "n_params": model.get_num_params(non_embedding=False),
        "n_params_non_embedding": model.get_num_params(non_embedding=True),
        "attention_params": model.get_num_attention_params(),
        "flops_per_token": model.flops_per_token(),
        "final_train_loss": run.last_losses["train"],
        "final_val_loss": run.last_losses["val"],
        "final_losses_iter": run.last_eval_iter,
        "best_val_loss": run.best_val_loss if run.best_val_loss < 1e9 else None,
        "iterations": run.iter_num,
        "iterations_this_run": len(run.step_times),
        "stop_reason": run.stop_reason,
        "mean_ms_per_iter": mean_dt * 1000 if mean_dt else None,
        "tokens_per_s": run.tokens_per_iter / mean_dt if mean_dt else None,
        "tokens_per_iter": run.tokens_per_iter,
        "peak_memory_bytes": totals["peak_memory_bytes"],
        "wall_time_s": totals["wall_time_s"],
        "wall_time_this_run_s": totals["wall_time_s"] - run.earlier_processes["wall_time_s"],
        "device": run.device,
        "dtype": run.dtype,
        "world_size": run.world_size,
        "setups": totals["setups"],
        "compile": run.c["compile"],
        "num_threads": torch.get_num_threads(),
        "out_dir": str(run.out_dir),
        "dataset": str(run.data_dir),
    }
    if run.rank == 0 and run.stop_reason != "eval_only":  # an evaluation alone writes nothing
        write_text_atomic(run.out_dir / SUMMARY_NAME, json.dumps(summary, indent=2) + "\n")
    if run.log.wandb is not None:
        run.log.wandb.finish()
    return summary
