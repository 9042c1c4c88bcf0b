"""One bad request gets a clear error reply and never stalls the cluster (DESIGN.md §4, last paragraph).

Every case runs in the in-process cluster: the bad request is answered with status "failed" (or
"aborted" for ``Abort``) and a helpful message, none of its writes are applied, and a normal request
submitted afterwards commits in a later epoch.

The limits of ``styx_py.core.limits`` are enforced by the worker on every ingress record, whatever
produced it: here records are put on the ingress log as raw bytes (what a Kafka producer that
bypasses the SDK and the gateway can send); the same records go through a real cluster on Tansu in
the last test. The SDK's and the gateway's own checks are in test_client.py and test_gateway.py.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from styx_py.core.limits import MAX_REQUEST_BYTES, MAX_REQUEST_ID_CHARS
from styx_py.core.partitioning import partition_of
from styx_py.core.requests import BadRecord, nests_deeper, read_request
from styx_py.core.wire import Reply, Request, decode_value, encode_value, reply_decoder, request_encoder
from styx_py.stack.local import LocalStack
from styx_py.testing.cluster import SimCluster
from tests.apps.limits import nested
from tests.service_fixtures import ClusterFactory

ORACLE = "tests.apps.oracle:app"
BAD = "tests.apps.bad:app"
BANK = "styx_benchmarks.bank:app"
LIMITS = "tests.apps.limits:app"


async def run_one(c: SimCluster, operator: str, function: str, key: Any, *args: Any) -> Reply:
    rid = c.submit(operator, function, key, *args)
    await c.wait(timeout_s=10)
    replies = [r for r in c.replies if r.request_id == rid]
    assert len(replies) == 1, replies
    return replies[0]


def result(reply: Reply) -> Any:
    assert reply.status == "committed", (reply.status, reply.error_type, reply.error)
    assert reply.result is not None
    return decode_value(reply.result)


def assert_error(reply: Reply, status: str, error_type: str, *fragments: str) -> None:
    assert (reply.status, reply.error_type) == (status, error_type), reply
    assert reply.result is None or decode_value(reply.result) is None
    assert reply.error
    for fragment in fragments:
        assert fragment in reply.error, (fragment, reply.error)


async def assert_next_epoch_commits(
    c: SimCluster, operator: str, function: str, key: Any, expect: Any
) -> None:
    epoch_before = max(r.epoch for r in c.replies)
    reply = await run_one(c, operator, function, key, 5)
    assert result(reply) == expect
    assert reply.epoch > epoch_before


# ---- the oracle app: routing and argument errors -------------------------------------------------

ORACLE_CASES = [
    pytest.param(
        ("nope", "deposit", "k1", 5),
        "failed",
        "BadRequest",
        ["unknown operator 'nope'"],
        id="unknown-operator",
    ),
    pytest.param(
        ("acct", "nothere", "k1", 5),
        "failed",
        "BadRequest",
        ["unknown function acct.nothere"],
        id="unknown-function",
    ),
    pytest.param(
        ("acct", "deposit", "k1"),
        "failed",
        "BadRequest",
        ["wrong arguments for deposit", "amount"],
        id="too-few-args",
    ),
    pytest.param(
        ("acct", "deposit", "k1", 5, 6),
        "failed",
        "BadRequest",
        ["wrong arguments for deposit"],
        id="too-many-args",
    ),
    pytest.param(
        ("acct", "deposit", "k1", "five"), "failed", "UserError", ["TypeError"], id="wrong-arg-type"
    ),
    pytest.param(
        ("acct", "boom", "k1", 0), "failed", "UserError", ["ValueError: boom at 0"], id="value-error"
    ),
    pytest.param(
        ("acct", "transfer", "k1", "k2", 10), "aborted", "Abort", ["insufficient credit in k1"], id="abort"
    ),
]


@pytest.mark.parametrize(("call", "status", "error_type", "fragments"), ORACLE_CASES)
async def test_oracle_bad_request(
    call: tuple[Any, ...], status: str, error_type: str, fragments: list[str]
) -> None:
    async with SimCluster(ORACLE, workers=3, seed=1) as c:
        reply = await run_one(c, *call)
        assert_error(reply, status, error_type, *fragments)
        assert c.state() == {}, "a failed transaction wrote state"
        await assert_next_epoch_commits(c, "acct", "deposit", "k1", 5)
        await assert_next_epoch_commits(c, "acct", "deposit", "k1", 10)
        assert c.state() == {("acct", "k1"): 10}


async def test_bank_abort_message_reaches_client() -> None:
    async with SimCluster(BANK, workers=2, seed=3) as c:
        assert result(await run_one(c, "account", "deposit", "alice", 30)) == 30
        reply = await run_one(c, "account", "transfer", "alice", "bob", 50)
        assert_error(reply, "aborted", "Abort", "insufficient credit in alice: 30 < 50")
        assert c.state() == {("account", "alice"): 30}
        await assert_next_epoch_commits(c, "account", "deposit", "alice", 35)


# ---- the bad app: misbehaving user code ----------------------------------------------------------

BAD_CASES = [
    pytest.param("explode", "failed", "UserError", ["ValueError", "explode: cannot handle k"], id="raises"),
    pytest.param(
        "unencodable_result",
        "failed",
        "UserError",
        ["thing.unencodable_result", "cannot be encoded"],
        id="unencodable-result",
    ),
    pytest.param("unencodable_state", "failed", "UserError", ["TypeError"], id="unencodable-state"),
    pytest.param(
        "call_unknown_function",
        "failed",
        "BadRequest",
        ["unknown function other.nothere"],
        id="async-call-unknown-function",
    ),
    pytest.param(
        "call_unknown_function_sync",
        "failed",
        "BadRequest",
        ["unknown function other.nothere"],
        id="sync-call-unknown-function",
    ),
    pytest.param(
        "call_unknown_operator",
        "failed",
        "BadRequest",
        ["unknown function ghost.touch"],
        id="call-unknown-operator",
    ),
    pytest.param("call_with_float_key", "failed", None, ["str or int", "float"], id="call-with-float-key"),
    pytest.param(
        "call_failing", "failed", "UserError", ["KeyError", "inner failure at k"], id="callee-raises"
    ),
    pytest.param(
        "swallow_failure", "failed", "UserError", ["inner failure at k"], id="callee-failure-not-swallowed"
    ),
    pytest.param("abort_downstream", "aborted", "Abort", ["refused by k"], id="abort-in-async-callee"),
]


@pytest.mark.parametrize(("function", "status", "error_type", "fragments"), BAD_CASES)
async def test_misbehaving_function(
    function: str, status: str, error_type: str | None, fragments: list[str]
) -> None:
    async with SimCluster(BAD, workers=3, seed=2) as c:
        reply = await run_one(c, "thing", function, "k")
        if error_type is None:  # see test_call_with_float_key_is_a_bad_request
            assert reply.error_type in ("BadRequest", "UserError")
            error_type = reply.error_type
        assert_error(reply, status, error_type, *fragments)
        assert c.state() == {}, "a failed transaction wrote state (its own or a callee's)"
        # The well-behaved function on the same entity: 5, not 1005 (the bad put was discarded).
        await assert_next_epoch_commits(c, "thing", "add", "k", 5)
        assert c.state() == {("thing", "k"): 5}


async def test_call_with_float_key_is_a_bad_request() -> None:
    async with SimCluster(BAD, workers=2, seed=2) as c:
        reply = await run_one(c, "thing", "call_with_float_key", "k")
        assert reply.error_type == "BadRequest"


async def test_many_bad_requests_in_one_epoch_with_good_ones() -> None:
    async with SimCluster(BAD, workers=3, seed=4, epoch_size_max=1000) as c:
        good = [c.submit("thing", "add", f"g{i}", i) for i in range(10)]
        bad = [
            c.submit("thing", fn, f"b{i}")
            for i, fn in enumerate(
                ["explode", "unencodable_result", "call_unknown_function", "call_failing", "abort_downstream"]
                * 3
            )
        ]
        unknown = c.submit("nope", "x", "k")
        await c.wait(timeout_s=10)
        by_id = {r.request_id: r for r in c.replies}
        assert len(by_id) == len(c.replies) == 26
        for i, rid in enumerate(good):
            assert result(by_id[rid]) == i
        assert all(by_id[rid].status in ("failed", "aborted") for rid in bad)
        assert by_id[unknown].error_type == "BadRequest"
        assert c.state() == {("thing", f"g{i}"): i for i in range(10)}
        await assert_next_epoch_commits(c, "thing", "add", "g1", 6)


# ---- keys of the wrong type -----------------------------------------------------------------------


async def test_submit_rejects_wrong_key_types_before_the_log() -> None:
    async with SimCluster(ORACLE, workers=2, seed=1) as c:
        for key in (1.5, True, None, b"k"):
            with pytest.raises(TypeError, match="str or int"):
                c.submit("acct", "deposit", key, 5)
        assert c.log.records(c.config.ingress_topic) == []


async def test_rejected_submit_leaves_no_phantom_request() -> None:
    async with SimCluster(ORACLE, workers=2, seed=1) as c:
        with pytest.raises(TypeError):
            c.submit("acct", "deposit", 1.5, 5)
        assert c.requests == {}


def _append_raw(c: SimCluster, rid: str, partition: int, key: Any, args: bytes) -> None:
    """Put a request on the ingress log directly, bypassing SimCluster.submit's checks."""
    req = Request(rid, "acct", "deposit", key, msgspec.Raw(args), len(c.requests))
    c.requests[rid] = req
    c.submissions[rid] += 1
    c.log.append(c.config.ingress_topic, partition, req)


