"""
Files that appear whole or not at all: written under a temporary name in the same folder, flushed
to disk, then renamed over the target (os.replace is atomic), so a crash or a kill mid-write leaves
the previous file as it was. Checkpoints, meta.json, summary.json and results files use it.
"""
import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_file(path, mode="w", encoding=None):
    """Open a temporary file beside `path` for writing; on a clean exit it replaces `path`, on an
    exception it is removed. Created with open(), so it gets the umask's permissions."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, encoding=encoding if "b" not in mode else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path, text):
    with atomic_file(path, "w", encoding="utf-8") as f:
        f.write(text)
