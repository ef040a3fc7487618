"""Small checkpoint files of a log directory, replaced atomically.

Format (text, like Kafka's checkpoint files)::

    0            <- format version
    <offset>

Written to ``<name>.tmp``, fsynced, renamed over ``<name>``, then the directory is fsynced,
so a crash leaves either the old or the new value, never a torn one. A file that cannot be
parsed is treated as absent (the caller falls back to the safe default: recover everything).
"""

from __future__ import annotations

import os

VERSION = 0


def write_offset(path: str, offset: int) -> None:
    write_atomic(path, f"{VERSION}\n{offset}\n")


def write_atomic(path: str, text: str | bytes) -> None:
    """Replace ``path`` with ``text`` (a str, or bytes written as they are) so that a crash
    leaves the old or the new content: ``<path>.tmp`` written and fsynced, renamed over
    ``path``, the directory fsynced."""
    tmp = path + ".tmp"
    with open(tmp, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def read_offset(path: str) -> int | None:
    try:
        with open(path) as f:
            lines = f.read().split()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    if len(lines) != 2 or lines[0] != str(VERSION):
        return None
    try:
        return int(lines[1])
    except ValueError:
        return None


def fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
