"""The wire protocol (styx_py.core.wire): every message round-trips; bad bytes are ProtocolErrors;
no pickle."""

from __future__ import annotations

import contextlib
import io
import struct
import tokenize
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from styx_py.core import wire
from styx_py.core.errors import ProtocolError
from styx_py.core.graph import GraphVersion, OperatorSpec
from styx_py.core.limits import MAX_FRAME_BYTES
from styx_py.core.scan import ScanRange
from styx_py.core.wire import (
    Ack,
    AdminReply,
    Batch,
    CallResult,
    ClusterView,
    DeployRequest,
    EpochDone,
    EpochStart,
    ExecDone,
    Final,
    Heartbeat,
    Invoke,
    Outcome,
    Phase,
    Register,
    Reply,
    ReplyStatus,
    Request,
    SeqLogEntry,
    Status,
    StatusRequest,
    Vote,
    WorkAvailable,
    WorkerInfo,
    decode_batch,
    decode_value,
    encode_frame,
    encode_value,
    frame_length,
)

RAW = msgspec.Raw(encode_value([1, "two", {"three": 3.5}, None]))

ALL_MESSAGES = [
    Register("w1", "10.0.0.1", 7001),
    ClusterView(
        3,
        [WorkerInfo("w1", 1, "h1", 1), WorkerInfo("w2", 2, "h2", 2)],
        ["w1", "w2", "w1"],
        "tests.apps.oracle:app",
        [OperatorSpec("acct", 8, ["balance", "deposit"], "balance"), OperatorSpec("ledger", 3, ["record"])],
        "localhost:9092",
        "in",
        "out",
        "seq",
        2,
    ),
    ClusterView(0, [], [], None, [], None, "in", "out", "seq", 0),
    ClusterView(
        3,
        [],
        [],
        "m:v2",
        [],
        None,
        "in",
        "out",
        "seq",
        1,
        3,
        [GraphVersion(1, "m:v1", 0), GraphVersion(2, "m:v2", 7)],
    ),
    Heartbeat("w1", -1),
    WorkAvailable("w2"),
    EpochStart(12, 99, False, True, 0),
    EpochStart(12, 99, True, False, 4),
    EpochStart(12, 99, False, False, 4, 3),
    wire.PrepareGraph(2, "tests.apps.versioned:v2"),
    wire.GraphPrepared("w1", 2, True, "", [OperatorSpec("fees", 3, ["collect"])]),
    wire.GraphPrepared("w2", 2, False, "cannot import 'x'", []),
    ExecDone(12, "w1", [4, 7], 0),
    Vote(12, "w2", [9], [11], 0),
    Vote(12, "w2", [9], [11], 0, 101, 3),
    wire.Revote(12, "w2", [9], 0),
    EpochDone(12, "w3", 5, 10, 2, 1, 0),
    Invoke(12, 9, Phase.OPTIMISTIC, [0, 2], "w1", "w2", "acct", "deposit", "k1", RAW, 1, 6, True, 1234, 0),
    Invoke(12, 9, Phase.FALLBACK, [], "w1", "w1", "acct", "deposit", 42, RAW, 1, 1, False, 0, 0),
    Invoke(12, 9, Phase.OPTIMISTIC, [], "w1", "w1", "acct", "deposit", -(2**63), RAW, 1, 1, False, 0, 0),
    CallResult(12, 9, Phase.FALLBACK, [0], Status.OK, RAW, 0),
    Ack(12, 9, Phase.OPTIMISTIC, 1, 3, Status.ERROR, "ValueError: boom", [1, 0], 0),
    Final(12, 9, Outcome.RESCHEDULE, 0),
    Final(12, 9, Outcome.COMMIT, 3),
    wire.SnapshotDone(12, "w1", True, "", 4, 1234, 17, 2),
    wire.SnapshotResult(12, False, 2),
    wire.Recover(wire.Manifest(11, 40, 4, {0: ["a", "b"], 3: ["c"]}, [(0, 0), (9, 3)]), 15, 3),
    wire.Recover(wire.Manifest(11, 40, 4, {0: ["a"]}, [(0, 0)]), 11, 4, True),
    wire.Fenced("w2", 3),
    wire.RecoverDone("w2", False, "FileNotFoundError: x", 3),
    wire.ReplayDiverged("w2", 7, "r9", "acct.deposit", "committed 1 (tid 4)", "committed 2 (tid 4)", 3),
    wire.ReplayDiverged("w2", 7, "", "acct.deposit", "digest 01", "no write", 3, 5, 4),
    wire.LogLost("w1", "ingress styx-ingress partition 2: recorded offset 1830, broker ends at 0"),
    wire.Halt("replay of epoch 7 diverged"),
    wire.Retire("drained", 4),
    wire.Retire(
        "drained",
        4,
        ClusterView(
            5, [WorkerInfo("w2", 2, "h2", 2)], ["w2"], "m:v", [], None, "i", "o", "s", 4, 2, [], True
        ),
    ),
    wire.Handoff(4, 3, 17, 0, 2, [("acct", "k1", b"\x01"), ("acct", 7, b"\x02")], [("acct", "k9", None)]),
    wire.Handoff(
        4,
        3,
        17,
        1,
        2,
        [],
        [],
        [Reply("r1", 9, 12, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, RAW, None, None)],
        [],
        41,
        [(9, 40, 1234, wire.Request("r2", "acct", "deposit", "k1", RAW))],
        [(39, 1200, wire.Request("r3", "acct", "deposit", "k1", RAW))],
        {0: 5, 3: 8},
    ),
    DeployRequest("tests.apps.oracle:app"),
    StatusRequest(),
    wire.ScaleRequest(3),
    wire.DrainRequest("w2"),
    wire.ReplyLookup(["r1", "r2"]),
    wire.FindReplies(4, ["r1", "r2"], 3),
    wire.FoundReplies(
        4,
        "w1",
        [Reply("r1", 9, 12, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, RAW, None, None)],
        ["r2"],
        [],
        True,
    ),
    wire.ReadState("acct", prefix="eu:", limit=10, epoch=7),
    wire.ReadState("acct", key=5),
    wire.ReadAt(3, 2, 7, ScanRange("acct", "a", True, None, True, "eu:", -1, 4), 10, [0, 2]),
    wire.ReadRows(3, "w1", [wire.PartRows.of(0, ["a", 4], [bytes(RAW), bytes(RAW)], True)]),
    wire.ReadRows(3, "w2", [], "out-of-window", "epoch 7 is older", 9),
    AdminReply(False, "nope", {"a": [1, 2], "b": {"c": None}}),
    wire.SubscribeReplies(),
    wire.PushedRequest(1, 2, 3, 1_700_000_000_000, b"rid", b"\x95record"),
    wire.PushedReply(Reply("r1", 9, 12, Phase.OPTIMISTIC, ReplyStatus.COMMITTED, RAW, None, None, 17)),
    wire.SubscribeRefused(1024),
    wire.SubscribeReplies(marks=True),
    wire.EgressAcked([(0, 17), (3, (2 << 40) | 5)]),
]

