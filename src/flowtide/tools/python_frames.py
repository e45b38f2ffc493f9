"""The frames python steps' parent and child processes exchange
(`flowtide.tools.python_pool`, `flowtide.tools.python_child`): a 4-byte big-endian length
and that many bytes."""

from __future__ import annotations

import os
import struct

__all__ = ["frame_body", "read_exactly", "read_frame", "write_frame"]

_HEADER = struct.Struct(">I")


def read_frame(fd: int) -> bytes | None:
    """One frame from `fd`; None at end of file (the other side is gone)."""
    # One read takes a whole small frame (the usual case): a system call less per frame.
    first = os.read(fd, 1 << 16)
    if len(first) < _HEADER.size:
        rest = read_exactly(fd, _HEADER.size - len(first)) if first else None
        if rest is None:
            return None
        first += rest
    (size,) = _HEADER.unpack_from(first)
    return frame_body(fd, first[_HEADER.size :], size)


def frame_body(fd: int, got: bytes, size: int) -> bytes | None:
    """The `size` bytes of a frame whose first bytes `got` were read already."""
    if len(got) >= size:
        return got[:size]
    rest = read_exactly(fd, size - len(got))
    return None if rest is None else got + rest


def read_exactly(fd: int, size: int) -> bytes | None:
    parts: list[bytes] = []
    left = size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def write_frame(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
