"""Small filesystem helpers shared by the tuner and by fetch (stdlib only)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write_bytes(
    path: str | Path, data: bytes, mode: int = 0o644, *, fsync: bool = True
) -> None:
    """Write via a temp file in the same directory and rename: readers see all or nothing.

    fsync=False for files rewritten often whose loss in a machine crash does not matter (they
    live in the pod's emptyDir, gone with the pod anyway): the rename alone keeps them whole.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_termination_log(path: str | None, message: str) -> None:
    """Best effort: Kubernetes shows this file's text in the pod's status.

    The default /dev/termination-log is written only when it already exists (the kubelet
    creates it in a container), so running a CLI on a workstation never creates files in /dev.
    """
    if not path:
        return
    p = Path(path)
    if path == "/dev/termination-log" and not p.exists():
        return
    with contextlib.suppress(OSError):
        p.write_text(message if message.endswith("\n") else message + "\n", encoding="utf-8")