INBOXES: dict[wire.Inbox, object] = {
    "coordinator": wire.ToCoordinator,
    "worker": wire.ToWorker,
    "admin": wire.ToAdmin,
}


def _members(union: object) -> set[type]:
    return set(getattr(union, "__args__", (union,)))


def inbox_for(msg: object) -> wire.Inbox:
    """A channel that carries ``msg`` (the first, for a message more than one channel carries)."""
    return next(name for name, union in INBOXES.items() if type(msg) in _members(union))


def test_every_message_type_is_covered_and_belongs_to_a_channel() -> None:
    assert {type(m) for m in ALL_MESSAGES} == _members(wire.Message)
    assert set().union(*(_members(u) for u in INBOXES.values())) == _members(wire.Message)


def test_the_channels() -> None:
    """Workers' reports and admin requests go to the coordinator; its orders and peers' transaction
    messages to a worker; admin replies to an admin client. Heartbeats go both ways, and so do the
    epoch reports (every worker decides from its peers' too). A client subscribes on a worker's port
    and is pushed replies there."""
    to_coordinator, to_worker = _members(wire.ToCoordinator), _members(wire.ToWorker)
    assert to_coordinator & to_worker == {Heartbeat, Vote, wire.Revote}
    assert ExecDone in to_worker - to_coordinator  # to the peers only: the Vote tells the coordinator
    assert {Invoke, CallResult, Ack, Final} <= to_worker - to_coordinator
    assert {DeployRequest, StatusRequest, Register} <= to_coordinator - to_worker
    assert _members(wire.ToAdmin) == {AdminReply, wire.PushedReply, wire.SubscribeRefused, wire.EgressAcked}
    assert wire.SubscribeReplies in to_worker - to_coordinator
    assert wire.PushedRequest in to_worker - to_coordinator


