"""The worker's wire protocol: length-prefixed msgpack frames carrying one message (a map) each.

A frame is a 4-byte big-endian unsigned length, then that many bytes of msgpack encoding a map with
str keys and a `kind`. docs/PROTOCOL.md lists every message, the handshake, the job life cycle and
the error codes. Nothing a peer sends may crash the reader: every bad input becomes a ProtocolError
(or ConnectionClosed), which the daemon turns into an `error` reply.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME = 64 * 1024 * 1024

LENGTH_PREFIX = struct.Struct(">I")
RESULT_STATUSES = ("ok", "failed", "cancelled", "timeout", "lost")
CLIENT_KINDS = frozenset({"hello", "submit", "cancel", "ping", "shutdown"})
WORKER_KINDS = frozenset({"welcome", "progress", "result", "pong", "error"})


class ConnectionClosed(Exception):
    """The peer closed the connection at a frame boundary (or reset it): no more messages."""


class ProtocolError(Exception):
    """A frame or message the protocol does not allow; `code` goes into the `error` reply."""

    def __init__(self, code: str, message: str | None = None, *, fatal: bool = False,
                 message_id: int | None = None) -> None:
        super().__init__(message or code)
        self.code = code
        self.fatal = fatal  # the stream cannot be resynchronised: reply, then close
        self.message_id = message_id


class FrameTooLarge(ProtocolError):
    """A frame longer than the size limit; its body is never read, so the stream is lost."""

    def __init__(self, size: int, max_frame: int) -> None:
        super().__init__("frame-too-large", f"frame of {size} bytes exceeds the limit of {max_frame} bytes",
                         fatal=True)
        self.size = size
        self.max_frame = max_frame


# ---- framing ---------------------------------------------------------------------------------------------


def encode_frame(message: dict[str, Any], max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > max_frame:
        raise FrameTooLarge(len(body), max_frame)
    return LENGTH_PREFIX.pack(len(body)) + body


async def read_message(reader: asyncio.StreamReader, max_frame: int) -> dict[str, Any]:
    """One validated message from the stream."""
    size = await _read_length(reader)
    if size > max_frame:
        raise FrameTooLarge(size, max_frame)
    body = await _read_exactly(reader, size)
    return validate(decode_body(body))


async def write_message(writer: asyncio.StreamWriter, message: dict[str, Any],
                        max_frame: int = DEFAULT_MAX_FRAME) -> None:
    writer.write(encode_frame(message, max_frame))
    await writer.drain()


async def _read_length(reader: asyncio.StreamReader) -> int:
    try:
        prefix = await reader.readexactly(LENGTH_PREFIX.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise ConnectionClosed() from None
        raise _truncated(len(exc.partial), LENGTH_PREFIX.size) from None
    except ConnectionError as exc:
        raise ConnectionClosed(str(exc)) from None
    return LENGTH_PREFIX.unpack(prefix)[0]


async def _read_exactly(reader: asyncio.StreamReader, size: int) -> bytes:
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise _truncated(len(exc.partial), size) from None
    except ConnectionError as exc:
        raise ConnectionClosed(str(exc)) from None


def _truncated(received: int, expected: int) -> ProtocolError:
    # the peer stopped sending mid-frame: nothing more will come on this stream
    return ProtocolError("truncated-frame", f"connection ended after {received} of {expected} bytes", fatal=True)


def decode_body(body: bytes) -> dict[str, Any]:
    """A frame body -> a map with str keys (not yet validated as a message)."""
    try:
        # explicit limits: a length inside the body can never claim more items than there are bytes
        decoded = msgpack.unpackb(
            body, raw=False, strict_map_key=True, use_list=True,
            max_str_len=len(body), max_bin_len=len(body), max_ext_len=len(body),
            max_array_len=len(body), max_map_len=len(body) // 2,
        )
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError("malformed-frame", f"frame body is not msgpack: {exc}") from None
    if not isinstance(decoded, dict):
        raise ProtocolError("malformed-frame", f"frame body is a {_wire_type(decoded)}, not a map")
    if not all(isinstance(key, str) for key in decoded):
        raise ProtocolError("malformed-frame", "frame body is a map with non-string keys")
    return decoded


# ---- message schemas -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    check: Callable[[Any], bool]
    expected: str
    required: bool = True
    fields: dict[str, _Field] | None = None  # a nested map whose own fields are checked


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_id(value: Any) -> bool:
    return _is_int(value) and value >= 0


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, float) or _is_int(value)


def _is_map(value: Any) -> bool:
    return isinstance(value, dict)


def _is_str_map(value: Any) -> bool:
    return _is_map(value) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _is_versions(value: Any) -> bool:
    return _is_map(value) and all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in value.items())


def _is_list_of_maps(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _is_status(value: Any) -> bool:
    return isinstance(value, str) and value in RESULT_STATUSES


def _or_nil(base: _Field, required: bool) -> _Field:
    return _Field(lambda v: v is None or base.check(v), f"{base.expected} or nil", required)


_ID = _Field(_is_id, "an integer >= 0")
_INT = _Field(_is_int, "an integer")
_STR = _Field(_is_str, "a string")
_BOOL = _Field(_is_bool, "a boolean")
_MAP = _Field(_is_map, "a map")
_NUMBER = _Field(_is_number, "a number")

_JOB_FIELDS = {
    "kind": _STR,
    "source_files": _Field(_is_str_map, "a map of string to string"),
    "config": _MAP,
    "content_hash": _STR,
}

_SCHEMAS: dict[str, dict[str, _Field]] = {
    "hello": {"protocol": _INT, "client": _STR, "token": _or_nil(_STR, required=False)},
    "submit": {"id": _ID, "job": _Field(_is_map, "a map", fields=_JOB_FIELDS)},
    "cancel": {"id": _ID},
    "ping": {"id": _ID},
    "shutdown": {},
    "welcome": {
        "protocol": _INT,
        "worker": _STR,
        "versions": _Field(_is_versions, "a map of string to string or nil"),
        "device": _or_nil(_MAP, required=True),
        "authenticated": _BOOL,
    },
    "progress": {"id": _ID, "message": _STR, "fraction": _or_nil(_NUMBER, required=False)},
    "result": {
        "id": _ID,
        "status": _Field(_is_status, "one of " + ", ".join(RESULT_STATUSES)),
        "findings": _Field(_is_list_of_maps, "a list of maps"),
        "metrics": _MAP,
        "artifacts": _MAP,
        "error": _or_nil(_STR, required=False),
        "code": _or_nil(_STR, required=False),
    },
    "pong": {"id": _ID, "device": _or_nil(_MAP, required=False)},
    "error": {"id": _or_nil(_ID, required=True), "code": _STR, "message": _STR},
}


def validate(message: dict[str, Any]) -> dict[str, Any]:
    """The message itself if its kind is known and its fields have their types; fields not listed are ignored."""
    message_id = _message_id(message)
    kind = message.get("kind")
    if not isinstance(kind, str):
        raise ProtocolError("bad-field", "field 'kind' is missing or not a string", message_id=message_id)
    schema = _SCHEMAS.get(kind)
    if schema is None:
        raise ProtocolError("unknown-kind", f"unknown message kind '{kind}'", message_id=message_id)
    _check_fields(message, schema, kind, "", message_id)
    return message


def _check_fields(value: dict[str, Any], schema: dict[str, _Field], kind: str, prefix: str,
                  message_id: int | None) -> None:
    for name, spec in schema.items():
        path = prefix + name
        if name not in value:
            if spec.required:
                raise ProtocolError("bad-field", f"'{kind}' needs field '{path}'", message_id=message_id)
            continue
        if not spec.check(value[name]):
            raise ProtocolError("bad-field", f"field '{path}' of '{kind}' must be {spec.expected}, "
                                f"not {_wire_type(value[name])}", message_id=message_id)
        if spec.fields is not None:
            _check_fields(value[name], spec.fields, kind, path + ".", message_id)


def _message_id(message: dict[str, Any]) -> int | None:
    """The message's id if it has a usable one, so an error reply can name the request it answers."""
    candidate = message.get("id")
    return candidate if _is_id(candidate) else None


