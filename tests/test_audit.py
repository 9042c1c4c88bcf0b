"""The PySpark audit on a real cluster run: Tansu + SeaweedFS + coordinator + 2 workers, YCSB-T.

One run per module (load 200 accounts, 1 500 transfers with a worker SIGKILLed and restarted in the
middle, snapshots to S3, then balance reads marked as a check's own traffic), on the session's Spark
(tests/service_fixtures.py). The clean run passes every check and writes a self-contained HTML report;
each injected defect is caught with a precise message and nothing else fails:

* a duplicated reply — a copy of the egress topic with one reply record produced twice;
* a lost reply — a copy of the egress topic with one reply record left out;
* a tampered balance — a copy of the snapshot bucket with one account rewritten in one delta (audited
  through ``styx audit``'s entry point: exit code 1, a progress line per stage); the changelog, which
  still holds the true balance, disagrees with it too;
* a changelog record produced twice, and one left out — copies of the changelog topic.

A second run of its own scales the cluster to 3 workers and back to 2 with ``styx scale`` (the README's
walk-through): the audit passes, tids interleaving by the sequencer count the log records (3).

The lost-reply audit runs without S3: the state checks are reported skipped, never passed.

Defects go into copies (topics, bucket) so the tests do not depend on each other's order.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
import pytest

pytest.importorskip("pyspark")

from aiokafka import AIOKafkaProducer

from styx_benchmarks.workload import CHECK_ID_PREFIX, Options
from styx_benchmarks.ycsbt import YcsbT
from styx_client import StyxClient
from styx_py.audit.failures import EXIT_FAILED
from styx_py.audit.job import AuditResult, run_audit, run_from_args
from styx_py.audit.kafka_source import iter_range, plan_ranges
from styx_py.audit.options import AuditConfig, S3Options, add_arguments
from styx_py.audit.rows import KafkaRecord
from styx_py.audit.snapshot_source import list_names, load_manifest
from styx_py.core.changelog import ChangeRecord, change_decoder
from styx_py.core.wire import PartitionSnapshot, Reply, StatusRequest, decode_value, encode_value
from styx_py.stack.local import LocalStack, admin
from styx_py.stack.services import SeaweedS3, TansuBroker, create_topics
from tests.service_fixtures import start_cluster
from tests.test_scaling import running_on, styx_scale

pytestmark = [pytest.mark.services, pytest.mark.slow]

ACCOUNTS = 200
TRANSFERS = 1500


@dataclass(frozen=True)
class Run:
    kafka: str
    ingress: str
    egress: str
    seqlog: str
    s3: S3Options
    reads: list[str]  # request ids of read-only balance calls, a check's own (their loss changes no state)
    resent: list[str]  # request ids a client submitted twice (each submission gets the same reply)
    changelog: str


def config(run: Run, out: Path, **changes: object) -> AuditConfig:
    cfg = AuditConfig(
        kafka=run.kafka,
        ingress_topic=run.ingress,
        egress_topic=run.egress,
        seqlog_topic=run.seqlog,
        changelog_topic=run.changelog,
        out=out,
        workload="ycsbt",
        workload_options={"keys": ACCOUNTS},
        s3=run.s3,
    )
    return replace(cfg, **changes)  # type: ignore[arg-type]


async def transfers(client: StyxClient, workload: YcsbT, rng: random.Random, n: int) -> None:
    window = asyncio.Semaphore(100)

    async def transfer() -> None:
        op = workload.next_op(rng)
        async with window:
            await client.submit(op.operator, op.key, op.function, *op.args, request_id=uuid.uuid4().hex)

    await asyncio.gather(*(transfer() for _ in range(n)))


async def read_until_snapshot(stack: LocalStack, client: StyxClient, reads: list[str]) -> None:
    """Balance reads, marked as a check's own traffic, until a snapshot after the last transfer is
    durable (epochs run only while there is work)."""
    last_transfer_epoch = (await admin(stack.coordinator, StatusRequest()))["epoch"]

    async def read(i: int) -> None:
        rid = f"{CHECK_ID_PREFIX}{uuid.uuid4().hex}"
        reads.append(rid)
        await client.submit("account", f"acct{i % ACCOUNTS}", "balance", request_id=rid)

    for attempt in range(200):
        await asyncio.gather(*(read(attempt * 10 + i) for i in range(10)))
        snap = (await admin(stack.coordinator, StatusRequest()))["last_snapshot"]
        if snap is not None and snap["epoch"] >= last_transfer_epoch:
            return
    raise AssertionError("no snapshot after the last transfer")


async def drive(stack: LocalStack) -> tuple[list[str], list[str]]:
    """Load, transfer (killing a worker half-way), resend a few request ids, then read until a snapshot
    covers the transfers. Returns the ids of the reads and of the resent requests."""
    workload = YcsbT(Options(keys=ACCOUNTS, seed=3))
    rng = random.Random(3)
    reads: list[str] = []
    sent: list[tuple[str, str, str, str, tuple[object, ...]]] = []
    async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
        await workload.load(client, progress=lambda _: None)
        window = asyncio.Semaphore(100)

        async def transfer() -> None:
            op = workload.next_op(rng)
            rid = uuid.uuid4().hex
            sent.append((rid, op.operator, str(op.key), op.function, op.args))
            async with window:
                await client.submit(op.operator, op.key, op.function, *op.args, request_id=rid)

        await asyncio.gather(*(transfer() for _ in range(TRANSFERS // 2)))
        stack.kill("w1")  # SIGKILL: the cluster rolls back to its last snapshot and replays the log
        stack.start_worker("w1")
        await asyncio.gather(*(transfer() for _ in range(TRANSFERS - TRANSFERS // 2)))
        # A client retrying after its reply (twice): the cluster answers again, with the identical reply.
        resent = sent[:: TRANSFERS // 5][:5]
        first = [await client.submit(o, k, f, *a, request_id=rid) for rid, o, k, f, a in resent]
        again = [await client.submit(o, k, f, *a, request_id=rid) for rid, o, k, f, a in resent]
        assert first == again
        await read_until_snapshot(stack, client, reads)
    return reads, [rid for rid, *_ in resent]


@pytest.fixture(scope="module")
def run(kafka: TansuBroker, s3: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("audit-cluster")
    settings = {"snapshot_interval_s": "0.2"}
    with start_cluster(tmp, kafka, s3=s3, app=YcsbT.app, settings=settings) as stack:
        env = stack.env
        reads, resent = asyncio.run(drive(stack))
        assert stack.status()["recoveries"] >= 1, "the worker kill did not cause a recovery"
    c = s3.config
    yield Run(
        kafka.bootstrap,
        env["STYX_INGRESS_TOPIC"],
        env["STYX_EGRESS_TOPIC"],
        env["STYX_SEQLOG_TOPIC"],
        S3Options(c.endpoint, c.access_key, c.secret_key, env["STYX_SNAPSHOT_BUCKET"], c.region),
        reads,
        resent,
        env["STYX_CHANGELOG_TOPIC"],
    )


def errors(result: AuditResult) -> dict[str, int]:
    return {check: by["error"] for check, by in result.counts.items() if by.get("error")}


async def copy_topic(
    bootstrap: str, src: str, dst: str, edit: Callable[[list[KafkaRecord]], list[KafkaRecord]]
) -> None:
    """Copy every record of ``src`` to a new topic ``dst`` (same partitions, keys, timestamps), edited."""
    ranges = await plan_ranges(bootstrap, [src])
    await create_topics(bootstrap, {dst: len(ranges)})
    records = [rec for r in ranges async for batch in iter_range(bootstrap, r) for rec in batch]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                dst,
                r.value,
                key=r.key,
                partition=r.partition,
                timestamp_ms=r.timestamp_ms,
                headers=list(r.headers),
            )
            for r in edit(records)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def reply_of(record: KafkaRecord) -> Reply:
    assert record.value is not None
    return msgspec.msgpack.decode(record.value, type=Reply)


# ---- the tests ------------------------------------------------------------------------------------


def test_clean_run_passes_every_audit(spark: object, run: Run, tmp_path: Path) -> None:
    result = run_audit(spark, config(run, tmp_path))  # type: ignore[arg-type]
    assert result.ok, "\n".join(f"[{f.check}] {f.message}" for f in result.samples)
    assert not errors(result)
    stats = result.stats
    assert stats["records"]["ingress"] >= TRANSFERS + 2 * len(run.resent) + len(run.reads)
    assert stats["records"]["egress"] == stats["records"]["ingress"]  # resends answered once more each
    assert stats["request_ids"] == stats["replies"] == stats["records"]["ingress"] - 2 * len(run.resent)
    assert stats["snapshot"]["entities"] == ACCOUNTS
    assert len(stats["workers_by_generation"]) >= 2, "the recovery should have started a generation"
    assert stats["check_replies"] == len(run.reads)  # the reads are counted apart from the workload
    assert stats["changelog"]["records"] >= TRANSFERS  # every transfer writes (an abort: none)
    assert {v.verdict for v in result.verdicts} == {"pass"}, result.verdicts
    report = result.report.read_text()
    assert f"**PASSED — all {len(result.verdicts)} checks passed**" in report and "ordering.mencius" in report
    page = result.html.read_text()
    assert page.count('src="data:image/png;base64,') >= 4 and not re.search(r"https?://|<link|<script", page)
    for plot in ("throughput", "latency", "latency_by_function", "epochs"):
        assert (tmp_path / "plots" / f"{plot}.png").stat().st_size > 0
    for table in ("latency_by_function", "per_second", "abort_causes", "epochs", "findings"):
        assert (tmp_path / "tables" / f"{table}.parquet").exists()
    # What the checks counted: the bank makes no external call and sets no timer.
    summary = json.loads((tmp_path / "report.json").read_text())
    assert summary["ok"] is True and len(summary["checks"]) == len(result.verdicts)
    zero = dict.fromkeys(("intents", "responses", "continuations", "continuations_failed"), 0)
    assert summary["checked"]["effects.checked"] == {**zero, "timers": 0, "timers_fired": 0}
    assert "external calls and timers checked: 0 intents, 0 responses" in report
    assert not any(f.check == "effects.checked" for f in result.samples), "a count is not a finding"


def test_duplicated_reply_is_detected(spark: object, run: Run, tmp_path: Path) -> None:
    copy = f"{run.egress}-dup"
    picked: list[Reply] = []

    def duplicate_one(records: list[KafkaRecord]) -> list[KafkaRecord]:
        victim = next(
            r
            for r in records
            if reply_of(r).status == "committed" and reply_of(r).request_id not in run.resent
        )
        picked.append(reply_of(victim))
        return [*records, victim]  # the same reply again, on the same partition

    asyncio.run(copy_topic(run.kafka, run.egress, copy, duplicate_one))
    result = run_audit(spark, config(run, tmp_path, egress_topic=copy))  # type: ignore[arg-type]
    rid = picked[0].request_id
    assert not result.ok
    assert errors(result) == {"exactly_once.duplicate_reply": 1}, result.samples
    [message] = result.messages("exactly_once.duplicate_reply")
    assert f"request {rid} has 2 replies for 1 submission(s) (identical copies" in message


def change_of(record: KafkaRecord) -> ChangeRecord:
    assert record.value is not None
    return change_decoder.decode(record.value)


@pytest.mark.parametrize("defect", ["twice", "missing"])
def test_a_changelog_record_written_twice_or_missing_is_detected(
    spark: object, run: Run, tmp_path: Path, defect: str
) -> None:
    copy = f"{run.changelog}-{defect}"
    picked: list[ChangeRecord] = []

    def edit(records: list[KafkaRecord]) -> list[KafkaRecord]:
        # A record of the middle of the run, not the first of its epoch (whose loss reads as a gap too).
        at = next(i for i in range(len(records) // 2, len(records)) if change_of(records[i]).index > 0)
        picked.append(change_of(records[at]))
        if defect == "twice":
            return [*records[: at + 1], records[at], *records[at + 1 :]]
        return [*records[:at], *records[at + 1 :]]

    asyncio.run(copy_topic(run.kafka, run.changelog, copy, edit))
    result = run_audit(spark, config(run, tmp_path, changelog_topic=copy))  # type: ignore[arg-type]
    assert not result.ok
    found = errors(result)
    assert set(found) <= {"changelog.once", "changelog.snapshot"} and found.get("changelog.once", 0) >= 2, (
        result.samples
    )
    victim = picked[0]
    messages = result.messages("changelog.once")
    if defect == "twice":
        assert any(
            f"epoch {victim.epoch} record {victim.index} (tid {victim.tid}) written twice" in m
            for m in messages
        )
    else:
        assert any(
            f"epoch {victim.epoch} records {victim.index}..{victim.index} missing" in m for m in messages
        )
    assert any("not the serial replay's writes" in m for m in messages), messages


def test_lost_reply_is_detected(spark: object, run: Run, tmp_path: Path) -> None:
    copy = f"{run.egress}-lost"
    lost = run.reads[len(run.reads) // 2]

    def drop_one(records: list[KafkaRecord]) -> list[KafkaRecord]:
        kept = [r for r in records if reply_of(r).request_id != lost]
        assert len(kept) == len(records) - 1
        return kept

    asyncio.run(copy_topic(run.kafka, run.egress, copy, drop_one))
    result = run_audit(spark, config(run, tmp_path, egress_topic=copy, s3=None))  # type: ignore[arg-type]
    assert not result.ok
    assert errors(result) == {"exactly_once.lost_reply": 1}, result.samples
    for check in ("invariant.ycsbt", "serial.state"):  # no snapshot to check: skipped, not passed
        verdict = result.verdict(check)
        assert verdict.verdict == "skipped" and verdict.reason.startswith("no S3 endpoint given"), verdict
    assert result.verdict("serial.outcome").verdict == "pass"
    [message] = result.messages("exactly_once.lost_reply")
    assert message.startswith(f"request {lost} (account.balance on 'acct")
    assert message.endswith("has no reply on the egress log")


def test_tampered_balance_is_detected(spark: object, run: Run, tmp_path: Path) -> None:
    client = run.s3.client()
    bucket = f"{run.s3.bucket}-tampered"
    client.make_bucket(bucket)
    for name in list_names(client, run.s3.bucket, ""):
        data = client.get_object(run.s3.bucket, name).read()
        client.put_object(bucket, name, io.BytesIO(data), len(data))
    manifest = load_manifest(client, bucket)
    assert manifest is not None
    # Tamper with an account in the newest object of partition 0 that wrote one (later deltas may be empty).
    for name in reversed(manifest.deltas[0]):
        part = msgspec.msgpack.decode(client.get_object(bucket, name).read(), type=PartitionSnapshot)
        written = [(i, w) for i, w in enumerate(part.writes) if w[0] == "account" and w[2] is not None]
        if written:
            break
    else:
        raise AssertionError("no account in the snapshot of partition 0")
    i, (op, key, value) = written[0]
    assert value is not None
    balance = decode_value(value)
    part.writes[i] = (op, key, encode_value(balance + 7))
    data = msgspec.msgpack.encode(part)
    client.put_object(bucket, name, io.BytesIO(data), len(data))

    s3 = run.s3
    argv = ["--kafka", run.kafka, "--ingress-topic", run.ingress, "--egress-topic", run.egress]
    argv += ["--seqlog-topic", run.seqlog, "--s3-endpoint", s3.endpoint, "--s3-access-key", s3.access_key]
    argv += ["--s3-secret-key", s3.secret_key, "--bucket", bucket, "--workload", "ycsbt"]
    argv += ["--keys", str(ACCOUNTS), "--changelog-topic", run.changelog, "--out", str(tmp_path)]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    printed: list[str] = []
    progress: list[str] = []
    results: list[AuditResult] = []
    code = run_from_args(parser.parse_args(argv), printed.append, progress.append, results.append)
    assert code == EXIT_FAILED, printed
    assert printed[0].startswith("audit FAILED — 15 of 18 checks passed, 3 failed ("), printed
    assert "  invariant.ycsbt: FAIL (1 errors, 0 warnings)" in printed
    assert "  ordering.mencius: pass" in printed
    stages = [re.sub(r"^audit \[ *\d+\.\ds\] ", "", line) for line in progress]
    for stage in (
        "planning",
        "checking S3",
        "starting Spark",
        "snapshots",
        "reading ingress",
        "reading the sequencer",
    ):
        assert any(line.startswith(stage) for line in stages), progress
    assert any("checking exactly_once.*" in line for line in stages), progress
    [result] = results
    assert (tmp_path / "report.html").exists()
    assert errors(result) == {"invariant.ycsbt": 1, "serial.state": 1, "changelog.snapshot": 1}, (
        result.samples
    )
    [money] = result.messages("invariant.ycsbt")
    assert money.startswith(f"money not conserved: sum of {ACCOUNTS} balances is") and money.endswith("(+7)")
    [state] = result.messages("serial.state")
    assert state == (
        f"account {key!r}: snapshot {manifest.epoch} holds {balance + 7}, the serial replay of the log "
        f"up to epoch {manifest.epoch} gives {balance}"
    )
    [rebuilt] = result.messages("changelog.snapshot")  # the changelog disagrees with the snapshot too
    assert rebuilt == (
        f"account {key!r}: snapshot {manifest.epoch} holds {balance + 7}, the changelog up to epoch "
        f"{manifest.epoch} gives {balance}"
    )


async def drive_scaling(stack: LocalStack) -> list[str]:
    """Load, then transfers on 2 workers, on 3 (``styx scale --workers 3``) and on 2 again (``styx scale
    --workers 2``: w3 drained); then reads until a snapshot covers it all. The ids of the reads."""
    workload = YcsbT(Options(keys=ACCOUNTS, seed=5))
    rng = random.Random(5)
    reads: list[str] = []
    async with await StyxClient.connect(stack.coordinator, timeout_s=120) as client:
        await workload.load(client, progress=lambda _: None)
        await transfers(client, workload, rng, 300)
        out = await styx_scale(stack, "--workers", "3", "--no-wait")  # the stack starts w3 below
        assert "waiting for 1 more worker to register" in out, out
        await asyncio.to_thread(stack.wait_for, running_on(["w1", "w2", "w3"]), "on 3 workers")
        await transfers(client, workload, rng, 300)
        out = await styx_scale(stack, "--workers", "2")  # returns once the cluster runs on 2
        assert "draining w3" in out, out
        on_2 = running_on(["w1", "w2"])
        await asyncio.to_thread(stack.wait_for, lambda st: on_2(st) and "w3" in stack.left, "w3 gone")
        await transfers(client, workload, rng, 300)
        await read_until_snapshot(stack, client, reads)
    return reads


def test_the_audit_passes_after_scaling_up_and_back_down(
    spark: object, kafka: TansuBroker, s3: SeaweedS3, tmp_path: Path
) -> None:
    """After 2 → 3 → 2 workers the cluster keeps its sequencer-id space at 3 (the most workers it had),
    so the two workers' tids interleave by 3. The audit takes that count from the log (``n_seq`` of
    each entry), not from the workers that logged in a generation, and every check passes."""
    settings = {"snapshot_interval_s": "0.2"}
    with start_cluster(tmp_path / "cluster", kafka, s3=s3, app=YcsbT.app, settings=settings) as stack:
        env = stack.env
        reads = asyncio.run(drive_scaling(stack))
        events = stack.status()["shape_changes"]
        assert [n for e in events for n in e["added"]] == ["w3"], events
        assert [e["removed"] for e in events if e["removed"]] == [["w3"]], events
    c = s3.config
    run = Run(
        kafka.bootstrap,
        env["STYX_INGRESS_TOPIC"],
        env["STYX_EGRESS_TOPIC"],
        env["STYX_SEQLOG_TOPIC"],
        S3Options(c.endpoint, c.access_key, c.secret_key, env["STYX_SNAPSHOT_BUCKET"], c.region),
        reads,
        [],
        env["STYX_CHANGELOG_TOPIC"],
    )
    result = run_audit(spark, config(run, tmp_path / "audit"))  # type: ignore[arg-type]
    assert result.ok, "\n".join(f"[{f.check}] {f.message}" for f in result.samples)
    assert not errors(result)
    assert {v.verdict for v in result.verdicts} == {"pass"}, result.verdicts
    workers = result.stats["workers_by_generation"]
    assert 3 in workers.values() and workers[max(workers)] == 2, workers
