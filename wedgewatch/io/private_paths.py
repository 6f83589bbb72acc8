"""Directories and lock files that another local user cannot subvert.

wedgewatch often runs as root. A state or evidence directory that another user can
write lets that user plant a symlink where wedgewatch will open a file (`lock` ->
`/etc/passwd`: root truncates it and writes its pid into it) or hold a lock for ever.

- `private_dir(path, what)` makes sure a directory is wedgewatch's: a missing one is
  created 0700 (parents too); an existing one, which wedgewatch may not have created, is
  checked: it must be owned by wedgewatch's user or root, and writable by nobody else
  unless it is sticky (like `/tmp`: others cannot remove or rename what is not theirs);
  a symlink in its place must be wedgewatch's user's or root's.
  One owned by wedgewatch's user but writable by others (a Kubernetes `emptyDir` is 0777)
  has the group and other write bits removed, which only its owner could do anyway; any
  other unsafe directory is refused with `UnsafePath`, saying what to change.
- `open_lock_file(path)` opens (or creates, 0600) a lock file without following a
  symlink; it must be a regular file owned by wedgewatch's user, and it is made 0600 so
  nobody else can open it, let alone hold its lock.
- `read_private(path)` reads a file without following a symlink, refusing one that is
  not a regular file owned by wedgewatch's user.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

#: The mode bits that let someone other than the owner write into a directory.
_OTHERS_WRITE: Final = stat.S_IWGRP | stat.S_IWOTH


class UnsafePath(OSError):
    """A directory or file another user controls: refused, with what to do about it."""


def private_dir(path: Path, what: str) -> str | None:
    """Create `path` 0700, or check an existing one (see the module docstring).

    Returns a note when an existing directory's mode was tightened, else None; raises
    `UnsafePath` for a directory wedgewatch must not use and OSError when it cannot be made.
    """
    try:
        os.mkdir(path, 0o700)
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
            return None
    except FileExistsError:
        pass
    else:
        return None
    me = os.geteuid()
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise UnsafePath(
            f"{what} {path} is a symlink created by uid {link.st_uid}, not by wedgewatch's "
            f"user (uid {me}) or root: it could point anywhere. Remove it"
        )
    info = os.stat(path)  # an own symlink to a directory is judged by the directory
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(f"{what} {path} is not a directory")
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (me, 0):
        raise UnsafePath(
            f"{what} {path} is owned by uid {info.st_uid}, not by wedgewatch's user (uid {me}) "
            f"or root: that user could plant files in it. Use a directory wedgewatch's user "
            f"owns (chown {me} {path}) or let wedgewatch create it"
        )
    if not mode & _OTHERS_WRITE or mode & stat.S_ISVTX:
        return None
    if info.st_uid != me:
        raise UnsafePath(
            f"{what} {path} is writable by other users (mode {mode:04o}) and not sticky: "
            f"any of them could plant a symlink in it. Make it writable by its owner only "
            f"(chmod go-w {path}) or use another directory"
        )
    tightened = mode & ~_OTHERS_WRITE
    os.chmod(path, tightened)
    return f"{what} {path} was writable by other users (mode {mode:04o}); now {tightened:04o}"


def _check_own_file(fd: int, path: Path) -> os.stat_result:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePath(f"{path} is not a regular file")
    if info.st_uid != os.geteuid():
        raise UnsafePath(
            f"{path} is owned by uid {info.st_uid}, not by wedgewatch's user "
            f"(uid {os.geteuid()}): someone else created it; remove it"
        )
    return info


def open_lock_file(path: Path) -> int:
    """Open or create the lock file `path` (0600, never through a symlink): its descriptor.

    Raises `UnsafePath` for a symlink, a special file or a file of another user.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if path.is_symlink():
            raise UnsafePath(f"{path} is a symlink; a lock file never is: remove it") from exc
        raise
    try:
        info = _check_own_file(fd, path)
        if stat.S_IMODE(info.st_mode) != 0o600:
            os.fchmod(fd, 0o600)  # a lock file others can open, others can hold
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(path: Path) -> bytes:
    """The bytes of `path`, read without following a symlink; raises OSError (`UnsafePath`
    for a symlink, a special file or a file of another user; FileNotFoundError if absent)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if path.is_symlink():
            raise UnsafePath(f"{path} is a symlink; wedgewatch does not follow it") from exc
        raise
    with os.fdopen(fd, "rb") as file:
        _check_own_file(fd, path)
        return file.read()
