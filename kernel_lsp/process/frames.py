"""Frames on a pipe: a 4-byte big-endian length, then a msgpack map (the worker protocol's framing). The sandbox's
child and the candidate's process answer their parent this way; stdout and stderr stay the candidate's."""

from __future__ import annotations

import os
import select
import struct
import time
from typing import Any

import msgpack

FRAME_HEADER = struct.Struct(">I")


def encode_frame(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return FRAME_HEADER.pack(len(body)) + body


def decode_frame_body(body: bytes) -> dict[str, Any]:
    # map keys may be ints: an entry's return value is any msgpack value
    return msgpack.unpackb(body, raw=False, strict_map_key=False)


def read_frame(fd: int, deadline: float | None = None) -> dict[str, Any] | None:
    """The next frame on a blocking pipe, or None at end of file. With a deadline (time.monotonic()), TimeoutError
    once it passes before the whole frame came: a writer that sends half a frame and stops is no reply."""
    header = _read_exactly(fd, FRAME_HEADER.size, deadline)
    if header is None:
        return None
    body = _read_exactly(fd, FRAME_HEADER.unpack(header)[0], deadline)
    return None if body is None else decode_frame_body(body)


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        if deadline is not None and not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def write_frame(fd: int, message: dict[str, Any]) -> None:
    """Writes one frame to a blocking pipe."""
    write_all(fd, encode_frame(message))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# ---- the child's life --------------------------------------------------------------------------------------
