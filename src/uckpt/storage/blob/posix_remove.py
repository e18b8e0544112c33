"""Removing a directory tree of a :class:`~uckpt.storage.blob.posix.PosixStore` that other
processes or threads change meanwhile (ranks sharing the directory remove, rename and
write their own files while one rank deletes the prefix)."""
from __future__ import annotations

import errno
import os

#: passes over a tree that a writer still fills: each removes what the last one missed
PASSES = 5
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def remove_tree(name: str, dir_fd: int) -> None:
    """Remove the directory ``name`` in the directory ``dir_fd`` and everything below it,
    never following a symbolic link. What is already gone counts as removed; what a writer
    put in after a directory was emptied is removed by a further pass (at most
    :data:`PASSES`, then the OSError ``ENOTEMPTY`` is raised)."""
    for left in reversed(range(PASSES)):
        try:
            _remove(name, dir_fd)
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not left:
                raise


def _remove(name: str, dir_fd: int) -> None:
    """One pass: a stack of open directories, not recursion (a tree however deep cannot
    exhaust Python's stack)."""
    top = _open(name, dir_fd)
    if top is None:
        return
    stack = [(dir_fd, name, top)]  # (its parent's descriptor, its name, its own)
    try:
        while stack:
            parent, sub, fd = stack[-1]
            child = _unlink_files(fd)
            if child is not None:
                child_fd = _open(child, fd)
                if child_fd is not None:
                    stack.append((fd, child, child_fd))
                continue  # emptied, vanished or unlinked: look at this directory again
            stack.pop()
            os.close(fd)
            try:
                os.rmdir(sub, dir_fd=parent)
            except FileNotFoundError:
                pass
    finally:
        for _, _, fd in stack:
            os.close(fd)


def _open(name: str, dir_fd: int) -> int | None:
    """The descriptor of the directory ``name``; None where it is gone, or was not a
    directory (then it is unlinked instead)."""
    try:
        return os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
    _unlink(name, dir_fd)  # replaced by a file or a symlink since it was listed
    return None


def _unlink_files(fd: int) -> str | None:
    """Unlink every entry of the directory ``fd`` but directories; the name of one
    directory in it, None where there is none."""
    found = None
    with os.scandir(fd) as it:
        for entry in it:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if is_dir:
                found = entry.name
            else:
                _unlink(entry.name, fd)
    return found


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
