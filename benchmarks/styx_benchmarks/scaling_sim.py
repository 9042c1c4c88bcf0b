"""The epoch protocol from 2 to 64 workers, on paper: the simulation with a datacenter latency model.

    python -m styx_benchmarks.scaling_sim                      # 2 … 64 workers, every model
    python -m styx_benchmarks.scaling_sim --workers 2,4 --epochs 4 --no-save

The whole cluster (the real coordinator and workers) runs in one process on virtual time
(:class:`~styx_py.testing.cluster.SimCluster`) over a :class:`~styx_py.testing.latency.TimedNetwork`:
every message and every sequencer-log append takes a seeded per-hop delay (``--hop-us``, 100-500 µs
by default), and in the ``cpu`` model each process is one core that pays a fixed virtual cost per
message it handles and sends, per transaction it runs and per report a bundle carries
(:data:`CPU_MODEL`, from measured numbers). ``-relay`` and ``-tree`` models carry the workers' reports
through hubs (:mod:`styx_py.testing.topology`). Each worker gets ``--per-worker`` bank transfers
per epoch (weak scaling: the epoch's transactions grow with the workers), with keys that never
collide, so no epoch falls back. Per worker count it reports epochs per second of virtual time, one
epoch's latency (its EpochStart sent to its last EpochDone handled by the coordinator), and messages
and bytes per epoch by type.

Writes benchmarks/results/scaling-sim.json and scaling-sim.png; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import timeit
from collections import Counter
from typing import Any, ClassVar

import msgspec

from styx_benchmarks.bench import RESULTS_DIR
from styx_benchmarks.plots import plot_scaling
from styx_py.core.partitioning import partition_of
from styx_py.core.segments import segment_topic
from styx_py.core.wire import (
    COORDINATOR,
    Batch,
    ExecDone,
    Message,
    Request,
    Vote,
    decode_batch,
    encode_frame,
    encode_value,
)
from styx_py.testing.cluster import SimCluster, run_simulated
from styx_py.testing.latency import LatencyModel, TimedNetwork

APP = "styx_benchmarks.bank:app64"
PARTITIONS = 64
# benchmarks/results/lean-client.md ("Also measured"): a frame read with StreamReader.readexactly costs
# the receiver 35-43 µs of CPU (one frame per wake-up), a loopback TCP write the sender 8-17 µs;
# benchmarks/results/log-to-log.md ("Where a worker's CPU goes"): t ≈ 63 µs of worker CPU per
# transaction. The per-epoch fixed cost there (e ≈ 2.45 ms, mostly Kafka requests) is left out. A
# report inside a bundle: decoding it and a worker's handling of it, as probe() measures them (the
# result file's "measured": 0.87 µs and a p50 of 7.0 µs here), rounded up to 10 µs.
CPU_MODEL = {"recv_cpu_us": 40, "send_cpu_us": 12, "txn_cpu_us": 63, "bundled_cpu_us": 10}
REPORTS = ("ExecDone", "Vote", "Revote")


MODELS = tuple(f"{cost}{t}" for t in ("", "-relay", "-tree") for cost in ("network", "cpu"))


def network(name: str, hop_us: tuple[int, int], seed: int) -> TimedNetwork:
    """``network``: hops only; ``cpu``: hops and the per-message and per-transaction CPU costs;
    ``-relay`` / ``-tree``: the workers' reports through hubs (:mod:`styx_py.testing.topology`)."""
    cost, _, topology = name.partition("-")
    costs = CPU_MODEL if cost == "cpu" else {}
    return TimedNetwork(seed, LatencyModel(hop_us=hop_us, **costs), topology=topology or "all-to-all")


