"""The one atomic file writer: a reader sees the old file or the new one, never a mix.

`write_atomic` writes a temporary file beside the target (mode 0600, never following a
symlink), fsyncs it, renames it over the target and fsyncs the directory, so the new
contents survive a crash once it returns. A writer that dies before its rename leaves a
`.NAME.*.tmp` file behind; `remove_leftovers` deletes those.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_temp(path: Path) -> tuple[int, str]:
    """A new file `.NAME.RANDOM.tmp` beside `path`, mode 0600, opened for writing, as
    `tempfile.mkstemp` makes it (whose import costs an exec probe more than its write)."""
    while True:
        name = str(path.parent / f"{_temp_prefix(path)}{os.urandom(6).hex()}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(name, flags, 0o600), name
        except FileExistsError:
            continue


def write_atomic(path: Path, data: bytes, *, make_parents: bool = False) -> None:
    """Replace `path` with `data` atomically and durably, mode 0600; raises OSError.

    With `make_parents` a missing directory is created (mode 0700) first.
    """
    directory = path.parent
    if make_parents:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp_name = _create_temp(path)
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
