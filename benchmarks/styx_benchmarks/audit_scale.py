"""How long the audit takes at scale: synthetic but valid logs of N YCSB-T requests, then ``styx audit``.

Running the real cluster for 1 M requests takes long on this machine (minutes at its throughput, and
Tansu's fetches slow down as a topic gathers small batches), so this writes the records a 2-worker
cluster would have written, straight to the topics, in large batches:

* ingress: the YCSB-T load (``open_accounts`` chunks) and N transfers (``--abort-share`` of them too
  large to succeed), each on the partition owning its key, timestamped on a ``--rate`` clock;
* seqlog: one entry per worker and epoch (an epoch every ``--epoch-ms``), Mencius tids
  ``sid + lc·2`` with the counters rebalanced every epoch, as ``styx_worker.epoch`` logs them;
* egress: each request's reply, computed by executing the epoch's transactions in tid order with the
  bank app's arithmetic (commit order ``(epoch, 0, tid)``), timestamped at the end of its epoch;
* S3: a snapshot of the final balances (one delta per partition), its manifest and the cluster meta.

Every audit check passes on this data (the serial replay re-executes it with the real app). Then it
runs ``styx audit`` as a subprocess and reports its wall time::

    python -m styx_benchmarks.audit_scale --requests 1000000 --keys 10000 --out results/tmp/audit-1m
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaProducer

from styx_benchmarks.bank import account
from styx_benchmarks.workload import Options
from styx_benchmarks.ycsbt import INITIAL, LOAD_CHUNK, YcsbT, key_name
from styx_py.core.blobs import delta_key, manifest_key
from styx_py.core.partitioning import partition_of
from styx_py.core.wire import (
    NIL,
    BatchEntry,
    ClusterMeta,
    Manifest,
    PartitionSnapshot,
    Phase,
    Reply,
    ReplyStatus,
    Request,
    Run,
    SeqLogEntry,
    encode_value,
)
from styx_py.stack.services import SeaweedS3, TansuBroker, create_topics, minio_client

WORKERS = 2
PARTITIONS = account.partitions
BATCH_BYTES = 1 << 20  # one produce batch (Tansu's fetches slow down with the number of batches)
META_KEY = "cluster/meta"


class Logs:
    """The records of the three topics, as (partition, timestamp_ms, key, value)."""

    def __init__(self) -> None:
        self.ingress: list[tuple[int, int, bytes, bytes]] = []
        self.egress: list[tuple[int, int, bytes, bytes]] = []
        self.seqlog: list[tuple[int, int, bytes | None, bytes]] = []


def synthesize(
    n: int, keys: int, rate: float, epoch_ms: int, abort_share: float, seed: int
) -> tuple[Logs, dict[str, int], int, int]:
    """The logs of a run, the final balances, the last epoch and the final sequencer counter (pure)."""
    enc = msgspec.msgpack.Encoder()
    rng = random.Random(seed)
    workload = YcsbT(Options(keys=keys, seed=seed))
    start_ms = 1_800_000_000_000
    # (send ms, request, partition)
    arrivals: list[tuple[int, Request, int]] = []
    for c, s in enumerate(range(0, keys, LOAD_CHUNK)):
        chunk = [key_name(i) for i in range(s, min(keys, s + LOAD_CHUNK))]
        req = Request(
            f"load-{c}",
            "account",
            "open_accounts",
            f"loader{c}",
            msgspec.Raw(enc.encode([chunk, INITIAL])),
            start_ms,
        )
        arrivals.append((start_ms, req, partition_of(req.key, PARTITIONS)))
    load_end = start_ms + epoch_ms  # the load runs alone in epoch 0
    for i in range(n):
        op = workload.next_op(rng)
        to_key, amount = op.args
        if rng.random() < abort_share:
            amount = 10**12  # more than any balance: "insufficient credit"
        ts = load_end + int(i * 1000 / rate)
        rid = f"{uuid.UUID(int=rng.getrandbits(128)).hex}"
        req = Request(rid, op.operator, op.function, op.key, msgspec.Raw(enc.encode([to_key, amount])), ts)
        arrivals.append((ts, req, partition_of(op.key, PARTITIONS)))

    logs = Logs()
    balances: dict[str, int] = {}
    ingress_next = [0] * PARTITIONS
    owner = [p % WORKERS + 1 for p in range(PARTITIONS)]  # partition -> sid
    lc = 0
    epoch = 0
    i = 0
    while i < len(arrivals):
        epoch_end = start_ms + (epoch + 1) * epoch_ms
        batch: list[tuple[int, Request, int, int]] = []  # (send ms, request, partition, offset)
        while i < len(arrivals) and arrivals[i][0] < epoch_end:
            ts, req, p = arrivals[i]
            logs.ingress.append((p, ts + 1, req.request_id.encode(), enc.encode(req)))
            batch.append((ts, req, p, ingress_next[p]))
            ingress_next[p] += 1
            i += 1
        txns: list[tuple[int, int, Request, int]] = []  # (tid, send ms, request, partition)
        lc_end = lc
        for sid in range(1, WORKERS + 1):
            mine = [b for b in batch if owner[b[2]] == sid]
            tids = [sid + c * WORKERS for c in range(lc, lc + len(mine))]
            entries: list[BatchEntry] = [
                Run(t, p, off, req.request_id) for t, (_, req, p, off) in zip(tids, mine, strict=True)
            ]
            logs.seqlog.append(
                (
                    0,
                    epoch_end,
                    None,
                    enc.encode(SeqLogEntry(epoch, f"w{sid}", lc, entries, 0, lc + len(mine))),
                )
            )
            txns += [(t, ts, req, p) for t, (ts, req, p, _) in zip(tids, mine, strict=True)]
            lc_end = max(lc_end, lc + len(mine))
        lc = lc_end
        for tid, ts, req, p in sorted(txns, key=lambda t: t[0]):
            reply = execute(req, tid, epoch, balances, ts)
            logs.egress.append((p, epoch_end + 5 + tid % 7, req.request_id.encode(), enc.encode(reply)))
        epoch += 1
    return logs, balances, epoch - 1, lc


def execute(req: Request, tid: int, epoch: int, balances: dict[str, int], ts: int) -> Reply:
    """The bank app's transfer and open_accounts, as plain arithmetic."""
    args = msgspec.msgpack.decode(req.args)
    if req.function == "open_accounts":
        chunk, amount = args
        for k in chunk:
            balances[k] = balances.get(k, 0) + amount
        return Reply(
            req.request_id,
            tid,
            epoch,
            Phase.OPTIMISTIC,
            ReplyStatus.COMMITTED,
            msgspec.Raw(encode_value(len(chunk))),
            None,
            None,
            ts,
        )
    to_key, amount = args
    src = str(req.key)
    balance = balances.get(src, 0)
    if balance < amount:
        error = f"insufficient credit in {src}: {balance} < {amount}"
        return Reply(
            req.request_id, tid, epoch, Phase.OPTIMISTIC, ReplyStatus.ABORTED, NIL, error, "Abort", ts
        )
    balances[src] = balance - amount
    balances[to_key] = balances.get(to_key, 0) + amount
    return Reply(
        req.request_id,
        tid,
        epoch,
        Phase.OPTIMISTIC,
        ReplyStatus.COMMITTED,
        msgspec.Raw(encode_value(balance - amount)),
        None,
        None,
        ts,
    )


