"""Putting a finished export folder in place so that a crash at any moment leaves a usable one.

An export is built in a hidden staging folder beside its target (``.NAME.tmp-XXXX``, on the
same file system). Publishing it is one step:

* a new target: ``rename(staged, target)``, atomic;
* ``--overwrite`` of an existing export: ``renameat2(RENAME_EXCHANGE)`` swaps the two folders
  atomically (Linux ≥ 3.15 on the usual file systems), so the target is the old export or the
  new one at every instant, never missing. Where the swap is not available, the old export is
  first renamed into the staging folder (``previous``) and the new one renamed into place; a
  crash between the two renames leaves no target, and :func:`recover` (run by the next
  export to that target) moves ``previous`` back.

Staging folders of exports that died (their owner process is gone) are removed by
:func:`recover`, so a SIGKILL costs disk space only until the next export to the same target.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from magretrieve.stores.base import fsync_dir

OWNER_FILE = "owner.pid"
PREVIOUS = "previous"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def staging_prefix(target: Path) -> str:
    return f".{target.name}.tmp-"


def make_staging(target: Path) -> Path:
    """A fresh hidden staging folder beside ``target``, marked with this process id."""
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix(target), dir=target.parent))
    (staging / OWNER_FILE).write_text(str(os.getpid()))
    return staging


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(staging: Path) -> int | None:
    try:
        return int((staging / OWNER_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def publish(final_dir: Path, target: Path, staging: Path) -> None:
    """Move the finished ``final_dir`` to ``target`` (replacing an existing export)."""
    if target.exists():
        if not exchange(final_dir, target):
            previous = staging / PREVIOUS
            target.rename(previous)
            try:
                final_dir.rename(target)
            except OSError:
                previous.rename(target)  # put the old export back
                raise
    else:
        final_dir.rename(target)
    fsync_dir(target.parent)


def interrupted_previous(target: Path) -> Path | None:
    """The old export an interrupted ``--overwrite`` left in a staging folder, if any."""
    if target.exists() or not target.parent.is_dir():
        return None
    for staging in sorted(target.parent.glob(staging_prefix(target) + "*")):
        previous = staging / PREVIOUS
        if (previous / "magretrieve.json").is_file():
            return previous
    return None


def recover(target: Path, say: Callable[[str], None]) -> None:
    """Undo what a killed export to ``target`` left: restore its old export, drop its staging."""
    if not target.parent.is_dir():
        return
    for staging in sorted(target.parent.glob(staging_prefix(target) + "*")):
        pid = _owner(staging)
        if pid is not None and _alive(pid):
            continue  # another export to this target is running
        previous = staging / PREVIOUS
        if not target.exists() and (previous / "magretrieve.json").is_file():
            previous.rename(target)
            fsync_dir(target.parent)
            say(f"restored the previous export at {target} (an earlier export was interrupted)")
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
