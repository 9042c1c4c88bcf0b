"""``styx bench``: run a workload open-loop against a cluster, write results and plots.

    styx bench ycsbt --rate 2000 --duration 30                 # starts a local cluster itself
    styx bench tpcc --warehouses 10 --sweep 200,400,800        # one cluster, several rates
    styx bench ycsbt --coordinator 127.0.0.1:6000 --rate 500   # against a running cluster

Every run writes ``<out>/<workload>-<rate>-<stamp>.json`` (configuration, machine, git revision,
per-second series, percentiles, check outcome) and PNG plots: the latency CDF and throughput and
latency over time; a sweep also plots latency against throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiokafka.errors import KafkaError

from styx_benchmarks.cpu import loop_ms, machine_line
from styx_benchmarks.driver import HttpSender, RunResult, SdkSender, Sender, run_open_loop
from styx_benchmarks.log_latency import log_latencies_ms
from styx_benchmarks.workload import Options, Workload
from styx_benchmarks.workloads import make_workload, workload_names
from styx_py.core.addresses import bootstrap_option, host_port_option, url_option
from styx_py.core.errors import StyxError
from styx_py.core.limits import BUSY_LINGER_MS
from styx_py.core.segments import replies_to
from styx_py.io import lifeline

if TYPE_CHECKING:
    from styx_client import StyxClient
    from styx_py.stack.local import LocalStack

RESULTS_DIR = Path("benchmarks/results")
T = TypeVar("T")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", choices=workload_names(), help="which workload")
    p.add_argument("--rate", type=float, default=1000.0, help="requests per second (default 1000)")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per run (default 20)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds sent first and not measured (3)")
    p.add_argument("--sweep", help="comma-separated rates: one run each on the same cluster, plus a plot")
    p.add_argument("--via", choices=["sdk", "http"], default="sdk", help="submit through (default sdk)")
    p.add_argument("--keys", type=int, default=10_000, help="YCSB-T accounts (default 10000)")
    p.add_argument("--zipf", type=float, default=0.0, help="key skew 0 (uniform) … 0.999")
    p.add_argument("--multi-partition", type=float, default=None, help="YCSB-T share of cross-partition")
    p.add_argument(
        "--partitions",
        type=int,
        choices=(4, 16, 64),
        default=None,
        help="YCSB-T: the bank app over this many partitions (default 4)",
    )
    p.add_argument("--warehouses", type=int, default=1, help="TPC-C warehouses (default 1)")
    p.add_argument("--scale", type=float, default=1.0, help="TPC-C / DeathStar population scale (1.0)")
    p.add_argument(
        "--geo",
        choices=("grid", "range"),
        default="grid",
        help="deathstar-hotel: the geo index as grid-cell entities (default) or as range reads "
        "(ctx.scan) over sorted position keys",
    )
    p.add_argument(
        "--hold-share",
        type=float,
        default=1 / 3,
        help="reservations: the share of requests that hold a seat (an external call each); the rest "
        "are YCSB-T transfers (default 1/3; 0: no external calls)",
    )
    p.add_argument(
        "--payments-ms",
        type=float,
        default=1.0,
        help="reservations: the payment service a cluster started here gets answers in this many ms (1)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="workers of a cluster started here (default 2)")
    p.add_argument(
        "--coordinator", type=host_port_option, help="HOST:PORT of a running cluster (default: start one)"
    )
    p.add_argument(
        "--kafka",
        type=bootstrap_option,
        help="a cluster started here uses this Kafka-protocol broker (BOOTSTRAP) instead of its own Tansu, "
        "on fresh topics per run (snapshots stay on its own SeaweedFS)",
    )
    p.add_argument(
        "--durable",
        action="store_true",
        help="a cluster started here keeps its Kafka log in S3 (Tansu on SeaweedFS, as 'styx up --durable')",
    )
    p.add_argument("--gateway", type=url_option, help="with --coordinator --via http: the gateway URL")
    p.add_argument(
        "--one-cluster",
        action="store_true",
        help="a sweep without --coordinator: one cluster, loaded once, for every rate (default: one each)",
    )
    p.add_argument("--no-load", action="store_true", help="the running cluster is loaded already")
    p.add_argument("--no-check", action="store_true", help="skip the invariant check after each run")
    p.add_argument(
        "--linger-ms",
        type=int,
        default=0,
        help="client producer linger in ms (default 0: a partition's records leave at once when it has "
        "no batch in flight, and what accumulates meanwhile goes as the next batch, so batches grow "
        "with the load and add no fixed delay; benchmarks/results/client-cpu.md)",
    )
    p.add_argument(
        "--busy-linger-ms",
        type=float,
        default=BUSY_LINGER_MS,
        help="the SDK client's busy linger in ms (default: the client's, "
        f"{BUSY_LINGER_MS:g}): a partition whose last batch carried several requests waits this long "
        "before its next one, so more share it (styx_py/io/batching.py); 0: off",
    )
    p.add_argument(
        "--no-push",
        action="store_true",
        help="the SDK client reads every reply from the egress topic, none pushed by the workers "
        "(styx_client.sdk.push): the reply path before pushes, for comparison",
    )
    p.add_argument(
        "--no-push-requests",
        action="store_true",
        help="the SDK client pushes no request to the workers, which fetch every one from the ingress "
        "topic (styx_client.sdk.push): the request path before pushes, for comparison",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="per-request reply timeout in s (60)")
    p.add_argument("--out", default=str(RESULTS_DIR), help="results directory (default benchmarks/results)")
    p.add_argument("--no-plots", action="store_true", help="write the JSON results only")
    p.add_argument(
        "--audit",
        action="store_true",
        help="after each run, audit its Kafka logs and snapshots on Spark (styx audit; needs [spark])",
    )
    p.add_argument("--quiet", action="store_true", help="no per-second progress lines")


def options_from(args: argparse.Namespace) -> Options:
    return Options(
        keys=args.keys,
        zipf=args.zipf,
        multi_partition=args.multi_partition,
        partitions=args.partitions,
        warehouses=args.warehouses,
        scale=args.scale,
        seed=args.seed,
        extra={"hold_share": args.hold_share, "payments_ms": args.payments_ms, "geo": args.geo},
    )


def deployed_line(app: str, coordinator: str) -> str:
    """What a benchmark prints once its cluster runs ``app``: where the coordinator listens, for
    `styx status --coordinator` while the run goes (with the same STYX_CLUSTER_SECRET)."""
    return f"deployed {app} on the coordinator at {coordinator}"


def machine_info() -> dict[str, Any]:
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(
                ["git", *cmd], capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "git_revision": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


# Stopped by a supervisor or `timeout` (SIGTERM), `styx bench` stops the cluster it started, as Ctrl-C
# does (the default action ends the process at once and leaves broker, S3 and cluster running). Set
# once SIGTERM came: a KeyboardInterrupt raised by a signal handler is lost when it lands in a weakref
# callback or a __del__ ("Exception ignored in ..."), so every boundary checks this too.
_terminated = threading.Event()


def _on_sigterm(signum: int, frame: object) -> None:
    _terminated.set()
    raise KeyboardInterrupt


def _check_terminated() -> None:
    if _terminated.is_set():
        raise KeyboardInterrupt


def _run_fast(main: Coroutine[Any, Any, T]) -> T:
    """The load generator runs on uvloop: the stock loop's per-request overhead would be measured too.

    While it runs, SIGTERM cancels the main task from inside the loop (cleanup runs as coroutines
    unwind) instead of raising wherever the signal lands; the caller then sees KeyboardInterrupt."""
    import uvloop

    async def cancelled_by_sigterm() -> T:
        task, loop = asyncio.current_task(), asyncio.get_running_loop()
        assert task is not None

        def terminate() -> None:
            _terminated.set()
            task.cancel()

        if threading.current_thread() is not threading.main_thread():
            return await main  # signals reach the main thread only
        previous = signal.getsignal(signal.SIGTERM)
        loop.add_signal_handler(signal.SIGTERM, terminate)
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGTERM)  # leaves SIG_DFL behind: put the handler back
            signal.signal(signal.SIGTERM, previous)

    _check_terminated()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            result = runner.run(cancelled_by_sigterm())
    except asyncio.CancelledError:
        _check_terminated()
        raise
    _check_terminated()
    return result


@contextlib.contextmanager
def _supervised(stack: LocalStack) -> Iterator[None]:
    """Restart a worker that dies or is declared failed while the benchmark runs, as `styx up` does:
    an overloaded machine can starve a worker's heartbeats, and the cluster must recover, not hang."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            for line in stack.supervise():
                print(f"  {line}", flush=True)

    watcher = threading.Thread(target=watch, name="bench-supervisor", daemon=True)
    try:
        watcher.start()  # inside: an interrupt while it starts must still stop it (it restarts workers)
        yield
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join()


