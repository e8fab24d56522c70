"""The one way to write into the shared cache (and the one atomic file writer).

Runs share a cache root (a nightly beside a developer's run, pytest workers in parallel,
several builds in a row). Everything written there goes through this module:

- ``cached_variant(dest, make)`` for a directory keyed by its name (derived checkpoints,
  tiny and zoo models, stored references, checkpoints staged on a Ray node). It
  1. returns ``dest`` at once when it is complete (``dest`` only ever appears by an atomic
     rename of a finished directory, so by default existing means complete);
  2. otherwise takes an exclusive ``fcntl`` lock on ``.<name>.lock`` beside it: a second
     writer of the same key blocks there until the first is done, then finds ``dest`` and
     reuses it; writers of different keys never wait for each other;
  3. under the lock, removes what killed writers of this key left (the lock proves nobody
     alive owns it), calls ``make(staging)`` on a fresh staging directory of its own
     (``.<name>.staging-<random>``, same filesystem), fsyncs it, and renames it to ``dest``.
- ``key_lock(dest)`` alone, for what cannot be staged and renamed (a venv keeps its own
  path inside it: a build is installed in place under the lock and stamped last).
- ``write_atomic(path, data)`` for a single file (records, reports, stamps).

A writer killed at any point leaves at most a staging directory or temp file (never taken
for complete) and a lock the kernel has already released. Lock files stay: removing one
races its next user. Stdlib only: builds use it before anything else is installed.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

STAGING = ".staging-"
"""Infix of a staging directory's name: ``.<dest name>.staging-<random>``."""


def lock_path(dest: Path) -> Path:
    """The lock file of ``dest``'s key."""
    return dest.with_name(f".{dest.name}.lock")


@contextlib.contextmanager
def key_lock(dest: str | Path, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the exclusive lock of ``dest``'s key (across processes and within one). ``on_wait``
    hears when another holder makes this one wait (it blocks until the holder releases the
    lock or dies) and when the wait is over."""
    dest = Path(dest)
    path = lock_path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say = on_wait or (lambda message: None)
            say(f"waiting for another process writing {dest.name}")
            started = time.monotonic()
            fcntl.flock(fh, fcntl.LOCK_EX)
            say(f"{dest.name}: the other writer finished after {time.monotonic() - started:.1f} s")
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_variant(
    dest: str | Path,
    make: Callable[[Path], None],
    complete: Callable[[Path], bool] = Path.is_dir,
    on_wait: Callable[[str], None] | None = None,
) -> Path:
    """``dest``, made by ``make(staging)`` once across processes (see the module docstring).

    ``make`` writes the whole variant into ``staging``, an empty directory; if it raises, the
    staging directory is removed and nothing is published. ``complete(dest)`` says whether an
    existing ``dest`` can be used (default: it is a directory); one that cannot (damaged by
    hand, or left by an older harness) is replaced under the lock. ``on_wait`` hears when this
    call waits for another writer (default: one line on stderr).
    """
    dest = Path(dest)
    if complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with key_lock(dest, _say if on_wait is None else on_wait):
        if complete(dest):  # the writer we waited for made it
            return dest
        _remove_abandoned(dest)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}{STAGING}", dir=dest.parent))
        try:
            make(staging)
            _publish(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return dest


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write a file so that a reader (or a crash, or a full disk) sees it whole or not at all.

    The temp name is unique (the arm's watchdog thread and its main thread can both write the
    same record; two runs can write the same stamp), the bytes are fsynced before the rename,
    and the directory after it, so a power cut cannot leave a renamed but empty file. A failed
    write removes its temp file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; reports are shared like any other file
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync(path.parent)
    return path


def _remove_abandoned(dest: Path) -> None:
    """Staging directories of this key left by killed writers, and an unusable ``dest``:
    under the key's lock nobody alive is writing them, and nobody uses an incomplete entry."""
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.exists():  # moved aside first, so ``dest`` is never seen half-removed
        os.rename(dest, tempfile.mkdtemp(prefix=f".{dest.name}{STAGING}", dir=dest.parent))
    for leftover in dest.parent.glob(f".{glob.escape(dest.name)}{STAGING}*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _publish(staging: Path, dest: Path) -> None:
    """fsync every file and directory of ``staging`` (a power cut must not leave a renamed
    but empty file), make it readable like any other cache entry, and rename it to ``dest``."""
    for root, _, files in os.walk(staging):
        for name in files:
            _fsync(Path(root) / name)
        _fsync(Path(root))
    os.chmod(staging, 0o777 & ~_UMASK)  # mkdtemp makes 0700
    os.rename(staging, dest)  # atomic; dest is absent (made sure under the lock)
    _fsync(dest.parent)


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


_UMASK = _umask()


def _say(message: str) -> None:
    print(f"refit-harness: cache: {message}", file=sys.stderr, flush=True)
