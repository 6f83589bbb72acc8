"""The one atomic file writer: a reader sees the old file or the new one, never a mix.

`write_atomic` writes a temporary file beside the target (mode 0600, never following a
symlink), fsyncs it, renames it over the target and fsyncs the directory, so the new
contents survive a crash once it returns. A writer that dies before its rename leaves a
`.NAME.*.tmp` file behind; `remove_leftovers` deletes those.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, make_parents: bool = False) -> None:
    """Replace `path` with `data` atomically and durably, mode 0600; raises OSError.

    With `make_parents` a missing directory is created (mode 0700) first.
    """
    directory = path.parent
    if make_parents:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=directory)
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise
    _fsync_dir(directory)


def remove_leftovers(path: Path) -> None:
    """Delete the temporary files of writers of `path` that died before their rename."""
    prefix = _temp_prefix(path)
    with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
        for entry in entries:
            if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