def _wire_type(value: Any) -> str:
    return "nil" if value is None else type(value).__name__


# ---- typed helpers ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What the server asks the worker to do; `kind` picks the worker-side handler."""

    kind: str
    source_files: dict[str, str]
    config: dict[str, Any]
    content_hash: str

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "source_files": dict(self.source_files), "config": dict(self.config),
                "content_hash": self.content_hash}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Job:
        return cls(d["kind"], dict(d["source_files"]), dict(d["config"]), d["content_hash"])


@dataclass(frozen=True)
class Result:
    """How a job ended; `findings` are Finding.to_dict() maps."""

    status: str
    findings: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    # why a job did not run, as a code its readers branch on (`error` is the sentence a person reads):
    # "sanitize-no-gpu", or a worker error's code ("unknown-job-kind"); None where the sentence is all there is
    code: str | None = None

    def to_wire(self, id: int) -> dict[str, Any]:
        return {"kind": "result", "id": id, "status": self.status, "findings": list(self.findings),
                "metrics": dict(self.metrics), "artifacts": dict(self.artifacts), "error": self.error,
                "code": self.code}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Result:
        return cls(d["status"], list(d["findings"]), dict(d["metrics"]), dict(d["artifacts"]), d.get("error"),
                   d.get("code"))


def hello(client: str, token: str | None = None, protocol: int = PROTOCOL_VERSION) -> dict[str, Any]:
    return {"kind": "hello", "protocol": protocol, "client": client, "token": token}