async def produce(
    bootstrap: str, topic: str, records: Sequence[tuple[int, int, bytes | None, bytes]]
) -> None:
    """Write records in ~1 MiB batches per partition (few large batches keep Tansu's fetches fast)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_batch_size=BATCH_BYTES, max_request_size=4 * BATCH_BYTES
    )
    await producer.start()
    try:
        by_partition: dict[int, list[tuple[int, bytes | None, bytes]]] = {}
        for p, ts, key, value in records:
            by_partition.setdefault(p, []).append((ts, key, value))
        sent = []
        for p, recs in sorted(by_partition.items()):
            batch = producer.create_batch()
            for ts, key, value in recs:
                if batch.append(timestamp=ts, key=key, value=value) is None:
                    sent.append(await producer.send_batch(batch, topic, partition=p))
                    batch = producer.create_batch()
                    assert batch.append(timestamp=ts, key=key, value=value) is not None
            sent.append(await producer.send_batch(batch, topic, partition=p))
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def write_snapshot(
    s3: SeaweedS3, bucket: str, balances: dict[str, int], epoch: int, lc: int, logs: Logs
) -> None:
    """The final balances as a snapshot of ``epoch``: one delta per partition, a manifest, the meta."""
    client = minio_client(s3.config)
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)
    enc = msgspec.msgpack.Encoder()
    writes: dict[int, list[tuple[str, str | int, bytes | None]]] = {p: [] for p in range(PARTITIONS)}
    for k, v in balances.items():
        writes[partition_of(k, PARTITIONS)].append(("account", k, encode_value(v)))
    ingress = [0] * PARTITIONS
    egress = [0] * PARTITIONS
    for p, *_ in logs.ingress:
        ingress[p] += 1
    for p, *_ in logs.egress:
        egress[p] += 1
    deltas: dict[int, list[str]] = {}
    for p in range(PARTITIONS):
        part = PartitionSnapshot(epoch, p, writes[p], ingress[p], [], egress[p], len(logs.seqlog))
        data = enc.encode(part)
        client.put_object(bucket, delta_key(p, epoch), io.BytesIO(data), len(data))
        deltas[p] = [delta_key(p, epoch)]
    for name, obj in (
        (manifest_key(epoch), Manifest(epoch, lc, PARTITIONS, deltas, [(0, 0)], len(logs.seqlog))),
        (
            META_KEY,
            ClusterMeta(
                YcsbT.app, [f"w{p % WORKERS + 1}" for p in range(PARTITIONS)], ["w1", "w2"], 0, [(0, 0)]
            ),
        ),
    ):
        data = enc.encode(obj)
        client.put_object(bucket, name, io.BytesIO(data), len(data))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=10_000.0, help="requests per second of the simulated run")
    p.add_argument("--epoch-ms", type=int, default=50)
    p.add_argument("--abort-share", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="results/tmp/audit-scale", help="the audit's output directory")
    p.add_argument("--audit-args", default="", help="extra arguments for styx audit")
    args = p.parse_args(argv)

    data = Path(tempfile.mkdtemp(prefix="styx-audit-scale-"))
    suffix = uuid.uuid4().hex[:8]
    topics = {"ingress": f"in-{suffix}", "egress": f"out-{suffix}", "seqlog": f"seq-{suffix}"}
    bucket = f"snap-{suffix}"
    try:
        return _run(args, data, topics, bucket)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def _run(args: argparse.Namespace, data: Path, topics: dict[str, str], bucket: str) -> int:
    with (
        SeaweedS3(data / "s3", buckets=[bucket]) as s3,
        TansuBroker("memory", log_path=data / "tansu.log") as kafka,
    ):
        t0 = time.monotonic()
        logs, balances, last_epoch, lc = synthesize(
            args.requests, args.keys, args.rate, args.epoch_ms, args.abort_share, args.seed
        )
        t1 = time.monotonic()
        print(
            f"synthesized {len(logs.ingress)} requests, {len(logs.egress)} replies, {len(logs.seqlog)} "
            f"sequencer-log entries ({last_epoch + 1} epochs) in {t1 - t0:.1f}s",
            flush=True,
        )

        async def write_topics() -> None:
            await create_topics(
                kafka.bootstrap,
                {topics["ingress"]: PARTITIONS, topics["egress"]: PARTITIONS, topics["seqlog"]: 1},
            )
            await produce(kafka.bootstrap, topics["ingress"], logs.ingress)
            await produce(kafka.bootstrap, topics["egress"], logs.egress)
            await produce(kafka.bootstrap, topics["seqlog"], logs.seqlog)

        asyncio.run(write_topics())
        write_snapshot(s3, bucket, balances, last_epoch, lc, logs)
        print(f"wrote the topics and the snapshot in {time.monotonic() - t1:.1f}s", flush=True)
        c = s3.config
        cmd = [
            sys.executable, "-m", "styx_py.cli", "audit",
            "--kafka", kafka.bootstrap,
            "--ingress-topic", topics["ingress"],
            "--egress-topic", topics["egress"],
            "--seqlog-topic", topics["seqlog"],
            "--s3-endpoint", c.endpoint,
            "--bucket", bucket,
            "--workload", "ycsbt", "--keys", str(args.keys),
            "--out", args.out,
            *args.audit_args.split(),
        ]  # fmt: skip
        print(f"running: {' '.join(cmd[1:])}", flush=True)
        t2 = time.monotonic()
        # The keys go by environment (as for the cluster), not on a command line that ps shows.
        env = {**os.environ, "STYX_S3_ACCESS_KEY": c.access_key, "STYX_S3_SECRET_KEY": c.secret_key}
        code = subprocess.call(cmd, env=env)
        print(
            f"styx audit exited with {code} after {time.monotonic() - t2:.1f}s (wall, including Spark start)"
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