@pytest.mark.parametrize(
    ("key", "partition", "args", "fragments"),
    [
        pytest.param(1.5, 0, encode_value([5]), ["`int | str`, got `float`", "the key"], id="float-key"),
        pytest.param(True, 0, encode_value([5]), ["`int | str`, got `bool`", "the key"], id="bool-key"),
        pytest.param(
            "k1",
            (partition_of("k1", 8) + 1) % 8,
            encode_value([5]),
            ["ingress partition"],
            id="wrong-partition",
        ),
        pytest.param(
            "k1",
            partition_of("k1", 8),
            encode_value({"amount": 5}),
            ["arguments must be a list"],
            id="args-not-a-list",
        ),
    ],
)
async def test_malformed_ingress_record(key: Any, partition: int, args: bytes, fragments: list[str]) -> None:
    async with SimCluster(ORACLE, workers=3, seed=5) as c:
        _append_raw(c, "raw-1", partition, key, args)
        await c.wait(timeout_s=10)
        [reply] = c.replies
        assert reply.request_id == "raw-1"
        assert_error(reply, "failed", "BadRequest", *fragments)
        assert c.state() == {}
        await assert_next_epoch_commits(c, "acct", "deposit", "k1", 5)


# ---- deterministic randomness ---------------------------------------------------------------------