def welcome(worker: str, versions: dict[str, str | None], device: dict[str, Any] | None, authenticated: bool,
            protocol: int = PROTOCOL_VERSION) -> dict[str, Any]:
    return {"kind": "welcome", "protocol": protocol, "worker": worker, "versions": dict(versions),
            "device": device, "authenticated": authenticated}


def submit(id: int, job: Job) -> dict[str, Any]:
    return {"kind": "submit", "id": id, "job": job.to_wire()}


def cancel(id: int) -> dict[str, Any]:
    return {"kind": "cancel", "id": id}


def ping(id: int) -> dict[str, Any]:
    return {"kind": "ping", "id": id}


def pong(id: int, device: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "pong", "id": id, "device": device}


def progress(id: int, message: str, fraction: float | None = None) -> dict[str, Any]:
    return {"kind": "progress", "id": id, "message": message, "fraction": fraction}


def error(id: int | None, code: str, message: str) -> dict[str, Any]:
    return {"kind": "error", "id": id, "code": code, "message": message}


def shutdown() -> dict[str, Any]:
    return {"kind": "shutdown"}


def check_token(presented: str | None, expected: str | None) -> bool:
    """Whether a hello's token opens this worker; compared in constant time. Only the stdio worker (a pipe, no
    listener) runs without a token; a listening one always has one (daemon.run_listener)."""
    if expected is None:
        return True
    if not isinstance(presented, str):
        return False
    return hmac.compare_digest(presented.encode("utf-8"), expected.encode("utf-8"))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_file_for(address: str) -> Path | None:
    """Where a worker listening on `address` with no token given writes the one it made (mode 0600), and where a
    client of that address with no token of its own reads it: beside the socket for unix:PATH (PATH.token), under
    the cache folder's worker-tokens/ for tcp:HOST:PORT on a loopback host. None otherwise (the stdio worker, a
    remote host: there the token is given on both sides)."""
    scheme, _, rest = address.partition(":")
    if scheme == "unix" and rest:
        return Path(rest + ".token")
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        host = host.strip("[]")
        if host and port.isdigit() and is_loopback(host):
            from kernel_lsp.config import cache_dir

            return cache_dir() / "worker-tokens" / f"tcp-{host.replace(':', '_')}-{port}.token"
    return None


def read_token_file(path: Path) -> str | None:
    """The token in `path`, or None when there is none to read."""
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None
