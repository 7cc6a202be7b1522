"""The worker's wire protocol: framing, validation, error codes, tokens, and fuzzing of the reader."""

from __future__ import annotations

import asyncio
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_lsp.worker import protocol
from kernel_lsp.worker.protocol import (
    ConnectionClosed,
    FrameTooLarge,
    Job,
    ProtocolError,
    Result,
)

JOB = Job("verify", {"model_new.py": "import torch\n", "ref.py": "x = 1\n"}, {"seeds": [0, 1], "atol": 1e-3},
          "ab12")
DEVICE = {"name": "NVIDIA H200", "memory": 150_000_000_000, "capability": [9, 0]}
FINDING = {"uri": "file:///a.cu", "range": [1, 0, 1, 4], "severity": 1, "source": "verify", "code": "mismatch",
           "message": "max abs error 0.5", "related": [], "data": {"seed": 3}}

SAMPLES: dict[str, dict[str, Any]] = {
    "hello": protocol.hello("kernel-lsp 0.1.0", token="s3cret"),
    "submit": protocol.submit(7, JOB),
    "cancel": protocol.cancel(7),
    "ping": protocol.ping(8),
    "shutdown": protocol.shutdown(),
    "welcome": protocol.welcome("kernel-lsp 0.1.0", {"python": "3.11.7", "torch": "2.13.0", "cuda": None,
                                                     "driver": None, "triton": None}, DEVICE, True),
    "progress": protocol.progress(7, "timing candidate", 0.5),
    "result": Result("ok", [FINDING], {"speedup": 1.7, "runs": 100}, {"ptx": b"\x00\x01"}).to_wire(7),
    "pong": protocol.pong(8, DEVICE),
    "error": protocol.error(None, "malformed-frame", "frame body is not msgpack"),
}


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def packed_frame(value: Any) -> bytes:
    return frame(msgpack.packb(value, use_bin_type=True))