LUCKY_KEYS = [f"k{i}" for i in range(12)]


async def lucky_run(seed: int) -> tuple[dict[int, list[Any]], dict[Any, Any], dict[str, Request]]:
    async with SimCluster(ORACLE, workers=3, seed=seed, epoch_size_max=5) as c:
        for k in LUCKY_KEYS:
            c.submit("acct", "lucky", k)
        await c.wait(timeout_s=10)
        by_tid = {}
        for r in c.replies:
            assert r.tid not in by_tid
            by_tid[r.tid] = [r.request_id, *result(r)]
        return by_tid, c.state(), dict(c.requests)


async def test_lucky_is_deterministic_per_tid() -> None:
    a, state_a, requests = await lucky_run(21)
    b, state_b, _ = await lucky_run(21)
    assert a == b, "same seed, same tids: ctx.random()/uuid()/now() must give the same values"
    assert state_a == state_b
    assert len(a) == len(LUCKY_KEYS)

    values = [v[1] for v in a.values()]
    uuids = [v[2] for v in a.values()]
    assert all(isinstance(r, float) and 0.0 <= r < 1.0 for r in values)
    assert len(set(values)) == len(values), "different tids drew the same random value"
    assert len(set(uuids)) == len(uuids)
    for u in uuids:
        assert uuid.UUID(u).version == 4
    for rid, r, _u, now in a.values():
        assert now == requests[rid].ts_ms / 1000, "ctx.now() is the sequenced request timestamp"
        assert state_a[("acct", requests[rid].key)] == int(r * 1000)

    # The values are a function of the tid alone, not of the run's message interleaving.
    c, _, _ = await lucky_run(22)
    common = set(a) & set(c)
    assert common
    for tid in common:
        assert a[tid][1:3] == c[tid][1:3]


