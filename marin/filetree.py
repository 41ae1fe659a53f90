"""Whether a file or a folder on disk holds plain files: regular files and directories, nothing else.

One judgement for every input read from a folder (local sources, archives given as a directory,
reference model folders, hub dataset folders) and every folder hashed (:mod:`marin.hashing`): a
symbolic link may lead outside the project, a fifo blocks its reader forever, a device or a kernel
pseudo-file (under /proc, /sys, /dev) has a size that says nothing of its bytes. A digest that
skipped such an entry would pin a folder without it, so the entry is refused by name instead.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from marin.fsutil import not_regular

_PSEUDO = ("/proc", "/sys", "/dev")  # kernel file systems: a file's size there says nothing of its bytes


def _pseudo(path: Path) -> str | None:
    real = os.path.realpath(path)
    if any(real == d or real.startswith(d + "/") for d in _PSEUDO):
        return f"is a kernel pseudo-file ({real}), not data on a disk"
    return None


def file_problem(path: Path) -> str | None:
    """Why ``path`` (not followed, if a link) is not a regular file or directory on a disk: a
    link, device, fifo or socket, or a kernel pseudo-file (under /proc, /sys, /dev); or None."""
    mode = path.lstat().st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return not_regular(mode)
    return _pseudo(path)


def link_problem(path: Path) -> str | None:
    """Why the link ``path`` does not lead to a regular file on a disk (a DVC checkout's link to its
    cache does), or None."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        return f"is a symbolic link that leads nowhere ({os.strerror(e.errno).lower() if e.errno else e})"
    if not stat.S_ISREG(mode):
        return "is a symbolic link to " + (not_regular(mode) or "").removeprefix("is ")
    return _pseudo(path)


def tree_problem(root: Path, *, links: bool = False) -> tuple[str, str] | None:
    """(path relative to ``root``, why) of the first entry, in path order, under the directory ``root``
    that is not a regular file or directory (a link, device, fifo, socket), or that cannot be listed;
    or None. With ``links``, a link to a regular file passes (:func:`link_problem`). ``root`` itself
    is the caller's to judge (:func:`file_problem`)."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            why = f"cannot be listed ({os.strerror(e.errno).lower() if e.errno else e})"
            return Path(folder).relative_to(root).as_posix(), why
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                continue
            p = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                stack.append(p)
                continue
            why = link_problem(p) if links and entry.is_symlink() else file_problem(p)
            if why is not None:
                return p.relative_to(root).as_posix(), why
        stack.sort(reverse=True)  # the first in path order is walked next
    return None