@pytest.mark.parametrize("msg", ALL_MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip_each_message(msg: wire.Message) -> None:
    frame = encode_frame(Batch("src", [msg]))
    assert frame_length(frame[: wire.HEADER_BYTES]) == len(frame) - wire.HEADER_BYTES
    batch = decode_batch(frame[wire.HEADER_BYTES :], inbox_for(msg))
    assert batch.src == "src"
    assert len(batch.msgs) == 1
    out = batch.msgs[0]
    assert type(out) is type(msg)
    assert out == msg


@pytest.mark.parametrize("msg", ALL_MESSAGES, ids=lambda m: type(m).__name__)
def test_a_message_of_another_channel_is_a_protocol_error(msg: wire.Message) -> None:
    payload = encode_frame(Batch("src", [msg]))[4:]
    for inbox, union in INBOXES.items():
        if type(msg) not in _members(union):
            with pytest.raises(ProtocolError, match=f"for the {inbox} channel"):
                decode_batch(payload, inbox)  # type: ignore[arg-type]


def test_round_trip_one_batch_per_channel() -> None:
    for inbox, union in INBOXES.items():
        msgs = [m for m in ALL_MESSAGES if type(m) in _members(union)]
        batch = decode_batch(encode_frame(Batch("coordinator", msgs))[4:], inbox)  # type: ignore[arg-type]
        assert batch == Batch("coordinator", msgs)


def test_messages_too_many_for_one_frame_go_in_several_in_order() -> None:
    """What the transport and the SDK's pushed requests send (``encode_frames``)."""
    value = b"x" * (MAX_FRAME_BYTES // 5)
    msgs = [wire.PushedRequest(0, 0, i, 1, None, value) for i in range(12)]
    frames = wire.encode_frames("client-a", msgs, "inc")
    assert len(frames) > 1 and all(len(f) - wire.HEADER_BYTES <= MAX_FRAME_BYTES for f in frames)
    batches = [decode_batch(f[wire.HEADER_BYTES :], "worker") for f in frames]
    assert [m for b in batches for m in b.msgs] == msgs
    assert {(b.src, b.incarnation) for b in batches} == {("client-a", "inc")}
    assert wire.encode_frames("client-a", msgs[:1]) == [encode_frame(Batch("client-a", msgs[:1]))]
    with pytest.raises(ProtocolError):  # one message larger than any frame
        wire.encode_frames("client-a", [wire.PushedRequest(0, 0, 0, 1, None, value * 6)])


def test_codes_decode_as_enums() -> None:
    ack = next(m for m in ALL_MESSAGES if isinstance(m, Ack))
    assert isinstance(ack, Ack)
    out = decode_batch(encode_frame(Batch("w1", [ack]))[4:], "worker").msgs[0]
    assert isinstance(out, Ack)
    assert out.status is Status.ERROR and out.phase is Phase.OPTIMISTIC
    bad = msgspec.msgpack.encode(["w1", [["ack", 12, 9, 0, 1, 3, 99, "", [], 0]]])  # no status 99
    with pytest.raises(ProtocolError):
        decode_batch(bad, "worker")


def test_raw_payloads_survive_unchanged() -> None:
    inv = next(m for m in ALL_MESSAGES if isinstance(m, Invoke))
    assert isinstance(inv, Invoke)
    out = decode_batch(encode_frame(Batch("x", [inv]))[4:], "worker").msgs[0]
    assert isinstance(out, Invoke)
    assert decode_value(out.args) == [1, "two", {"three": 3.5}, None]


def test_int_and_str_keys_keep_their_type() -> None:
    for key in ("7", 7):
        inv = Invoke(0, 1, Phase.OPTIMISTIC, [], "a", "a", "acct", "f", key, RAW, 1, 1, False, 0, 0)
        out = decode_batch(encode_frame(Batch("x", [inv]))[4:], "worker").msgs[0]
        assert isinstance(out, Invoke)
        assert type(out.key) is type(key) and out.key == key


def test_kafka_payloads_round_trip() -> None:
    req = Request("r1", "acct", "deposit", "k1", RAW, 55)
    assert wire.request_decoder.decode(wire.request_encoder.encode(req)) == req
    entries: list[wire.BatchEntry] = [
        wire.Run(121, 2, 17, "r1"),
        wire.Run(124, 0, 3, "r2"),
        wire.Answered(1, 9, "r0"),
        wire.Waiting(0, 4, "r2"),
    ]
    entry = SeqLogEntry(3, "w1", 40, entries, 2, 42)
    out = wire.seqlog_decoder.decode(msgspec.msgpack.encode(entry))
    assert out == entry
    assert [type(e) for e in out.entries] == [wire.Run, wire.Run, wire.Answered, wire.Waiting]


@pytest.mark.parametrize("value", [5, [1, 2], "x", {"a": 1}, None, 2.5, [[], {}]])
def test_committed_reply_round_trips_its_result(value: object) -> None:
    # With ``result: Raw | None`` msgspec decodes only nil (github.com/jcrist/msgspec/issues/659), so
    # every committed reply with a value would fail to decode on the egress topic.
    reply = Reply(
        "r1", 9, 3, Phase.FALLBACK, ReplyStatus.COMMITTED, msgspec.Raw(encode_value(value)), None, None, 55
    )
    out = wire.reply_decoder.decode(msgspec.msgpack.encode(reply))
    assert out == reply
    assert out.status is ReplyStatus.COMMITTED and out.status == "committed"
    assert out.result is not None and decode_value(out.result) == value


def test_failed_reply_round_trips() -> None:
    reply = Reply(
        "r2",
        10,
        3,
        Phase.OPTIMISTIC,
        ReplyStatus.ABORTED,
        msgspec.Raw(encode_value(None)),
        "insufficient credit",
        "Abort",
        0,
    )
    out = wire.reply_decoder.decode(msgspec.msgpack.encode(reply))
    assert out == reply
    assert out.result is None or decode_value(out.result) is None


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never-used msgpack opcode
        b"garbage bytes, not msgpack at all",
        b"\x92\xa3src",  # truncated array
        msgspec.msgpack.encode({"src": "x", "msgs": []}),  # a map, not the array layout
        msgspec.msgpack.encode(["x", [["hb", "w1"]]]),  # Heartbeat missing a field
        msgspec.msgpack.encode(["x", [["hb", "w1", "not-an-int"]]]),
        msgspec.msgpack.encode(["x", [[]]]),
        msgspec.msgpack.encode([1, []]),
        msgspec.msgpack.encode(["x", "not-a-list"]),
    ],
)
def test_garbage_raises_protocol_error(payload: bytes) -> None:
    for inbox in INBOXES:
        with pytest.raises(ProtocolError):
            decode_batch(payload, inbox)  # type: ignore[arg-type]