# ---- the limits, enforced by the worker whatever produced the record -----------------------------


def record(rid: Any, operator: Any, function: Any, key: Any, args: bytes, ts_ms: int = 0) -> bytes:
    """A request record's bytes, fields unchecked (msgspec encodes a Struct without validating it)."""
    return request_encoder.encode(Request(rid, operator, function, key, msgspec.Raw(args), ts_ms))


def deep_args(levels: int) -> bytes:
    """An argument list holding one argument nested ``levels`` deep, built as bytes: msgspec cannot
    encode (or decode) a value nested 100 000 levels deep."""
    return b"\x91" * (levels + 1) + b"\x01"


def sized_record(rid: str, key: str, total: int) -> bytes:
    """A ``box.keep`` request of exactly ``total`` bytes (its argument a string of the right length)."""
    base = record(rid, "box", "keep", key, encode_value(["x" * 70_000]))
    value = record(rid, "box", "keep", key, encode_value(["x" * (70_000 + total - len(base))]))
    assert len(value) == total
    return value


def append_record(c: SimCluster, value: bytes, *, key: bytes | None, partition: int = 0) -> None:
    """Put raw bytes on the ingress log (the Kafka record's value and key), bypassing every client."""
    c.log.append(c.config.ingress_topic, partition, (key, value))
    if key is not None:
        c.submissions[key.decode()] += 1  # answered: the record key names the request


BOX = partition_of("k1", 4)
ID = b"bad-1"

LIMIT_CASES = [
    pytest.param(
        record("bad-1", "box", "keep", "k" * 1025, encode_value([1])),
        ["1025 characters", "limit of 1024", "MAX_KEY_CHARS"],
        id="key-1025-chars",
    ),
    pytest.param(
        record("bad-1", "box", "keep", "k" * 5000, encode_value([1])),
        ["5000 characters", "MAX_KEY_CHARS"],
        id="key-5000-chars",
    ),
    pytest.param(
        record("bad-1", "b" * 257, "keep", "k1", encode_value([1])),
        ["operator name", "1..256", "MAX_NAME_CHARS"],
        id="operator-name-257-chars",
    ),
    pytest.param(
        record("bad-1", "box", "f" * 257, "k1", encode_value([1])),
        ["function name", "MAX_NAME_CHARS"],
        id="function-name-257-chars",
    ),
    pytest.param(
        record("bad-1", "box", "keep", "k1", encode_value([nested(65)])),
        ["nest deeper than 64 levels", "MAX_ARG_DEPTH"],
        id="args-65-deep",
    ),
    pytest.param(
        record("bad-1", "box", "keep", "k1", deep_args(990)),
        ["MAX_ARG_DEPTH"],
        id="args-990-deep",
    ),
    pytest.param(
        record("bad-1", "box", "keep", "k1", deep_args(100_000)),
        ["MAX_ARG_DEPTH"],
        id="args-100k-deep",
    ),
    pytest.param(
        sized_record("bad-1", "k1", MAX_REQUEST_BYTES + 1),
        [f"{MAX_REQUEST_BYTES + 1} bytes", "MAX_REQUEST_BYTES"],
        id="request-1MiB-plus-1",
    ),
    pytest.param(
        sized_record("bad-1", "k1", 12_000_000),
        ["12000000 bytes", "MAX_REQUEST_BYTES"],
        id="request-12MB",
    ),
    pytest.param(
        msgspec.msgpack.encode(["bad-1", 5, "keep", "k1", [1], 0]),
        ["not a valid request", "the operator"],
        id="operator-not-a-str",
    ),
    pytest.param(
        record("bad-1", "box", "keep", "k1", encode_value([1]))[:-4],
        ["not a valid request", "truncated"],
        id="truncated",
    ),
    pytest.param(b"\xc1 not msgpack", ["not a valid request"], id="not-msgpack"),
]