def requests_for(cluster: SimCluster, per_worker: int, epochs: int) -> list[tuple[int, Request]]:
    """``per_worker · epochs`` transfers rooted on each worker's partitions, each from a key of its own
    to a key of its own anywhere (no two transactions touch a key: nothing conflicts)."""
    placement = cluster.coordinator.cluster.placement  # ingress partition → its worker
    owned: dict[str, list[int]] = {}
    for p, node in enumerate(placement):
        owned.setdefault(node, []).append(p)
    buckets: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    need = per_worker * epochs
    roots = [parts[i % len(parts)] for parts in owned.values() for i in range(need)]
    want = Counter(roots)
    i = 0
    while any(len(buckets[p]) < n for p, n in want.items()):
        key = f"a{i}"
        i += 1
        buckets[partition_of(key, PARTITIONS)].append(key)
    out = []
    for n, p in enumerate(roots):
        src = buckets[p].pop()
        req = Request(f"r{n}", "account", "transfer", src, msgspec.Raw(encode_value([f"d{n}", 0])))
        out.append((p, req))
    return out


async def run_one(
    workers: int, model_name: str, args: argparse.Namespace, net: TimedNetwork | None = None
) -> dict[str, Any]:
    assert model_name in MODELS, f"--models: of {', '.join(MODELS)}, not {model_name}"
    net = net or network(model_name, args.hop_us, args.seed)
    per, measured = args.per_worker, args.epochs
    config = {"epoch_size_max": per, "snapshot_interval_s": 3600.0}
    async with SimCluster(APP, workers=workers, seed=args.seed, network=net, **config) as c:
        reqs = requests_for(c, per, measured + 2)
        topic = segment_topic(c.config.ingress_topic, 0)
        for p, req in reqs:  # as raw records, all before the first epoch: every batch is full
            c.log.append(topic, p, req)
        await c.wait_for_replies(len(reqs), timeout_s=3600.0)
    return summarize(net, workers, model_name, per, measured)


def summarize(net: TimedNetwork, workers: int, model_name: str, per: int, measured: int) -> dict[str, Any]:
    """The measured epochs: after the first with work, ``measured`` full ones."""
    busy = sorted(e for e, counts in net.epoch_messages.items() if counts["ExecDone"])
    epochs = busy[1 : 1 + measured]
    assert len(epochs) == measured, f"{len(busy)} epochs ran, {measured + 1} needed"
    starts = [net.first_sent["EpochStart", e] for e in [*epochs, epochs[-1] + 1]]
    latency_ms = [(net.last_handled["EpochDone", e] - net.first_sent["EpochStart", e]) * 1e3 for e in epochs]
    decided_ms = [(net.last_handled["Vote", e] - net.first_sent["EpochStart", e]) * 1e3 for e in epochs]
    per_epoch: Counter[str] = Counter()
    per_epoch_bytes: Counter[str] = Counter()
    for e in epochs:
        per_epoch.update(net.epoch_messages[e])
        per_epoch_bytes.update(net.epoch_bytes[e])
    msgs = {k: v / measured for k, v in sorted(per_epoch.items())}
    sizes = {k: v / measured for k, v in sorted(per_epoch_bytes.items())}
    eps = measured / (starts[-1] - starts[0])
    cpu: Counter[str] = Counter()
    for e in epochs:
        cpu.update(net.epoch_cpu_us.get(e, Counter()))
    worker_cpu = [v for node, v in cpu.items() if node != COORDINATOR]
    return {
        "workers": workers,
        "model": model_name,
        "txns_per_epoch": per * workers,
        "epochs_per_s": round(eps, 1),
        "txns_per_s": round(eps * per * workers),
        "epoch_latency_ms": {
            "p50": round(statistics.median(latency_ms), 3),
            "max": round(max(latency_ms), 3),
        },
        "decided_ms_p50": round(statistics.median(decided_ms), 3),
        "messages_per_epoch": msgs,
        "bytes_per_epoch": sizes,
        "report_messages_per_epoch": sum(v for k, v in msgs.items() if k.split()[0] in REPORTS),
        "report_bytes_per_epoch": sum(v for k, v in sizes.items() if k.split()[0] in REPORTS),
        "all_messages_per_epoch": sum(msgs.values()),
        # Virtual CPU per epoch (the cpu model's charges; 0 in the network model).
        "cpu_ms_per_epoch": {
            "coordinator": round(cpu[COORDINATOR] / measured / 1e3, 3),
            "busiest_worker": round(max(worker_cpu, default=0) / measured / 1e3, 3),
        },
    }


