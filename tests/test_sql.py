"""``styx sql`` on a real bank run: Tansu, SeaweedFS, a coordinator and two workers, the changelog on.

One run per module (20 accounts of 100, then two waves of 60 transfers, each wave followed by reads
until a snapshot covers it; a snapshot every 25 epochs, never compacted), on the session's Spark.
The operator table ``account`` at the newest snapshot sums to the conserved total; as of older epochs
(before the first snapshot: the changelog alone; at a snapshot epoch: the chain alone; between two
snapshots: the chain and the changelog on top) it equals the serial execution of the replies up to
that epoch; the log tables count what the topics hold; each error names its case.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import pytest

pytest.importorskip("pyspark")

from styx_client import StyxClient
from styx_py import cli
from styx_py.audit.asof import chain_epochs
from styx_py.audit.options import S3Options
from styx_py.audit.snapshot_source import META_KEY, load_manifest
from styx_py.audit.sql import (
    AsOfUnavailable,
    ChangelogDisabled,
    SqlSources,
    SqlSyntaxError,
    UnknownTable,
    query,
)
from styx_py.core.blobs import delta_key, manifest_key
from styx_py.core.partitioning import Key
from styx_py.core.serial import serial_replay
from styx_py.core.wire import (
    ClusterMeta,
    Manifest,
    PartitionSnapshot,
    Reply,
    Request,
    decode_value,
    encode_value,
)
from styx_py.stack.local import LocalStack
from styx_py.stack.services import SeaweedS3, TansuBroker
from tests.service_fixtures import start_cluster
from tests.test_audit import read_until_snapshot
from tests.test_integration import read_values, reply_decoder, request_decoder

pytestmark = [pytest.mark.services, pytest.mark.slow]

ACCOUNTS = 20
INITIAL = 100
WAVES = 2
TRANSFERS = 60  # per wave


@dataclass(frozen=True)
class BankRun:
    sources: SqlSources
    requests: dict[str, Request]
    replies: list[Reply]  # one per request id
    chain: list[int]  # the snapshot epochs the bucket rebuilds
    snapshot: int  # the newest snapshot's epoch

    def serial_state(self, epoch: int) -> dict[Key, Any]:
        """The accounts as the serial execution of the replies of epochs <= ``epoch`` leaves them."""
        replies = [r for r in self.replies if r.epoch <= epoch]
        state, _ = asyncio.run(serial_replay(_bank(), self.requests, replies))
        return {k: v for (op, k), v in state.items() if op == "account"}

    def commit_epochs(self) -> list[int]:
        return sorted({r.epoch for r in self.replies if r.status == "committed"})


def _bank() -> Any:
    from styx_benchmarks.bank import app

    return app


async def drive(stack: LocalStack) -> None:
    rng = random.Random(45)
    async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
        keys = [f"a{i}" for i in range(ACCOUNTS)]
        await client.submit("account", "loader", "open_accounts", keys, INITIAL, request_id=uuid.uuid4().hex)
        window = asyncio.Semaphore(40)

        async def transfer() -> None:
            src, dst = rng.sample(keys, 2)
            async with window:  # some overdraw: aborted for insufficient credit
                await client.submit(
                    "account", src, "transfer", dst, rng.randint(1, 60), request_id=uuid.uuid4().hex
                )

        for _ in range(WAVES):
            await asyncio.gather(*(transfer() for _ in range(TRANSFERS)))
            await read_until_snapshot(stack, client, [])


@pytest.fixture(scope="module")
def bank(kafka: TansuBroker, s3: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BankRun]:
    settings = {"snapshot_interval_epochs": "25", "snapshot_compact_after": "1000"}
    tmp = tmp_path_factory.mktemp("sql-bank")
    with start_cluster(tmp, kafka, s3=s3, app="styx_benchmarks.bank:app", settings=settings) as stack:
        asyncio.run(drive(stack))
        env = stack.env
    c = s3.config
    s3o = S3Options(c.endpoint, c.access_key, c.secret_key, env["STYX_SNAPSHOT_BUCKET"], c.region)
    sources = SqlSources(
        kafka=kafka.bootstrap,
        s3=s3o,
        ingress_topic=env["STYX_INGRESS_TOPIC"],
        egress_topic=env["STYX_EGRESS_TOPIC"],
        seqlog_topic=env["STYX_SEQLOG_TOPIC"],
        changelog_topic=env["STYX_CHANGELOG_TOPIC"],
    )
    requests = {
        r.request_id: r
        for r in map(request_decoder.decode, asyncio.run(read_values(kafka.bootstrap, sources.ingress_topic)))
    }
    replies: dict[str, Reply] = {}
    for value in asyncio.run(read_values(kafka.bootstrap, sources.egress_topic)):
        reply = reply_decoder.decode(value)
        replies.setdefault(reply.request_id, reply)
    manifest = load_manifest(s3o.client(), s3o.bucket)
    assert manifest is not None
    yield BankRun(sources, requests, list(replies.values()), chain_epochs(manifest.deltas), manifest.epoch)


def balances(result: Any) -> dict[Key, Any]:
    return {row["key"]: row["value"] for row in result.rows}


def test_the_accounts_sum_to_the_conserved_total(
    bank: BankRun, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    src = bank.sources
    s3 = src.s3
    assert s3 is not None
    argv = ["sql", "SELECT count(*), sum(value) FROM account"]
    argv += ["--kafka", src.kafka, "--s3-endpoint", s3.endpoint, "--bucket", s3.bucket]
    argv += ["--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key, "--json"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [{"count(1)": ACCOUNTS, "sum(value)": ACCOUNTS * INITIAL}]
    assert (
        "starting Spark" in err and f"the state as of epoch {bank.snapshot}: snapshot {bank.snapshot}" in err
    )


def test_as_of_an_epoch_is_the_serial_state_of_that_epoch(bank: BankRun, spark: Any) -> None:
    chain, commits = bank.chain, bank.commit_epochs()
    assert len(chain) >= WAVES, chain
    before = commits[0]  # the load
    assert before < chain[0], (before, chain)
    between = max(e for e in commits if chain[0] < e < bank.snapshot and e not in chain)
    at = max(s for s in chain if s < between)
    cases = {
        before: "the changelog's records of epochs 0..",
        at: f"snapshot {at}",
        between: f"snapshot {at}, then the changelog's records of epochs {at + 1}..{between}",
    }
    for epoch, path in cases.items():
        result = query("SELECT key, value FROM account", bank.sources, as_of_epoch=epoch, spark=spark)
        assert result.state is not None and result.state.epoch == epoch
        assert path in result.state.describe(), (epoch, result.state.describe())
        want = bank.serial_state(epoch)
        assert balances(result) == want, f"as of epoch {epoch} ({result.state.describe()})"
        assert sum(want.values()) == ACCOUNTS * INITIAL


def test_the_log_tables(bank: BankRun, spark: Any) -> None:
    sql = (  # a one-row aggregate per table, joined: no scalar subquery, each a Spark job of its own
        "SELECT * FROM (SELECT count(DISTINCT request_id) AS requests, "
        "first(args) FILTER (WHERE function = 'transfer') AS args FROM requests) "
        "CROSS JOIN (SELECT count(DISTINCT request_id) FILTER (WHERE status = 'committed') AS committed, "
        "max(try_cast(result AS BIGINT)) FILTER (WHERE status = 'committed') AS most FROM replies) "
        "CROSS JOIN (SELECT count(*) AS epochs, max(epoch) AS newest FROM epochs) "
        "CROSS JOIN (SELECT count(DISTINCT request_id) AS overdrawn FROM aborts WHERE operator = 'account' "
        "AND cause LIKE 'insufficient credit%')"
    )
    result = query(sql, bank.sources, spark=spark)
    assert result.state is None and sorted(result.tables) == ["aborts", "epochs", "replies", "requests"]
    (row,) = result.rows
    committed = [r for r in bank.replies if r.status == "committed"]
    aborted = [r for r in bank.replies if r.status == "aborted" and "insufficient credit" in (r.error or "")]
    assert row["requests"] == len(bank.requests) and row["committed"] == len(committed)
    assert row["overdrawn"] == len(aborted) > 0
    assert row["newest"] >= max(r.epoch for r in bank.replies)
    assert row["epochs"] >= len({r.epoch for r in bank.replies})
    dst, amount = json.loads(row["args"])  # a transfer's arguments as JSON text
    assert dst.startswith("a") and 1 <= amount <= 60
    assert row["most"] == max(
        decode_value(r.result) for r in committed if isinstance(decode_value(r.result), int)
    )


def test_errors_name_their_case(bank: BankRun, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    src = bank.sources
    with pytest.raises(SqlSyntaxError, match="PARSE_SYNTAX_ERROR"):
        query("SELEKT 1", src, spark=spark)
    off = replace(src, changelog_topic="")
    first = bank.commit_epochs()[0]
    with pytest.raises(
        AsOfUnavailable, match=f"epoch {first} is before the snapshots .*STYX_CHANGELOG_TOPIC"
    ):
        query("SELECT * FROM account", off, as_of_epoch=first, spark=spark)
    between = bank.chain[0] + 1
    assert between not in bank.chain
    with pytest.raises(ChangelogDisabled, match=r"no changelog topic given.*to turn the changelog on"):
        query("SELECT * FROM account", off, as_of_epoch=between, spark=spark)
    # A missing topic is waited for up to min(timeout_s, TOPIC_WAIT_S), in case it was just created.
    gone = replace(src, changelog_topic=f"changelog-{uuid.uuid4().hex[:8]}", timeout_s=5.0)
    with pytest.raises(ChangelogDisabled, match="does not exist"):
        query("SELECT * FROM account", gone, as_of_epoch=between, spark=spark)
    with pytest.raises(AsOfUnavailable, match="has not run yet"):
        query("SELECT * FROM account", src, as_of_epoch=10**9, spark=spark)

    s3 = src.s3
    assert s3 is not None
    argv = ["sql", "SELECT * FROM acount", "--s3-endpoint", s3.endpoint, "--bucket", s3.bucket]
    argv += ["--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key, "--kafka", src.kafka]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "styx: error: no table acount: the tables are requests, replies, epochs, aborts, account" in err


def test_struct_values_become_columns(s3: SeaweedS3, spark: Any) -> None:
    """A bucket written by hand: one snapshot of one partition, with map values, mixed values,
    operators whose names are no SQL names or clash with a log table, and a deployed graph with an
    operator that has no entity."""
    bucket = f"sql-{uuid.uuid4().hex[:8]}"
    c = s3.config
    s3o = S3Options(c.endpoint, c.access_key, c.secret_key, bucket, c.region)
    client = s3o.client()
    client.make_bucket(bucket)
    writes: list[tuple[str, Key, bytes | None]] = [
        ("customer", 1, encode_value({"name": "ann", "balance": 10, "key": "k1"})),
        ("customer", 2, encode_value({"name": "bob", "balance": 5, "tags": ["x"]})),
        ("customer", 3, None),  # deleted
        ("styx.outbox", "i1", encode_value(3)),
        ("requests", "r", encode_value({"a": 1})),
        ("mixed", "m1", encode_value(1)),
        ("mixed", "m2", encode_value({"a": 1})),
    ]
    part = PartitionSnapshot(5, 0, writes, 0, [], 0, 0)
    manifest = Manifest(5, 0, 1, {0: [delta_key(0, 5)]}, [])
    meta = ClusterMeta("styx_benchmarks.bank:app", [], [], 0, [])  # the deployed graph: the bank's
    objects = ((delta_key(0, 5), part), (manifest_key(5), manifest), (META_KEY, meta))
    for name, data in objects:
        raw = msgspec.msgpack.encode(data)
        client.put_object(bucket, name, io.BytesIO(raw), len(raw))
    src = SqlSources(s3=s3o)

    rows = query("SELECT * FROM customer ORDER BY key", src, spark=spark)
    assert rows.columns == ["key", "balance", "value_key", "name", "tags"]
    assert rows.rows == [
        {"key": 1, "balance": 10, "value_key": "k1", "name": "ann", "tags": None},
        {"key": 2, "balance": 5, "value_key": None, "name": "bob", "tags": ["x"]},
    ]
    assert query("SELECT key, value FROM styx_outbox", src, spark=spark).rows == [{"key": "i1", "value": 3}]
    assert query("SELECT a FROM op_requests", src, spark=spark).rows == [{"a": 1}]
    mixed = query("SELECT key, value FROM mixed ORDER BY key", src, spark=spark).rows
    assert mixed == [{"key": "m1", "value": "1"}, {"key": "m2", "value": '{"a":1}'}]
    empty = query("SELECT * FROM account", src, spark=spark)  # the graph's, with no entity yet
    assert (empty.columns, empty.rows) == (["key", "value"], [])
    with pytest.raises(UnknownTable, match=r"no table replies: the tables are account, customer, mixed"):
        query("SELECT * FROM replies", src, spark=spark)  # no Kafka: no log tables