@pytest.mark.parametrize(("value", "fragments"), LIMIT_CASES)
async def test_a_record_over_a_limit_is_answered_with_bad_request(value: bytes, fragments: list[str]) -> None:
    async with SimCluster(LIMITS, workers=3, seed=7) as c:
        append_record(c, value, key=ID, partition=BOX)
        await c.wait(timeout_s=10)
        [reply] = c.replies
        assert reply.request_id == "bad-1"
        assert_error(reply, "failed", "BadRequest", *fragments)
        assert c.state() == {}
        assert result(await run_one(c, "box", "count", "k1", 5)) == 5
        assert c.state() == {("box", "k1"): 5}


async def test_the_request_id_is_read_from_the_record_when_it_has_no_key() -> None:
    """A raw producer that sets no Kafka key still gets its answer: the id leads the record."""
    async with SimCluster(LIMITS, workers=2, seed=7) as c:
        c.log.append(c.config.ingress_topic, BOX, record("bad-2", "box", "keep", "k" * 2000, b"\x90"))
        c.log.append(c.config.ingress_topic, BOX, record("bad-3", "box", "keep", "k1", deep_args(5000)))
        c.submissions.update(["bad-2", "bad-3"])
        await c.wait(timeout_s=10)
        by_id = {r.request_id: r for r in c.replies}
        assert_error(by_id["bad-2"], "failed", "BadRequest", "MAX_KEY_CHARS")
        assert_error(by_id["bad-3"], "failed", "BadRequest", "MAX_ARG_DEPTH")


async def test_requests_at_the_limits_run() -> None:
    async with SimCluster(LIMITS, workers=3, seed=8) as c:
        longest_key, longest_id = "k" * 1024, "i" * MAX_REQUEST_ID_CHARS
        c.log.append(c.config.ingress_topic, BOX, sized_record("big", "k1", MAX_REQUEST_BYTES))
        c.submissions["big"] += 1
        deep = c.submit("box", "keep", "k2", nested(64))
        long_key = c.submit("box", "keep", longest_key, 1)
        long_id = c.submit("box", "keep", "k3", 3, request_id=longest_id)
        await c.wait(timeout_s=10)
        by_id = {r.request_id: r for r in c.replies}
        for rid in ("big", deep, long_key, long_id):
            assert result(by_id[rid]) == "kept", rid
        state = c.state()
        assert state[("box", "k2")] == nested(64)
        assert state[("box", longest_key)] == 1
        assert MAX_REQUEST_BYTES - 100 < len(state[("box", "k1")]) < MAX_REQUEST_BYTES


async def test_records_without_a_usable_request_id_are_skipped_and_counted() -> None:
    async with SimCluster(LIMITS, workers=3, seed=9) as c:
        ingress = c.config.ingress_topic
        c.log.append(ingress, BOX, b"\x01\x02 no key, not a request")
        c.log.append(ingress, BOX, (b"\xff\xfe", b"a key that is not UTF-8"))
        c.log.append(ingress, BOX, record("", "box", "keep", "k1", encode_value([1])))
        c.log.append(ingress, BOX, record("i" * (MAX_REQUEST_ID_CHARS + 1), "box", "keep", "k1", b"\x91\x01"))
        assert result(await run_one(c, "box", "count", "k1", 5)) == 5
        assert [r.request_id for r in c.replies] == ["r0"]
        assert sum(w.ports.ingress.skipped for w in c.workers) == 4  # type: ignore[attr-defined]
        assert c.state() == {("box", "k1"): 5}