async def read_fed(data: bytes, max_frame: int = protocol.DEFAULT_MAX_FRAME) -> dict[str, Any]:
    """The first message read from a stream that holds exactly `data` and then ends."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return await protocol.read_message(reader, max_frame)


async def read_error(data: bytes, max_frame: int = protocol.DEFAULT_MAX_FRAME) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        await read_fed(data, max_frame)
    return caught.value


# ---- round trips ----------------------------------------------------------------------------------------


def test_samples_cover_every_kind_in_both_directions():
    assert set(SAMPLES) == protocol.CLIENT_KINDS | protocol.WORKER_KINDS
    assert not protocol.CLIENT_KINDS & protocol.WORKER_KINDS


async def test_every_kind_round_trips_through_a_unix_socket(tmp_path: Path):
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await protocol.write_message(writer, await protocol.read_message(reader, protocol.DEFAULT_MAX_FRAME))
        except ConnectionClosed:
            writer.close()

    server = await asyncio.start_unix_server(echo, path=str(tmp_path / "worker.sock"))
    async with server:
        reader, writer = await asyncio.open_unix_connection(str(tmp_path / "worker.sock"))
        for message in SAMPLES.values():
            await protocol.write_message(writer, message)
        received = [await protocol.read_message(reader, protocol.DEFAULT_MAX_FRAME) for _ in SAMPLES]
        writer.close()
        await writer.wait_closed()
    assert received == list(SAMPLES.values())


@pytest.mark.parametrize("kind", sorted(SAMPLES))
async def test_each_sample_decodes_to_itself(kind: str):
    assert await read_fed(protocol.encode_frame(SAMPLES[kind])) == SAMPLES[kind]


def test_job_and_result_survive_their_wire_forms():
    assert Job.from_wire(SAMPLES["submit"]["job"]) == JOB
    result = Result("failed", [FINDING], {"max_abs": 0.5}, {}, "mismatch at seed 3")
    wire = result.to_wire(12)
    assert protocol.validate(wire) is wire
    assert (wire["id"], Result.from_wire(wire)) == (12, result)


def test_frame_is_big_endian_length_then_msgpack_map():
    encoded = protocol.encode_frame(protocol.ping(3))
    assert encoded[:4] == struct.pack(">I", len(encoded) - 4)
    assert msgpack.unpackb(encoded[4:]) == {"kind": "ping", "id": 3}


async def test_messages_are_read_one_after_another_then_clean_eof_is_connection_closed():
    reader = asyncio.StreamReader()
    reader.feed_data(protocol.encode_frame(protocol.ping(1)) + protocol.encode_frame(protocol.cancel(2)))
    reader.feed_eof()
    assert await protocol.read_message(reader, 1024) == protocol.ping(1)
    assert await protocol.read_message(reader, 1024) == protocol.cancel(2)
    with pytest.raises(ConnectionClosed):
        await protocol.read_message(reader, 1024)


def test_optional_fields_may_be_left_out_and_unknown_fields_are_ignored():
    for message in ({"kind": "hello", "protocol": 1, "client": "c"},
                    {"kind": "progress", "id": 1, "message": "m"},
                    {"kind": "result", "id": 1, "status": "lost", "findings": [], "metrics": {}, "artifacts": {}},
                    {"kind": "pong", "id": 1},
                    {"kind": "ping", "id": 1, "sent_at": 12.5}):
        assert protocol.validate(message) is message


# ---- size limit -----------------------------------------------------------------------------------------


async def test_huge_length_prefix_is_refused_without_reading_or_allocating_the_body():
    reader = asyncio.StreamReader()
    reader.feed_data(b"\xff\xff\xff\xff" + b"rest")
    reader.feed_eof()
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLarge) as caught:
            await protocol.read_message(reader, protocol.DEFAULT_MAX_FRAME)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (caught.value.code, caught.value.fatal, caught.value.size) == ("frame-too-large", True, 0xFFFFFFFF)
    assert peak < 1024 * 1024
    assert await reader.read() == b"rest"  # the body was never consumed


async def test_frame_of_exactly_the_limit_is_read_and_one_byte_more_is_refused():
    encoded = protocol.encode_frame(protocol.progress(1, "x" * 100))
    limit = len(encoded) - 4
    assert await read_fed(encoded, max_frame=limit) == protocol.progress(1, "x" * 100)
    error = await read_error(encoded, max_frame=limit - 1)
    assert (error.code, error.fatal) == ("frame-too-large", True)


def test_encoding_a_message_above_the_limit_raises_frame_too_large():
    with pytest.raises(FrameTooLarge) as caught:
        protocol.encode_frame(protocol.progress(1, "x" * 2000), max_frame=1000)
    assert caught.value.code == "frame-too-large"


# ---- malformed frames -----------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"\x00", b"\x00\x00\x00", b"\x00\x00\x00\x10", b"\x00\x00\x00\x10\x82\xa4kind"],
                         ids=["one-byte-prefix", "three-byte-prefix", "prefix-only", "half-body"])
async def test_eof_inside_a_frame_is_truncated_frame(data: bytes):
    error = await read_error(data)
    assert (error.code, error.fatal) == ("truncated-frame", True)


async def test_eof_before_any_byte_is_connection_closed():
    with pytest.raises(ConnectionClosed):
        await read_fed(b"")


@pytest.mark.parametrize("value", [1, "ping", [1, 2], None, b"\x01", 1.5, True], ids=repr)
async def test_body_that_is_not_a_map_is_malformed_frame(value: Any):
    error = await read_error(packed_frame(value))
    assert (error.code, error.fatal) == ("malformed-frame", False)


@pytest.mark.parametrize("value", [{1: "ping"}, {b"kind": "ping", b"id": 1}, {"kind": "ping", "id": 1, 2: 3},
                                   {(1, 2): 3}, {None: 1}], ids=repr)
async def test_map_with_non_string_keys_is_malformed_frame(value: dict[Any, Any]):
    error = await read_error(packed_frame(value))
    assert error.code == "malformed-frame"


@pytest.mark.parametrize("body", [
    b"",                                  # no value at all
    b"\xc1",                              # the one byte msgpack never uses
    b"\x81\xa4kind",                      # map that ends before its value
    b"\x81\xa4kind\xa4ping\x00",          # trailing data after the map
    b"\x81\xa4kind\xa2\xff\xfe",          # str that is not utf-8
    b"\xdd\xff\xff\xff\xff",              # array claiming 4 billion items
    b"\xdf\xff\xff\xff\xff",              # map claiming 4 billion entries
    b"\x91" * 100_000,                    # nesting deeper than the decoder's stack
], ids=["empty", "reserved-byte", "short-map", "extra-data", "bad-utf8", "huge-array", "huge-map", "deep"])
async def test_body_that_is_not_msgpack_is_malformed_frame(body: bytes):
    error = await read_error(frame(body))
    assert (error.code, error.fatal) == ("malformed-frame", False)


async def test_after_a_non_fatal_error_the_next_frame_is_read():
    reader = asyncio.StreamReader()
    reader.feed_data(frame(b"\xc1") + packed_frame({"kind": "nope", "id": 4}) + protocol.encode_frame(protocol.ping(5)))
    reader.feed_eof()
    for expected_code in ("malformed-frame", "unknown-kind"):
        with pytest.raises(ProtocolError) as caught:
            await protocol.read_message(reader, 1024)
        assert caught.value.code == expected_code
    assert await protocol.read_message(reader, 1024) == protocol.ping(5)


# ---- validation -----------------------------------------------------------------------------------------


async def test_unknown_kind_names_the_kind_and_the_message_id():
    error = await read_error(packed_frame({"kind": "launch-missiles", "id": 9}))
    assert (error.code, error.message_id, error.fatal) == ("unknown-kind", 9, False)
    assert "launch-missiles" in str(error)


@pytest.mark.parametrize("message", [{"id": 1}, {"kind": 3, "id": 1}, {"kind": None}, {"kind": b"ping", "id": 1}],
                         ids=repr)
def test_missing_or_non_string_kind_is_bad_field(message: dict[str, Any]):
    with pytest.raises(ProtocolError) as caught:
        protocol.validate(message)
    assert caught.value.code == "bad-field"
    assert "'kind'" in str(caught.value)


DROP = object()


def _with(kind: str, **changes: Any) -> dict[str, Any]:
    """A sample message of `kind` with fields replaced (or, for the value DROP, removed)."""
    message = {**SAMPLES[kind], **changes}
    return {k: v for k, v in message.items() if v is not DROP}


def _with_job(**changes: Any) -> dict[str, Any]:
    job = {**JOB.to_wire(), **changes}
    return _with("submit", job={k: v for k, v in job.items() if v is not DROP})


BAD_FIELDS = [
    (_with("ping", id="8"), "'id'", None),
    (_with("ping", id=-1), "'id'", None),
    (_with("ping", id=True), "'id'", None),
    (_with("ping", id=DROP), "'id'", None),
    (_with("cancel", id=1.0), "'id'", None),
    (_with("hello", protocol="1"), "'protocol'", None),
    (_with("hello", client=None), "'client'", None),
    (_with("hello", token=5), "'token'", None),
    (_with("submit", job=[1]), "'job'", 7),
    (_with_job(kind=None), "'job.kind'", 7),
    (_with_job(source_files={"a.cu": 1}), "'job.source_files'", 7),
    (_with_job(source_files={b"a.cu": "x"}), "'job.source_files'", 7),
    (_with_job(config=[]), "'job.config'", 7),
    (_with_job(content_hash=DROP), "'job.content_hash'", 7),
    (_with("welcome", versions={"torch": 2}), "'versions'", None),
    (_with("welcome", device=DROP), "'device'", None),
    (_with("welcome", device=[]), "'device'", None),
    (_with("welcome", authenticated=1), "'authenticated'", None),
    (_with("progress", message=b"bytes"), "'message'", 7),
    (_with("progress", fraction="half"), "'fraction'", 7),
    (_with("progress", fraction=False), "'fraction'", 7),
    (_with("result", status="done"), "'status'", 7),
    (_with("result", findings=[1]), "'findings'", 7),
    (_with("result", findings={}), "'findings'", 7),
    (_with("result", metrics=[]), "'metrics'", 7),
    (_with("result", artifacts=DROP), "'artifacts'", 7),
    (_with("result", error=1), "'error'", 7),
    (_with("pong", device="H200"), "'device'", 8),
    (_with("error", id=DROP), "'id'", None),
    (_with("error", id=-3), "'id'", None),
    (_with("error", code=DROP), "'code'", None),
    (_with("error", message=None), "'message'", None),
]


@pytest.mark.parametrize(("message", "field_name", "message_id"), BAD_FIELDS,
                         ids=[f"{m['kind']}-{name.strip(chr(39))}-{i}" for i, (m, name, _) in enumerate(BAD_FIELDS)])
async def test_wrong_or_missing_field_is_bad_field_naming_the_field(message: dict[str, Any], field_name: str,
                                                                    message_id: int | None):
    error = await read_error(packed_frame(message))
    assert (error.code, error.message_id, error.fatal) == ("bad-field", message_id, False)
    assert field_name in str(error)


def test_error_reply_may_have_no_id():
    assert protocol.validate(protocol.error(None, "busy", "b"))["id"] is None


# ---- tokens ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("presented", "expected", "accepted"), [
    (None, None, True),
    ("anything", None, True),
    (None, "s3cret", False),
    ("s3cret", "s3cret", True),
    ("s3creT", "s3cret", False),
    ("", "s3cret", False),
    ("s3cret ", "s3cret", False),
    ("jeton-été", "jeton-été", True),   # non-ASCII: compared as utf-8 bytes
    ("jeton-ete", "jeton-été", False),
])
def test_check_token(presented: str | None, expected: str | None, accepted: bool):
    assert protocol.check_token(presented, expected) is accepted


# ---- fuzzing --------------------------------------------------------------------------------------------

msgpack_leaves = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
                  | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20))
msgpack_values = st.recursive(
    msgpack_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
str_maps = st.dictionaries(st.text(max_size=10), msgpack_values, max_size=4)
ids = st.integers(min_value=0, max_value=2**64 - 1)
texts = st.text(max_size=30)
random_maps = st.dictionaries(st.sampled_from(["kind", "id", "job", "status", "token", "x"]) | st.text(max_size=5),
                              msgpack_values | st.sampled_from(sorted(SAMPLES)), max_size=5)
hostile_streams = st.one_of(
    st.binary(max_size=300),
    st.lists(st.binary(max_size=40).map(frame), max_size=4).map(b"".join),
    st.lists(random_maps.map(packed_frame), max_size=4).map(b"".join),
    st.lists(st.sampled_from(list(SAMPLES.values())).map(packed_frame), max_size=3).map(b"".join)
    .flatmap(lambda good: st.integers(0, len(good)).map(lambda cut: good[:cut])),
)


async def drain_stream(data: bytes) -> None:
    """Read messages until the stream ends or a fatal error; any other exception escapes."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    while True:
        try:
            await protocol.read_message(reader, max_frame=256)
        except ConnectionClosed:
            return
        except ProtocolError as error:
            assert error.code in {"frame-too-large", "truncated-frame", "malformed-frame", "unknown-kind",
                                  "bad-field"}
            if error.fatal:
                return


