"""The worker's wire protocol: length-prefixed msgpack frames carrying one message (a map) each.

A frame is a 4-byte big-endian unsigned length, then that many bytes of msgpack encoding a map with
str keys and a `kind`. docs/PROTOCOL.md lists every message, the handshake, the job life cycle and
the error codes. Nothing a peer sends may crash the reader: every bad input becomes a ProtocolError
(or ConnectionClosed), which the daemon turns into an `error` reply.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NewType

import cattrs
import msgpack
from cattrs.gen import make_dict_structure_fn

from kernel_lsp.contracts.codec import failures

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
# One frozen dataclass per message kind: the fields each must have and their types, the one place they are defined
# (docs/PROTOCOL.md says what they mean). `validate` decodes a message through them with cattrs, strictly (no value
# coerced: "8" is no id, 1 is no bool), and names the first field that is missing or of the wrong type. Fields not
# listed (and `kind` itself) are ignored.

MessageId = NewType("MessageId", int)  # an integer >= 0
StrMap = NewType("StrMap", dict)  # str -> str (a job's files)
Versions = NewType("Versions", dict)  # str -> str or nil
Maps = NewType("Maps", list)  # a list of maps (a result's findings)
Status = NewType("Status", str)  # one of RESULT_STATUSES


@dataclass(frozen=True)
class JobMessage:
    kind: str
    source_files: StrMap
    config: dict
    content_hash: str


@dataclass(frozen=True)
class HelloMessage:
    protocol: int
    client: str
    token: str | None = None


@dataclass(frozen=True)
class SubmitMessage:
    id: MessageId
    job: JobMessage


@dataclass(frozen=True)
class IdMessage:  # cancel, ping
    id: MessageId


@dataclass(frozen=True)
class ShutdownMessage:
    pass


@dataclass(frozen=True)
class WelcomeMessage:
    protocol: int
    worker: str
    versions: Versions
    device: dict | None  # required, nil where the worker has no GPU
    authenticated: bool


@dataclass(frozen=True)
class ProgressMessage:
    id: MessageId
    message: str
    fraction: float | None = None


@dataclass(frozen=True)
class ResultMessage:
    id: MessageId
    status: Status
    findings: Maps
    metrics: dict
    artifacts: dict
    error: str | None = None
    code: str | None = None


@dataclass(frozen=True)
class PongMessage:
    id: MessageId
    device: dict | None = None


@dataclass(frozen=True)
class ErrorMessage:
    id: MessageId | None  # required: nil where the error answers no request
    code: str
    message: str


MESSAGES: dict[str, type] = {"hello": HelloMessage, "submit": SubmitMessage, "cancel": IdMessage, "ping": IdMessage,
                             "shutdown": ShutdownMessage, "welcome": WelcomeMessage, "progress": ProgressMessage,
                             "result": ResultMessage, "pong": PongMessage, "error": ErrorMessage}

_EXPECTED: dict[Any, str] = {MessageId: "an integer >= 0", int: "an integer", str: "a string", bool: "a boolean",
                             float: "a number", dict: "a map", StrMap: "a map of string to string",
                             Versions: "a map of string to string or nil", Maps: "a list of maps",
                             Status: "one of " + ", ".join(RESULT_STATUSES), JobMessage: "a map"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_id(value: Any) -> bool:
    return _is_int(value) and value >= 0


_CHECKS: dict[Any, Callable[[Any], bool]] = {
    MessageId: _is_id,
    int: _is_int,
    str: lambda v: isinstance(v, str),
    bool: lambda v: isinstance(v, bool),
    float: lambda v: isinstance(v, float) or _is_int(v),
    dict: lambda v: isinstance(v, dict),
    StrMap: lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()),
    Versions: lambda v: isinstance(v, dict) and all(isinstance(k, str) and (x is None or isinstance(x, str))
                                                    for k, x in v.items()),
    Maps: lambda v: isinstance(v, list) and all(isinstance(item, dict) for item in v),
    Status: lambda v: isinstance(v, str) and v in RESULT_STATUSES,
}


class _WrongType(TypeError):
    def __init__(self, hint: Any, value: Any) -> None:
        super().__init__(f"must be {_EXPECTED[hint]}, not {_wire_type(value)}")
        self.hint, self.value = hint, value


@functools.cache
def _converter() -> cattrs.Converter:
    conv = cattrs.Converter()
    for hint, check in _CHECKS.items():
        def structure(value: Any, _: Any, hint: Any = hint, check: Callable[[Any], bool] = check) -> Any:
            if not check(value):
                raise _WrongType(hint, value)
            return value
        conv.register_structure_hook(hint, structure)
    job = make_dict_structure_fn(JobMessage, conv)

    def structure_job(value: Any, _: Any) -> JobMessage:  # not a map: said as the field's type
        if not isinstance(value, dict):
            raise _WrongType(JobMessage, value)
        return job(value, JobMessage)
    conv.register_structure_hook(JobMessage, structure_job)
    return conv


def validate(message: dict[str, Any]) -> dict[str, Any]:
    """The message itself if its kind is known and its fields have their types; fields not listed are ignored."""
    message_id = _message_id(message)
    kind = message.get("kind")
    if not isinstance(kind, str):
        raise ProtocolError("bad-field", "field 'kind' is missing or not a string", message_id=message_id)
    schema = MESSAGES.get(kind)
    if schema is None:
        raise ProtocolError("unknown-kind", f"unknown message kind '{kind}'", message_id=message_id)
    try:
        _converter().structure(message, schema)
    except cattrs.BaseValidationError as exc:
        path, problem = failures(exc)[0]  # the first field missing or of the wrong type
        path = path.lstrip(".")
        text = (f"'{kind}' needs field '{path}'" if isinstance(problem, KeyError)
                else f"field '{path}' of '{kind}' {problem}")
        raise ProtocolError("bad-field", text, message_id=message_id) from None
    return message


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
