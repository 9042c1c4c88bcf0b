"""One bad request gets a clear error reply and never stalls the cluster (DESIGN.md §4, last paragraph).

Every case runs in the in-process cluster: the bad request is answered with status "failed" (or
"aborted" for ``Abort``) and a helpful message, none of its writes are applied, and a normal request
submitted afterwards commits in a later epoch.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest

from styx_py.core.partitioning import partition_of
from styx_py.core.wire import Reply, Request, decode_value, encode_value
from styx_py.testing.cluster import SimCluster

ORACLE = "tests.apps.oracle:app"
BAD = "tests.apps.bad:app"
BANK = "styx_py.benchmarks.bank:app"


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
        pytest.param(1.5, 0, encode_value([5]), ["str or int", "float"], id="float-key"),
        pytest.param(True, 0, encode_value([5]), ["str or int", "bool"], id="bool-key"),
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
