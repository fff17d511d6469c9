"""
What a training run writes in its out_dir beside the checkpoint, on rank 0: log.jsonl, one JSON
object per logged step, evaluation and HellaSwag score (and the same to wandb when asked), and at
the end summary.json. On resume, trim_log drops what a stopped or killed run logged past the
checkpoint it resumes from.
"""

import json
from pathlib import Path

import torch

from atomic import write_text_atomic
from checkpoint import LOG_NAME, SUMMARY_NAME
from runtime import peak_memory_bytes


class RunLog:
    """log.jsonl (and optionally wandb) on rank 0; a no-op elsewhere. held: keep the records in memory
    until write_held_records (a new run leaves an earlier run's log.jsonl be until it first saves)."""

    def __init__(self, out_dir, append, enabled, wandb_run=None, held=False):
        self.path = Path(out_dir) / LOG_NAME
        self.file, self.held = None, None
        self.wandb = wandb_run
        if enabled and held:
            self.held = []
        elif enabled:
            self.file = open(self.path, "a" if append else "w", encoding="utf-8", buffering=1)

    def write(self, record):
        line = json.dumps(record) + "\n"
        if self.held is not None:
            self.held.append(line)
        elif self.file is not None:
            self.file.write(line)
        if self.wandb is not None:
            kind = record["type"]
            self.wandb.log({f"{kind}/{k}": v for k, v in record.items() if k not in ("type", "iter")},
                           step=record["iter"])

    def write_held_records(self):
        """Start log.jsonl anew with the records held so far, and write the next ones as they come."""
        if self.held is not None:
            self.file = open(self.path, "w", encoding="utf-8", buffering=1)
            self.file.writelines(self.held)
            self.held = None

    def close(self):
        if self.file is not None:
            self.file.close()


def trim_log(path, last_iter):
    """Drop from log.jsonl the records past `last_iter` (what a stopped or killed run logged after
    the checkpoint that is resumed from) and lines torn by a kill; return how many were dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            keep = json.loads(line)["iter"] <= last_iter
        except (ValueError, KeyError, TypeError):
            keep = False
        if keep:
            kept.append(line + "\n")
        else:
            dropped += 1
    if dropped:
        write_text_atomic(path, "".join(kept))
    return dropped


def read_summary(out_dir):
    """out_dir's summary.json, or None where there is none (or only a torn one)."""
    try:
        return json.loads((Path(out_dir) / SUMMARY_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


NO_EARLIER_PROCESS = {"wall_time_s": 0.0, "timed_steps": 0, "timed_seconds": 0.0, "peak_memory_bytes": None,
                      "setups": []}


def setup_of(summary):
    """'2 x cuda, bfloat16': what a process trained on, as far as its speed, time and memory go."""
    return f"{summary['world_size']} x {summary['device'].split(':')[0]}, {summary['dtype']}"


def run_totals(run):
    """The run's wall time, timed steps and peak memory over its processes so far: this one's, plus the
    earlier ones' up to the checkpoint it resumed from (a killed process's steps past that checkpoint
    are redone, so they are not the run's), and the set-ups they trained on (a resume may move to another
    machine, which mixes speeds). A checkpoint carries these, so that a resume goes on counting."""
    earlier = run.earlier_processes
    timed = run.step_times[1:]  # each process's first step pays for its warm-up / compile
    memory = [m for m in (earlier["peak_memory_bytes"], peak_memory_bytes(run.device)) if m is not None]
    setup = setup_of({"world_size": run.world_size, "device": run.device, "dtype": run.dtype})
    setups = earlier.get("setups", [])  # checkpoints from before it: none known
    return {"wall_time_s": run.wall_time(),
            "timed_steps": earlier["timed_steps"] + len(timed),
            "timed_seconds": earlier["timed_seconds"] + sum(timed),
            "peak_memory_bytes": max(memory, default=None),
            "setups": setups + [setup] * (setup not in setups)}


def last_evaluation(summary):
    final, at = summary["final_val_loss"], summary["final_losses_iter"]
    if final is None:
        return "no evaluation in this run"
    if at == summary["iterations"]:
        return f"final val loss {final:.4f}"  # as the evaluation's own line prints it
    return f"val loss {final:.4f} when last evaluated, at iteration {at}"  # stopped between evaluations


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
    # an evaluation alone leaves the run's summary be, as does a new run that has not replaced an earlier one
    if run.master and run.stop_reason != "eval_only" and not run.keeps_earlier_run:
        write_text_atomic(run.out_dir / SUMMARY_NAME, json.dumps(summary, indent=2) + "\n")
    if run.stop_reason != "diverged":  # a diverged run is not done: the error that follows says what happened
        steps = len(run.step_times)
        run.say(f"done: {steps} iteration{'' if steps == 1 else 's'} in {summary['wall_time_this_run_s']:.1f}s, "
                f"{last_evaluation(summary)}")
    if run.log.wandb is not None:
        run.log.wandb.finish()
    return summary