def measure(workers: int, model_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run on an event loop of its own: its virtual clock starts at 0, so the run's numbers do
    not depend on what ran before it (the clock rounds every deadline to whole microseconds)."""
    return run_simulated(run_one(workers, model_name, args))


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for model_name in args.models:
        for n in args.workers:
            t0 = time.perf_counter()
            row = measure(n, model_name, args)
            rows.append(row)
            print(
                f"{model_name:7} {n:3} workers: {row['epochs_per_s']:7.1f} epochs/s, epoch p50 "
                f"{row['epoch_latency_ms']['p50']:.2f} ms, {row['all_messages_per_epoch']:.0f} msgs/epoch "
                f"({row['report_messages_per_epoch']:.0f} reports) [{time.perf_counter() - t0:.1f} s real]",
                file=sys.stderr,
                flush=True,
            )
    return rows


class _ProbedNetwork(TimedNetwork):
    """The real time a worker's handler takes per report it is handed (after decoding)."""

    handled_s: ClassVar[list[float]] = []

    def deliver(self, node: str, src: str, msg: Message) -> None:
        t0 = time.perf_counter()
        super().deliver(node, src, msg)
        if isinstance(msg, (ExecDone, Vote)) and node != COORDINATOR:
            self.handled_s.append(time.perf_counter() - t0)


def probe(args: argparse.Namespace) -> dict[str, float]:
    """What a report costs inside a bundle, in real µs on this machine: decoding one of 63 Votes in a
    frame, and a worker's handling of an ExecDone or Vote (p50 over a 16-worker run, all-to-all)."""
    vote = Vote(12, "w17", [1, 2, 3], [], 1, 12345, 4)
    frame = encode_frame(Batch("w3", [vote] * 63))[4:]
    decode_s = min(timeit.repeat(lambda: decode_batch(frame, "worker"), number=200, repeat=5)) / 200 / 63
    _ProbedNetwork.handled_s = []
    costs = {"recv_cpu_us": 40, "send_cpu_us": 12, "txn_cpu_us": 63}
    net = _ProbedNetwork(args.seed, LatencyModel(hop_us=args.hop_us, **costs))
    run_simulated(run_one(16, "cpu", argparse.Namespace(**{**vars(args), "epochs": 4}), net))
    return {
        "decode_us_per_report_in_a_bundle": round(decode_s * 1e6, 2),
        "worker_handling_us_per_report_p50": round(statistics.median(_ProbedNetwork.handled_s) * 1e6, 1),
    }


def cli() -> None:
    about = (__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m styx_benchmarks.scaling_sim", description=about)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p.add_argument("--workers", type=ints, default=[2, 4, 8, 16, 32, 64], help="comma-separated (≤ 64)")
    p.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS), help=",".join(MODELS))
    p.add_argument("--hop-us", type=ints, default=[100, 500], help="one-way delay range, µs (100,500)")
    p.add_argument("--per-worker", type=int, default=4, help="transactions per worker per epoch (4)")
    p.add_argument("--epochs", type=int, default=10, help="measured epochs per run (10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-save", action="store_true", help="print only")
    args = p.parse_args()
    assert max(args.workers) <= PARTITIONS, f"at most {PARTITIONS} workers (the app's partitions)"
    args.hop_us = tuple(args.hop_us)
    measured = probe(args)
    print(f"measured: {measured}", file=sys.stderr, flush=True)
    runs = sweep(args)
    config = {k: v for k, v in vars(args).items() if k != "no_save"}
    doc = {
        "benchmark": "scaling_sim",
        "app": APP,
        "cpu_model_us": CPU_MODEL,
        "measured": measured,
        "config": config,
        "runs": runs,
    }
    print(json.dumps(doc, indent=1))
    if not args.no_save:
        RESULTS_DIR.mkdir(exist_ok=True)
        (RESULTS_DIR / "scaling-sim.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(plot_scaling(doc, RESULTS_DIR / "scaling-sim.png"), file=sys.stderr)


if __name__ == "__main__":
    cli()