@pytest.mark.parametrize(
    ("depth", "fragment"),
    [pytest.param(65, "MAX_ARG_DEPTH", id="65"), pytest.param(5000, "MAX_ARG_DEPTH", id="5000")],
)
async def test_call_arguments_nested_too_deep_are_a_bad_request(depth: int, fragment: str) -> None:
    """The same limit for a function's calls: a BadRequest, never a RecursionError whose depth would
    depend on the stack of the run (and differ in its replay)."""
    async with SimCluster(LIMITS, workers=3, seed=10) as c:
        assert result(await run_one(c, "box", "forward", "a", 64)) == "forwarded"
        reply = await run_one(c, "box", "forward", "b", depth)
        assert_error(reply, "failed", "BadRequest", fragment)
        assert c.state() == {("box", "a"): "forwarded", ("box", "a-next"): nested(64)}


BAD_RECORDS = [
    (b"bad-key", record("bad-key", "box", "keep", "k" * 5000, encode_value([1]))),
    (b"bad-deep", record("bad-deep", "box", "keep", "k1", deep_args(50_000))),
    (b"bad-size", sized_record("bad-size", "k1", MAX_REQUEST_BYTES + 1)),
    (b"bad-bytes", b"\xc1 not msgpack"),
    (b"bad-name", record("bad-name", "box", "f" * 300, "k1", encode_value([1]))),
]


async def bad_and_good(seed: int) -> tuple[str, list[Reply]]:
    """Bad records between good requests, one resent; a worker crash makes every epoch replay."""
    async with SimCluster(LIMITS, workers=3, seed=seed, epoch_size_max=3, snapshot_interval_epochs=0) as c:
        for i, (key, value) in enumerate(BAD_RECORDS):
            c.submit("box", "count", f"g{i}", i)
            append_record(c, value, key=key, partition=i % 4)
        await c.wait(timeout_s=30)
        append_record(c, BAD_RECORDS[0][1], key=BAD_RECORDS[0][0], partition=0)  # resent, as a client would
        await c.wait(timeout_s=30)
        c.crash("w2")  # recovery replays every epoch from the start of the logs
        c.submit("box", "count", "g0", 100)
        await c.wait(timeout_s=60)
        assert c.coordinator.status()["state"] != "degraded", c.coordinator.status()
        assert not c.sent.duplicate_replies(), "a bad record was answered differently"
        for key, _ in BAD_RECORDS:
            replies = [r for r in c.replies if r.request_id == key.decode()]
            assert replies and all(r == replies[0] for r in replies)
            assert_error(replies[0], "failed", "BadRequest")
        assert c.state()[("box", "g0")] == 100
        return c.fingerprint(), c.replies


async def test_bad_records_replay_identically_and_deterministically() -> None:
    first, replies = await bad_and_good(seed=11)
    second, _ = await bad_and_good(seed=11)
    assert first == second, "the same seed gave other replies or state"
    assert len([r for r in replies if r.request_id == "bad-key"]) == 2  # sent twice, answered twice


# ---- the nesting verdict: exact, and a pure function of the bytes ------------------------------------


def depth_of(value: Any) -> int:
    if isinstance(value, list | tuple):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in [*value.keys(), *value.values()]), default=0)
    return 0