DEEP_ARGS = encode_frame(
    Batch(
        "x",
        [
            Invoke(
                0,
                1,
                Phase.OPTIMISTIC,
                [],
                "a",
                "a",
                "acct",
                "f",
                "k",
                msgspec.Raw(b"\x91" * 200_000 + b"\xc0"),
                1,
                1,
                False,
                0,
                0,
            )
        ],
    )
)[4:]

ESCAPING = {
    # Batch(src=<2 invalid UTF-8 bytes>, msgs=[]) -> UnicodeDecodeError
    "invalid-utf8-src": b"\x92\xa2\xff\xfe\x90",
    # Heartbeat(node_id=<invalid UTF-8>, epoch=1) -> UnicodeDecodeError
    "invalid-utf8-field": b"\x92\xa1x\x91\x93\xa2hb\xa2\xff\xfe\x01",
    # an Invoke whose Raw args nest 200k arrays deep (a 200 KB frame) -> RecursionError
    "deep-nesting": DEEP_ARGS,
}


@pytest.mark.parametrize("payload", list(ESCAPING.values()), ids=list(ESCAPING))
def test_escaping_exceptions_are_protocol_errors(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_batch(payload, "worker")


def _decode_or_protocol_error(payload: bytes) -> None:
    """Any outcome but a non-ProtocolError exception is fine (the fuzz tests below rely on this)."""
    for inbox in INBOXES:
        with contextlib.suppress(ProtocolError):
            decode_batch(payload, inbox)  # type: ignore[arg-type]


def test_unknown_tag_raises_protocol_error() -> None:
    payload = msgspec.msgpack.encode(["x", [["no-such-tag", 1, 2, 3]]])
    with pytest.raises(ProtocolError, match="undecodable frame"):
        decode_batch(payload, "worker")
    # A known tag next to an unknown one does not let the batch through either.
    payload = msgspec.msgpack.encode(["x", [["hb", "w1", 1], ["pickle", b"\x80\x04"]]])
    with pytest.raises(ProtocolError):
        decode_batch(payload, "coordinator")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_protocol_error(payload: bytes) -> None:
    _decode_or_protocol_error(payload)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_mutated_valid_frames_never_raise_anything_else(data: st.DataObject) -> None:
    payload = bytearray(encode_frame(Batch("w1", ALL_MESSAGES))[4:])
    for _ in range(data.draw(st.integers(1, 5))):
        i = data.draw(st.integers(0, len(payload) - 1))
        payload[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    _decode_or_protocol_error(bytes(payload[:cut]))


def test_frame_length_limit() -> None:
    assert frame_length(struct.pack(">I", 0)) == 0
    assert frame_length(struct.pack(">I", MAX_FRAME_BYTES)) == MAX_FRAME_BYTES
    with pytest.raises(ProtocolError, match="frame"):
        frame_length(struct.pack(">I", MAX_FRAME_BYTES + 1))
    with pytest.raises(ProtocolError):
        frame_length(b"\xff\xff\xff\xff")


def test_encode_frame_refuses_oversized_batch() -> None:
    big = msgspec.Raw(encode_value(b"x" * (MAX_FRAME_BYTES + 10)))
    with pytest.raises(ProtocolError, match="MAX_FRAME_BYTES"):
        encode_frame(Batch("w1", [CallResult(0, 1, Phase.OPTIMISTIC, [], Status.OK, big, 0)]))


# ---- no pickle ------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["styx_py", "worker", "coordinator", "client"]  # styx_py's links to the others are not followed
FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "marshal", "shelve"}


def _code_names(path: Path) -> set[str]:
    """NAME tokens of a Python file: code only, not comments or docstrings."""
    with path.open("rb") as f:
        return {tok.string for tok in tokenize.tokenize(f.readline) if tok.type == tokenize.NAME}


def test_no_pickle_in_the_source_tree() -> None:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert any(p.parent.name == "wire" for p in files), "source tree not found"
    offenders = {}
    for path in files:
        names = _code_names(path)
        bad = {n for n in names if n in FORBIDDEN_MODULES or "pickle" in n.lower()}
        text = path.read_text()
        for mod in FORBIDDEN_MODULES:
            # Dynamic imports name the module in a string.
            if f'import_module("{mod}")' in text or f"import_module('{mod}')" in text:
                bad.add(mod)
            if f'__import__("{mod}")' in text or f"__import__('{mod}')" in text:
                bad.add(mod)
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


def test_pickle_detector_detects() -> None:
    src = b"import json\nimport pickle as p\n# pickle in a comment\n"
    names = {t.string for t in tokenize.tokenize(io.BytesIO(src).readline) if t.type == tokenize.NAME}
    assert "pickle" in names
    src = b'"""never pickle"""\nx = 1  # pickle\n'
    names = {t.string for t in tokenize.tokenize(io.BytesIO(src).readline) if t.type == tokenize.NAME}
    assert "pickle" not in names


_ARG = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@given(
    args=st.lists(_ARG, max_size=4),
    key=st.text(max_size=8) | st.integers(-(2**63), 2**63 - 1),
    ts_ms=st.integers(0, 2**63 - 1),
    reply_partition=st.integers(-1, 1000),
    reply_to=st.sampled_from(["", "client-0123456789abcdef0123"]),
)
def test_request_records_are_encoded_in_one_call_as_the_struct_would_be(
    args: list[object], key: str | int, ts_ms: int, reply_partition: int, reply_to: str
) -> None:
    """encode_request encodes a tuple (one encoder call): the very bytes of the Request struct."""
    from styx_py.core.requests import encode_request

    raw_args = msgspec.Raw(wire.encode_value(args))
    expected = wire.request_encoder.encode(
        wire.Request("rid", "op", "fn", key, raw_args, ts_ms, reply_partition, reply_to)
    )
    assert encode_request("rid", "op", "fn", key, tuple(args), ts_ms, reply_partition, reply_to) == expected
    assert encode_request("rid", "op", "fn", key, args, ts_ms, reply_partition, reply_to) == expected
    if reply_partition == -1 and not reply_to:
        assert encode_request("rid", "op", "fn", key, args, ts_ms) == expected


def test_requests_without_a_reply_partition_still_decode() -> None:
    """Records of clients from before reply routing (six fields) decode with no reply partition, and
    those from before pushed replies (seven) with no client to push to."""
    old = wire.request_encoder.encode(("rid", "op", "fn", "k", [1], 5))
    req = wire.request_decoder.decode(old)
    assert (req.request_id, req.ts_ms, req.reply_partition, req.reply_to) == ("rid", 5, -1, "")
    routed = wire.request_decoder.decode(wire.request_encoder.encode(("rid", "op", "fn", "k", [1], 5, 3)))
    assert (routed.reply_partition, routed.reply_to) == (3, "")
    pushed = wire.request_encoder.encode(("rid", "op", "fn", "k", [1], 5, 3, "client-c1"))
    assert wire.request_decoder.decode(pushed).reply_to == "client-c1"


def test_a_reply_decodes_its_result_on_demand() -> None:
    reply = wire.Reply("r", 1, 2, 0, "committed", msgspec.Raw(wire.encode_value({"a": [1, 2]})), None, None)
    assert reply.value == {"a": [1, 2]} and reply.committed
    failed = wire.Reply("r", 1, 2, 0, "failed", wire.NIL, "ValueError: no", "UserError")
    assert failed.value is None and not failed.committed
