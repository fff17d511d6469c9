"""
Files that appear whole or not at all: written under a temporary name in the same folder, flushed
to disk, then renamed over the target (os.replace is atomic) and the folder flushed too, so a crash,
a kill or a power cut mid-write leaves the previous file as it was. Checkpoints, meta.json,
summary.json, results files, token files and downloads use it.
"""
import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside `path` for the caller to fill; on a clean exit it replaces
    `path`, on an exception (Ctrl-C included) it is removed. atomic_file opens it; a writer that
    needs a name, not a file object, fills it itself and flushes what it wrote before the end."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_folder(folder):
    """Flush a folder's entries to disk: only then is a rename durable through a power cut (an
    fsync of the file keeps only its contents). Best effort, POSIX only: where a folder cannot be
    opened or fsynced (some network and WSL mounts), the rename is done all the same."""
    if os.name != "posix":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path, mode="w", encoding=None):
    """Open a temporary file beside `path` for writing; on a clean exit it is flushed to disk and
    replaces `path`, on an exception it is removed. Made by open(), with the umask's permissions."""
    with atomic_path(path) as tmp, open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def write_text_atomic(path, text):
    with atomic_file(path, "w", encoding="utf-8") as f:
        f.write(text)