@settings(max_examples=200, deadline=None)
@given(hostile_streams)
def test_reader_raises_only_protocol_errors_on_any_input(data: bytes):
    asyncio.run(drain_stream(data))


jobs = st.builds(Job, texts, st.dictionaries(texts, texts, max_size=3), str_maps, texts)
valid_messages = st.one_of(
    st.builds(protocol.hello, texts, st.none() | texts, st.integers(-(2**31), 2**31)),
    st.builds(protocol.submit, ids, jobs),
    st.builds(protocol.cancel, ids),
    st.builds(protocol.ping, ids),
    st.just(protocol.shutdown()),
    st.builds(protocol.welcome, texts, st.dictionaries(texts, st.none() | texts, max_size=5), st.none() | str_maps,
              st.booleans()),
    st.builds(protocol.progress, ids, texts, st.none() | st.floats(0, 1)),
    st.builds(lambda i, r: r.to_wire(i), ids,
              st.builds(Result, st.sampled_from(protocol.RESULT_STATUSES), st.lists(str_maps, max_size=3), str_maps,
                        str_maps, st.none() | texts)),
    st.builds(protocol.pong, ids, st.none() | str_maps),
    st.builds(protocol.error, st.none() | ids, texts, texts),
)


@settings(max_examples=200, deadline=None)
@given(valid_messages)
def test_valid_messages_round_trip_equal(message: dict[str, Any]):
    assert asyncio.run(read_fed(protocol.encode_frame(message))) == message
