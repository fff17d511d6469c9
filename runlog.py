"""
What a training run logs in its out_dir beside the checkpoint: log.jsonl, one JSON object per logged
step, evaluation and HellaSwag score (and the same to wandb when asked), written by rank 0. On
resume, trim_log drops what a stopped or killed run logged past the checkpoint it resumes from.
"""

import json
from pathlib import Path

from atomic import write_text_atomic
from checkpoint import LOG_NAME


class RunLog:
    """log.jsonl (and optionally wandb) on rank 0; a no-op elsewhere."""

    def __init__(self, out_dir, append, enabled, wandb_run=None):
        self.file = None
        self.wandb = wandb_run
        if enabled:
            self.file = open(Path(out_dir) / LOG_NAME, "a" if append else "w", encoding="utf-8", buffering=1)

    def write(self, record):
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            kind = record["type"]
            self.wandb.log({f"{kind}/{k}": v for k, v in record.items() if k not in ("type", "iter")},
                           step=record["iter"])

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