def cmd_bench(args: argparse.Namespace) -> int:
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    runs: list[tuple[RunResult, Path]] = []
    cut: list[Path] = []
    try:
        return _cmd_bench(args, runs, cut)
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: the cluster started here is stopped already (its context managers ran);
        # the runs that finished were written as they ended, the one cut short when it was.
        kept = ", ".join(str(path) for _, path in runs) or "none"
        partial = "".join(f"; the run cut short, measured until then: {path}" for path in cut)
        print(f"styx bench: interrupted; finished runs kept: {kept}{partial}", file=sys.stderr, flush=True)
        if len(runs) > 1:
            summarize(args, runs)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _cmd_bench(args: argparse.Namespace, runs: list[tuple[RunResult, Path]], cut: list[Path]) -> int:
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    rates = [float(r) for r in args.sweep.split(",")] if args.sweep else [args.rate]
    workload = make_workload(args.workload, options_from(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    audits: list[int] = []
    if args.coordinator:
        gateway = args.gateway
        if args.via == "http" and not gateway:
            print("styx bench: --via http with --coordinator needs --gateway URL", file=sys.stderr)
            return 2
        _run_fast(bench(args, workload, rates, args.coordinator, gateway, runs, cut=cut))
        if args.audit:
            # The running cluster's Kafka and topics come from its coordinator; S3 from $STYX_S3_*.
            from styx_py.core.wire import StatusRequest
            from styx_py.stack.local import admin

            status = _run_fast(admin(args.coordinator, StatusRequest()))
            topics = ["--ingress-topic", str(status["ingress_topic"]), "--egress-topic"]
            topics.append(str(status["egress_topic"]))
            topics += ["--changelog-topic", str(status.get("changelog_topic", ""))]
            target = out / f"{workload.name}-audit"
            audits.append(audit(args, workload, str(status["kafka_bootstrap"]), target, topics))
    else:
        # A fresh cluster per rate: the broker's logs (and so its fetch cost) grow with every run, and
        # a later run must not pay for the earlier ones.
        from styx_py.stack.local import LocalStack

        for group in [rates] if args.one_cluster else [[rate] for rate in rates]:
            rate = group[0]
            data_dir = Path(tempfile.mkdtemp(prefix="styx-bench-"))
            try:
                print(f"starting a local cluster with {args.workers} workers …", flush=True)
                # Benchmarks overload the machine on purpose: a worker whose loop is busy with a big
                # epoch must not be declared failed after 1 s of late heartbeats.
                env = {"STYX_LOG_LEVEL": "WARNING", "STYX_FAILURE_TIMEOUT_MS": "5000"}
                services = contextlib.ExitStack()
                env.update(services.enter_context(workload.services()))
                s3 = None
                if args.kafka:
                    # A broker that outlives the run: fresh topics, so each run starts on empty logs.
                    from styx_py.stack.services import SeaweedS3

                    suffix = uuid.uuid4().hex[:8]
                    for name in ("INGRESS", "EGRESS", "SEQLOG"):
                        env[f"STYX_{name}_TOPIC"] = f"bench-{name.lower()}-{suffix}"
                    s3_dir = data_dir / "s3"
                    s3 = services.enter_context(
                        SeaweedS3(s3_dir, buckets=["styx-snapshots"], log_path=data_dir / "seaweedfs.log")
                    ).config
                with (
                    services,
                    LocalStack(
                        data_dir,
                        workers=args.workers,
                        gateway=args.via == "http",
                        env=env,
                        kafka=args.kafka,
                        s3=s3,
                        durable=args.durable,
                    ) as stack,
                ):
                    stack.deploy(workload.app)
                    print(deployed_line(workload.app, stack.coordinator), flush=True)
                    with _supervised(stack):
                        _run_fast(
                            bench(
                                args,
                                workload,
                                group,
                                stack.coordinator,
                                stack.gateway_url or None,
                                runs,
                                {**stack.pids(), **workload.service_pids()},
                                cut,
                            )
                        )
                    if args.audit:
                        s3_args: list[str] = []
                        if stack.s3 is not None:
                            s3 = stack.s3.config
                            s3_args += ["--s3-endpoint", s3.endpoint, "--s3-access-key", s3.access_key]
                            s3_args += ["--s3-secret-key", s3.secret_key]
                        target = out / f"{workload.name}-{rate:g}-audit"
                        audits.append(audit(args, workload, stack.kafka, target, s3_args))
            finally:
                shutil.rmtree(data_dir, ignore_errors=True)
    if len(runs) > 1:
        summarize(args, runs)
    if 1 in audits:  # styx audit: 1 a check failed, 2 it could not run (its error line is above)
        print("audit: FAILED (see the report above)", flush=True)
    if 2 in audits:
        print("audit: could not run (see its error above)", flush=True)
    return 1 if any(r.check for r, _ in runs) or any(audits) else 0


def summarize(args: argparse.Namespace, runs: list[tuple[RunResult, Path]]) -> None:
    """The sweep's file (and plot) over ``runs``, and its best sustained rate."""
    workload = make_workload(args.workload, options_from(args))
    sweep_path = write_sweep(Path(args.out), args, workload, runs)
    if not args.no_plots:
        from styx_benchmarks.plots import plot_sweep

        plot_sweep([r for r, _ in runs], sweep_path.with_suffix(""), title=f"{workload.name} sweep")
    print(f"sweep: {sweep_path}", flush=True)
    best = max((r.rate for r, _ in runs if r.sustainable()), default=None)
    print(f"max sustainable rate (p99 < 1 s, ≥98 % served): {best if best is not None else 'none'}")


def audit(args: argparse.Namespace, workload: Workload, kafka: str, out: Path, extra: list[str]) -> int:
    """Run ``styx audit`` over exactly this run's topics (and snapshots); its exit code.

    A process of its own: the audit sits above the benchmarks (it imports their workload checks), and
    Spark's JVM and memory are gone when it ends."""
    o = workload.options
    argv = ["audit", "--kafka", kafka, "--workload", workload.name, "--out", str(out), *extra]
    argv += ["--keys", str(o.keys), "--warehouses", str(o.warehouses), "--scale", str(o.scale)]
    argv += ["--app", workload.app]  # the serial replay runs the app the workload chose (e.g. --geo)
    print(f"auditing the run on Spark: {out}", flush=True)
    auditing = lifeline.popen([sys.executable, "-m", "styx_py.cli", *argv])  # dies with this process
    try:
        return auditing.wait()
    finally:
        if auditing.poll() is None:  # interrupted (Ctrl-C, SIGTERM): the audit ends with the bench
            auditing.kill()
            auditing.wait()


async def bench(
    args: argparse.Namespace,
    workload: Workload,
    rates: list[float],
    coordinator: str,
    gateway: str | None,
    runs: list[tuple[RunResult, Path]],
    processes: dict[str, int] | None = None,
    cut: list[Path] | None = None,
) -> None:
    """Load (unless --no-load), then one run per rate on this cluster, each checked, written and added
    to ``runs`` as it ends (an interrupted benchmark keeps those); ``processes`` (a cluster started
    here) are charged their CPU per transaction. A run cut short (Ctrl-C, SIGTERM) writes what it
    measured until then to ``WORKLOAD-RATE-STAMP-interrupted.json``, added to ``cut``."""
    from styx_client import StyxClient

    say = print
    out = Path(args.out)
    max_pending = max(100_000, int(max(rates) * (args.timeout + args.warmup + args.duration)))
    async with await StyxClient.connect(
        coordinator,
        max_pending=max_pending,
        linger_ms=args.linger_ms,
        busy_linger_ms=args.busy_linger_ms,
        push_replies=not args.no_push,
        push_requests=not args.no_push_requests,
    ) as client:
        if not args.no_load:
            t0 = time.perf_counter()
            await workload.load(client, progress=lambda m: say(m, flush=True))
            say(f"loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        sender: Sender
        if args.via == "http":
            assert gateway is not None
            sender = HttpSender(gateway, args.timeout)
            await sender.wait_ready()
        else:
            sender = SdkSender(client, args.timeout)

        def keep_cut(partial: RunResult) -> None:
            path = write_results(out, args, workload, partial, interrupted=True)
            if cut is not None:
                cut.append(path)

        try:
            for rate in rates:
                say(
                    f"{workload.name}: {rate:g} req/s for {args.duration:g} s "
                    f"(+{args.warmup:g} s warm-up) via {args.via}",
                    flush=True,
                )
                # Replies of this run go to this segment or later (one more back: a worker may learn
                # of a new segment after the client).
                first_segment = max(0, replies_to(client.segment) - 1)
                replied, pushed = client.stats.replied, client.stats.pushed
                requests_pushed = client.requests_pushed
                batching = client.batching
                loop_before = loop_ms()
                totals_before = await engine_totals(coordinator)
                started = time.monotonic()
                result = await run_open_loop(
                    workload,
                    sender,
                    rate=rate,
                    duration_s=args.duration,
                    warmup_s=args.warmup,
                    seed=args.seed + len(runs),
                    progress=lambda m: say(m, flush=True),
                    quiet=args.quiet,
                    processes=processes,
                    interrupted=keep_cut,
                )
                totals_after = await engine_totals(coordinator)
                result.engine = engine_delta(totals_before, totals_after, time.monotonic() - started)
                if result.engine:
                    say(f"  {engine_line(result.engine)}", flush=True)
                loop_after = loop_ms()
                result.machine_loop_ms = {"before": loop_before, "after": loop_after}
                say(f"  {machine_line(loop_before, loop_after)} (styx_benchmarks.cpu loop_ms)", flush=True)
                if isinstance(sender, SdkSender):
                    took = client.stats.replied - replied
                    result.replies_pushed_share = round((client.stats.pushed - pushed) / max(1, took), 4)
                    say(f"  replies pushed by the workers: {result.replies_pushed_share:.1%}", flush=True)
                    result.requests_pushed_share = round(
                        (client.requests_pushed - requests_pushed) / max(1, took), 4
                    )
                    say(f"  requests pushed to the workers: {result.requests_pushed_share:.1%}", flush=True)
                    now = client.batching
                    batches = now.batches - batching.batches
                    result.requests_per_batch = round((now.records - batching.records) / max(1, batches), 2)
                    lingered = now.lingered - batching.lingered
                    result.batches_lingered_share = round(lingered / max(1, batches), 4)
                    await _read_log_latency(client, result, first_segment, say)
                lost = result.statuses["error"] + result.unanswered
                if not args.no_check and lost:
                    # Requests that timed out may still run: a check made of many reads would see a
                    # state in motion and report violations that are not there.
                    result.check_skipped = f"{lost} requests got no reply in time; the state may still change"
                    say(f"  check: skipped ({result.check_skipped})", flush=True)
                elif not args.no_check:
                    try:
                        result.check = await _check(workload, coordinator)
                    except (StyxError, RuntimeError) as exc:
                        result.check = [f"the check could not read the state: {exc}"]
                    say(
                        "  check: "
                        + ("OK" if not result.check else f"FAILED ({len(result.check)}): {result.check[:5]}"),
                        flush=True,
                    )
                path = write_results(out, args, workload, result)
                if not args.no_plots:
                    from styx_benchmarks.plots import plot_run

                    plot_run(result, path.with_suffix(""), title=f"{workload.name} @ {rate:g}/s")
                say(f"  results: {path}", flush=True)
                runs.append((result, path))
        finally:
            if isinstance(sender, HttpSender):
                await sender.close()


async def _check(workload: Workload, coordinator: str) -> list[str]:
    """The workload's check, through a client of its own that never sheds: the run's refusals narrowed
    the run client's in-flight window (styx_client.sdk.window), which says nothing about a check's
    reads of an idle cluster."""
    from styx_client import StyxClient

    async with await StyxClient.connect(coordinator, shed_when_refused=False) as client:
        return await workload.check(client)


async def engine_totals(coordinator: str) -> dict[str, int] | None:
    """The coordinator's totals (``styx status``: epochs, committed, rescheduled, fallback, refused),
    or None when it does not answer them (the run goes on without)."""
    from styx_py.core.wire import StatusRequest
    from styx_py.stack.local import admin

    try:
        body = await admin(coordinator, StatusRequest(), timeout_s=5.0)
    except StyxError:
        return None
    totals = body.get("totals")
    return dict(totals) if isinstance(totals, dict) and "epochs" in totals else None


def engine_delta(
    before: dict[str, int] | None, after: dict[str, int] | None, seconds: float
) -> dict[str, float] | None:
    """What the epochs did between two :func:`engine_totals`: epochs and their rate, transactions
    (committed and aborted) per epoch, and fallback runs per such transaction (a transaction
    rescheduled to a later epoch runs in the fallback of each epoch it tries, so this can pass 1)."""
    if before is None or after is None:
        return None
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    epochs, decided = d.get("epochs", 0), d.get("committed", 0) + d.get("aborted", 0)
    return {
        "epochs": epochs,
        "epochs_per_s": round(epochs / max(seconds, 1e-9), 1),
        "txns_per_epoch": round(decided / epochs, 1) if epochs else 0.0,
        "fallback_per_txn": round(d.get("fallback", 0) / decided, 4) if decided else 0.0,
        "rescheduled": d.get("rescheduled", 0),
        "refused": d.get("refused", 0),
    }


def engine_line(engine: dict[str, float]) -> str:
    return (
        f"epochs: {engine['epochs']:g} ({engine['epochs_per_s']:g}/s), {engine['txns_per_epoch']:g} "
        f"transactions each, {engine['fallback_per_txn']:g} fallback runs per transaction, "
        f"{engine['rescheduled']:g} rescheduled, {engine['refused']:g} refused by the workers"
    )


async def _read_log_latency(
    client: StyxClient, result: RunResult, first_segment: int, say: Callable[..., None]
) -> None:
    """The run's latency as the logs see it (styx_benchmarks.log_latency): from the egress log, read back."""
    first_id = result.first_request_id
    if first_id is None:
        return  # nothing of the window was sent
    try:
        topic, prefix = client.egress_topic, client.request_id_prefix
        values = await log_latencies_ms(
            client.bootstrap, topic, first_segment, prefix, first_id, expected=result.answered
        )
    except (KafkaError, OSError, TimeoutError) as exc:
        say(f"  log to log: not measured (reading the egress log failed: {exc!r})", flush=True)
        return
    s = result.set_latency_log(values)
    if values:
        say(
            "  log to log (request record -> reply record, the Styx reference harness's measure): "
            f"p50 {s['p50']:.0f} ms  p99 {s['p99']:.0f} ms  p99.9 {s['p99.9']:.0f} ms  "
            f"({s['count']} replies)",
            flush=True,
        )


def _config(args: argparse.Namespace, workload: Workload) -> dict[str, Any]:
    storage = "S3 storage on SeaweedFS" if getattr(args, "durable", False) else "memory"
    return {
        "workload": workload.name,
        "app": workload.app,
        "options": dataclasses.asdict(workload.options),
        "via": args.via,
        "pushed_replies": args.via == "sdk" and not getattr(args, "no_push", False),
        "pushed_requests": args.via == "sdk"
        and not getattr(args, "no_push", False)
        and not getattr(args, "no_push_requests", False),
        "linger_ms": getattr(args, "linger_ms", 0),
        "busy_linger_ms": getattr(args, "busy_linger_ms", BUSY_LINGER_MS) if args.via == "sdk" else None,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "workers": None if args.coordinator else args.workers,
        "cluster": args.coordinator or "local (started by styx bench)",
        "kafka": args.kafka or ("" if args.coordinator else f"tansu ({storage}, started by styx bench)"),
        "command": " ".join(["styx", "bench", *sys.argv[2:]]) if sys.argv[1:2] == ["bench"] else "",
    }


def _prefix(args: argparse.Namespace) -> str:
    """Result files of a durable-mode cluster are named ``durable-…`` (another broker, other numbers)."""
    return "durable-" if getattr(args, "durable", False) else ""


def write_results(
    out: Path, args: argparse.Namespace, workload: Workload, result: RunResult, *, interrupted: bool = False
) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    cut = "-interrupted" if interrupted else ""
    path = out / f"{_prefix(args)}{workload.name}-{result.rate:g}-{stamp}{cut}.json"
    doc = {
        "config": _config(args, workload),
        "machine": machine_info(),
        "started": stamp,
        "result": result.summary(),
        "series": result.series(),
        "latency_curve_ms": result.latency_curve_ms(),
    }
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


def write_sweep(
    out: Path, args: argparse.Namespace, workload: Workload, runs: list[tuple[RunResult, Path]]
) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = out / f"{_prefix(args)}{workload.name}-sweep-{stamp}.json"
    doc = {
        "config": _config(args, workload),
        "machine": machine_info(),
        "runs": [
            {"rate": r.rate, "file": p.name, **{k: v for k, v in r.summary().items() if k != "causes"}}
            for r, p in runs
        ],
    }
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path