INTS = st.integers(-(2**63), 2**64 - 1)
VALUES = st.recursive(
    st.none() | st.booleans() | INTS | st.floats() | st.text(max_size=4) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(INTS | st.text(max_size=3), inner),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(value=VALUES, limit=st.integers(0, 8), cut=st.integers(0, 100))
def test_nesting_is_measured_exactly_and_cut_bytes_never_crash(value: Any, limit: int, cut: int) -> None:
    data = encode_value(value)
    assert nests_deeper(data, limit) == (depth_of(value) > limit)
    nests_deeper(data[: len(data) * cut // 100], limit)  # malformed: the iterative scan, no error
    nests_deeper(bytes(b ^ 0x5A for b in data), limit)


def test_the_verdict_on_a_record_does_not_depend_on_the_stack() -> None:
    """msgspec's RecursionError depends on how deep the caller's stack is; the worker's verdict must
    not (the replay of an epoch reads its records from another call stack)."""
    records = [record("r", "box", "keep", "k1", deep_args(n)) for n in (63, 64, 65, 300, 800, 950, 990, 5000)]
    records += [r[:-2] for r in records]  # deep and truncated
    records.append(b"\x92" + b"\x91" * 900 + b"\xc1")  # deep, then not msgpack

    def verdict(value: bytes) -> str:
        req = read_request(value, b"r")
        if isinstance(req, str):
            return f"skipped: {req}"
        return f"bad: {req.problem}" if isinstance(req, BadRecord) else f"runs: {bytes(req.args)!r}"

    def at_depth(frames: int, value: bytes) -> str:
        return verdict(value) if frames == 0 else at_depth(frames - 1, value)

    expected = [verdict(r) for r in records]
    assert [v.split(":")[0] for v in expected[:8]] == ["runs", "runs"] + ["bad"] * 6
    assert all("MAX_ARG_DEPTH" in v for v in expected[2:8])
    for frames in range(0, sys.getrecursionlimit() - 250, 50):
        assert [at_depth(frames, r) for r in records] == expected, frames


# ---- the same records on a real cluster: a raw Kafka producer, bypassing the SDK and the gateway ----


async def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=16 * 1024 * 1024)
    await producer.start()
    try:
        for partition, key, value in records:
            await producer.send_and_wait(topic, value, key=key, partition=partition)
    finally:
        await producer.stop()


async def replies_for(bootstrap: str, topic: str, request_ids: set[str]) -> dict[str, Reply]:
    """The replies to ``request_ids`` on the egress topic, read from its start until all are there."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, fetch_max_wait_ms=10
    )
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic)
        while not parts:
            await consumer.force_metadata_update()
            parts = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        found: dict[str, Reply] = {}
        async with asyncio.timeout(120):
            while not request_ids <= set(found):
                for recs in (await consumer.getmany(timeout_ms=200)).values():
                    for rec in recs:
                        reply = reply_decoder.decode(rec.value)
                        found.setdefault(reply.request_id, reply)
        return found
    finally:
        await consumer.stop()


@pytest.fixture
def limits_stack(local_cluster: ClusterFactory) -> LocalStack:
    return local_cluster(app=LIMITS)


@pytest.mark.services
@pytest.mark.timeout(240)
async def test_raw_kafka_records_over_the_limits_get_their_error_reply(limits_stack: LocalStack) -> None:
    stack = limits_stack
    ingress, egress = stack.env["STYX_INGRESS_TOPIC"], stack.env["STYX_EGRESS_TOPIC"]
    bad = {
        "raw-key": (record("raw-key", "box", "keep", "k" * 5000, encode_value([1])), "MAX_KEY_CHARS"),
        "raw-deep": (record("raw-deep", "box", "keep", "k1", deep_args(990)), "MAX_ARG_DEPTH"),
        "raw-deeper": (record("raw-deeper", "box", "keep", "k1", deep_args(100_000)), "MAX_ARG_DEPTH"),
        "raw-12MB": (sized_record("raw-12MB", "k1", 12_000_000), "MAX_REQUEST_BYTES"),
        "raw-name": (record("raw-name", "b" * 300, "keep", "k1", encode_value([1])), "MAX_NAME_CHARS"),
        "raw-bytes": (b"\xc1 not a request", "not a valid request"),
    }
    records: list[tuple[int, bytes | None, bytes]] = [(BOX, rid.encode(), v) for rid, (v, _) in bad.items()]
    records.append((BOX, None, b"\xc1 no key, nothing to answer: skipped"))
    records.append((BOX, b"raw-good", record("raw-good", "box", "count", "k1", encode_value([5]))))
    await produce(stack.kafka, ingress, records)

    replies = await replies_for(stack.kafka, egress, {*bad, "raw-good"})
    for rid, (_, fragment) in bad.items():
        assert_error(replies[rid], "failed", "BadRequest", fragment)
    good = replies["raw-good"]
    assert (good.status, decode_value(good.result)) == ("committed", 5), good
