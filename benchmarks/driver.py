"""The open-loop load driver: constant-rate submission, latency from the scheduled send time.

Request ``i`` is *scheduled* at ``start + i / rate`` whatever happened to the others, and its latency
is ``reply time - scheduled time``. A client (or a loop) that falls behind therefore cannot hide the
queueing it causes (no coordinated omission): a request sent late carries its lateness in its latency.
Requests scheduled during the warm-up are sent but not counted. Latencies go into HdrHistograms
(1 µs … 10 min, 3 significant digits), overall, per request kind and per second.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from hdrh.histogram import HdrHistogram

from styx_py.benchmarks.workload import Op, Workload
from styx_py.core.errors import StyxError

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
_HIST_MAX_US = 600_000_000
# The driver wakes at most once per tick and sends every request due by then (see run_open_loop).
_TICK_S = 0.001


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, _HIST_MAX_US, 3)


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str  # committed | aborted | failed | error (no reply: timeout, overload, send failure)
    cause: str = ""  # abort / failure cause, normalised (numbers and keys replaced by '#')


class Sender(Protocol):
    async def send(self, op: Op) -> Outcome: ...


class FutureSender(Sender, Protocol):
    """A sender with the driver's fast path: a future per request instead of a task."""

    def start(self, op: Op) -> asyncio.Future[Any] | Outcome: ...
    def outcome(self, future: asyncio.Future[Any]) -> Outcome: ...


_VARIABLE = re.compile(r"[\w.'\"-]*\d[\w.'\"-]*")


def normalise_cause(message: str | None) -> str:
    """Group abort messages by cause: tokens holding digits (keys, amounts) become '#'."""
    return _VARIABLE.sub("#", message or "")[:80]


class SdkSender:
    """Through the SDK (Kafka ingress → cluster → Kafka egress)."""

    def __init__(self, client: Any, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s

    async def send(self, op: Op) -> Outcome:
        try:
            reply = await self.client.submit(
                op.operator, op.key, op.function, *op.args, timeout_s=self.timeout_s
            )
        except StyxError as exc:
            return Outcome("error", type(exc).__name__)
        return _reply_outcome(reply)

    def start(self, op: Op) -> asyncio.Future[Any] | Outcome:
        """The driver's fast path: send now; the future of the reply (see :meth:`outcome`), or the
        outcome of a request that failed locally. No task, closure or timer per request."""
        try:
            return self.client.submit_future(  # type: ignore[no-any-return]
                op.operator, op.key, op.function, *op.args, timeout_s=self.timeout_s
            )
        except StyxError as exc:
            return Outcome("error", type(exc).__name__)

    @staticmethod
    def outcome(future: asyncio.Future[Any]) -> Outcome:
        """What a future of :meth:`start` came to."""
        if future.cancelled():
            return Outcome("error", "CancelledError")
        exc = future.exception()
        if exc is not None:
            return Outcome("error", type(exc).__name__)
        return _reply_outcome(future.result())


COMMITTED = Outcome("committed")  # shared: most outcomes, no object per request


def _reply_outcome(reply: Any) -> Outcome:
    if reply.status == "committed":
        return COMMITTED
    if reply.status == "aborted":
        return Outcome("aborted", normalise_cause(reply.error))
    return Outcome(reply.status, reply.error_type or normalise_cause(reply.error))


class HttpSender:
    """Through the HTTP gateway (POST /v1/invocations) on keep-alive connections."""

    def __init__(self, gateway_url: str, timeout_s: float) -> None:
        from styx_py.benchmarks.http_overhead import KeepAliveClient

        self.http = KeepAliveClient(gateway_url, max_connections=512)
        self.timeout_s = timeout_s

    async def send(self, op: Op) -> Outcome:
        body = json.dumps(
            {"operator": op.operator, "key": op.key, "function": op.function, "args": list(op.args)}
        ).encode()
        try:
            async with asyncio.timeout(self.timeout_s):
                status, data = await self.http.post("/v1/invocations", body)
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            return Outcome("error", type(exc).__name__)
        if status == 200:
            return Outcome("committed")
        try:
            error = json.loads(data)["error"]
            reply = error.get("reply")
        except (ValueError, KeyError, TypeError, AttributeError):
            return Outcome("error", f"HTTP {status}")
        if not isinstance(reply, dict):  # no transaction outcome: 429, 503, 504 …
            return Outcome("error", f"HTTP {status} {error.get('code', '')}".strip())
        if reply["status"] == "aborted":
            return Outcome("aborted", normalise_cause(reply.get("error")))
        return Outcome(reply["status"], reply.get("error_type") or normalise_cause(reply.get("error")))

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the gateway answers /readyz with 200 (it connects to the cluster in the background)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status, _ = await self.http.request("GET", "/readyz")
            except OSError:
                status = 0
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gateway did not become ready within {timeout_s} s")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self.http.close()


@dataclass
class Second:
    """What happened to the requests scheduled in one second of the measured window."""

    scheduled: int = 0
    committed: int = 0
    aborted: int = 0
    failed: int = 0
    errors: int = 0
    completed_here: int = 0  # replies that *arrived* in this second (throughput as seen by the client)
    hist: HdrHistogram = field(default_factory=new_histogram)
    raw: array[int] = field(default_factory=lambda: array("q"))  # µs, histogrammed after the run


@dataclass
class RunResult:
    rate: float
    duration_s: float
    warmup_s: float
    sent: int = 0  # requests scheduled in the measured window
    answered: int = 0  # … of which got a reply (any status)
    unanswered: int = 0  # … still without reply at the end of the drain
    statuses: Counter[str] = field(default_factory=Counter)
    causes: Counter[str] = field(default_factory=Counter)  # "status: cause"
    hist: HdrHistogram = field(default_factory=new_histogram)
    by_label: dict[str, HdrHistogram] = field(default_factory=dict)
    label_counts: Counter[str] = field(default_factory=Counter)
    raw_by_label: dict[str, array[int]] = field(default_factory=dict)
    seconds: list[Second] = field(default_factory=list)
    send_lag_max_s: float = 0.0  # worst lateness of an actual send behind its schedule
    actual_send_rate: float = 0.0  # measured from the send clock over the window
    check: list[str] | None = None
    check_skipped: str = ""

    last_reply_s: float = 0.0  # when the last measured reply arrived, from the window's start
    requests_total: int = 0  # every request the run sent, warm-up included
    client_cpu_s: float = 0.0  # CPU time of the load generator's process while it sent and drained

    @property
    def throughput(self) -> float:
        """Answered requests (any status) per second, over the window or until the last of them was
        answered if that is later: a system that falls behind serves fewer than it was offered."""
        return self.answered / max(self.duration_s, self.last_reply_s)

    def build_histograms(self) -> None:
        for sec in self.seconds:
            for us in sec.raw:
                sec.hist.record_value(us)
            self.hist.add(sec.hist)
        for label, raw in self.raw_by_label.items():
            h = self.by_label[label] = new_histogram()
            for us in raw:
                h.record_value(us)
            self.label_counts[label] = len(raw)

    def percentiles_ms(self, hist: HdrHistogram | None = None) -> dict[str, float]:
        h = hist or self.hist
        if h.get_total_count() == 0:
            return {f"p{p:g}": math.nan for p in PERCENTILES} | {"max": math.nan, "mean": math.nan}
        out = {f"p{p:g}": h.get_value_at_percentile(p) / 1000 for p in PERCENTILES}
        out["max"] = h.get_max_value() / 1000
        out["mean"] = h.get_mean_value() / 1000
        return out

    def sustainable(self, p99_limit_ms: float = 1000.0) -> bool:
        """Kept up: every request answered, ≥ 98 % of the rate served, p99 under the limit."""
        return (
            self.unanswered == 0
            and self.statuses["error"] == 0
            and self.throughput >= 0.98 * self.rate
            and self.percentiles_ms()["p99"] < p99_limit_ms
        )

    def summary(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "sent": self.sent,
            "answered": self.answered,
            "unanswered": self.unanswered,
            "throughput": round(self.throughput, 1),
            "last_reply_s": round(self.last_reply_s, 3),
            "actual_send_rate": round(self.actual_send_rate, 1),
            "send_lag_max_ms": round(self.send_lag_max_s * 1000, 2),
            # The load generator's own cost (driver + SDK, whole process), warm-up and drain included.
            "client_cpu_us_per_request": round(self.client_cpu_s / max(1, self.requests_total) * 1e6, 1),
            "statuses": dict(self.statuses),
            "causes": dict(self.causes.most_common(20)),
            "latency_ms": self.percentiles_ms(),
            "latency_ms_by_label": {
                label: self.percentiles_ms(h) | {"count": self.label_counts[label]}
                for label, h in sorted(self.by_label.items())
            },
            "sustainable_p99_1s": self.sustainable(),
            "check": self.check,
            "check_skipped": self.check_skipped or None,
        }

    def series(self) -> list[dict[str, Any]]:
        out = []
        for i, s in enumerate(self.seconds):
            n = s.hist.get_total_count()
            out.append(
                {
                    "second": i,
                    "scheduled": s.scheduled,
                    "committed": s.committed,
                    "aborted": s.aborted,
                    "failed": s.failed,
                    "errors": s.errors,
                    "replies_arrived": s.completed_here,
                    "p50_ms": s.hist.get_value_at_percentile(50) / 1000 if n else None,
                    "p99_ms": s.hist.get_value_at_percentile(99) / 1000 if n else None,
                    "max_ms": s.hist.get_max_value() / 1000 if n else None,
                }
            )
        return out


async def run_open_loop(
    workload: Workload,
    sender: Sender,
    *,
    rate: float,
    duration_s: float,
    warmup_s: float = 2.0,
    seed: int = 1,
    drain_s: float = 60.0,
    progress: Callable[[str], None] | None = print,
    quiet: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> RunResult:
    """Send ``rate`` requests/s for ``warmup_s + duration_s`` seconds on the clock; wait for replies.

    ``clock`` is ``perf_counter`` by default, not ``loop.time()``: uvloop's loop clock has 1 ms
    resolution and is cached per loop iteration, which would quantise every latency to whole
    milliseconds. The driver's own tests pass a virtual loop's clock (they run on simulated time)."""
    if rate <= 0 or duration_s <= 0 or warmup_s < 0:
        raise ValueError(f"rate and duration must be > 0 and warmup >= 0: {rate=} {duration_s=} {warmup_s=}")
    import random

    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    result = RunResult(rate=rate, duration_s=duration_s, warmup_s=warmup_s)
    result.seconds = [Second() for _ in range(math.ceil(duration_s))]
    total = round(rate * (warmup_s + duration_s))
    result.requests_total = total
    cpu_start = time.process_time()
    first_measured = math.ceil(rate * warmup_s)
    start = clock() + 0.05
    window_end = start + warmup_s + duration_s
    inflight: set[asyncio.Future[Any]] = set()  # tasks of Sender.send
    # SdkSender: a future per request and no task; by request number, each future's one callback
    # (``settled``) takes it out again.
    futures: dict[int, asyncio.Future[Any]] = {}
    fast = cast(FutureSender, sender) if hasattr(sender, "start") else None
    done_count = 0
    first_send = last_send = 0.0

    def record(i: int, label: str, scheduled: float, outcome: Outcome, finished: float) -> None:
        nonlocal done_count
        done_count += 1
        if i < first_measured:
            return
        sec = result.seconds[min(len(result.seconds) - 1, int(scheduled - start - warmup_s))]
        result.statuses[outcome.status] += 1
        if outcome.status == "error":
            sec.errors += 1
            result.causes[f"error: {outcome.cause}"] += 1
            return
        result.answered += 1
        result.last_reply_s = max(result.last_reply_s, finished - start - warmup_s)
        arrived = int(finished - start - warmup_s)
        if 0 <= arrived < len(result.seconds):
            result.seconds[arrived].completed_here += 1
        if outcome.status == "committed":
            sec.committed += 1
        elif outcome.status == "aborted":
            sec.aborted += 1
            result.causes[f"aborted: {outcome.cause}"] += 1
        else:
            sec.failed += 1
            result.causes[f"{outcome.status}: {outcome.cause}"] += 1
        # Only appended here (a fraction of a microsecond): histograms are built after the run, so
        # recording costs the load generator next to nothing while it measures.
        us = max(1, min(_HIST_MAX_US, int((finished - scheduled) * 1e6)))
        sec.raw.append(us)
        raw = result.raw_by_label.get(label)
        if raw is None:
            raw = result.raw_by_label[label] = array("q")
        raw.append(us)

    async def one(i: int, op: Op, scheduled: float) -> None:
        try:
            outcome = await sender.send(op)
        except Exception as exc:  # noqa: BLE001 - a sender bug is counted, never lost in a task
            outcome = Outcome("error", f"{type(exc).__name__}: {exc}"[:80])
        record(i, op.label, scheduled, outcome, clock())

    def settled(i: int, label: str, scheduled: float, future: asyncio.Future[Any]) -> None:
        del futures[i]
        assert fast is not None
        record(i, label, scheduled, fast.outcome(future), clock())

    def reporter() -> None:
        if progress is None or quiet:
            return
        elapsed = clock() - start
        phase = "warm-up" if elapsed < warmup_s else "measure"
        recent = sorted(result.seconds[max(0, min(len(result.seconds), int(elapsed - warmup_s)) - 1)].raw)
        p = {
            k: (recent[min(len(recent) - 1, int(q * len(recent)))] / 1000 if recent else math.nan)
            for k, q in (("p50", 0.5), ("p99", 0.99))
        }
        progress(
            f"  [{phase} {elapsed:5.1f}s] sent {sent:>8}  done {done_count:>8}  "
            f"in flight {len(inflight) + len(futures):>6}  "
            f"p50 {p['p50']:7.1f} ms  p99 {p['p99']:7.1f} ms  aborted {result.statuses['aborted']}  "
            f"errors {result.statuses['error']}"
        )

    sent = 0
    next_report = start + 1.0
    while sent < total:
        now = clock()
        due = min(total, int((now - start) * rate) + 1)
        if due > sent:
            for i in range(sent, due):
                scheduled = start + i / rate
                op = workload.next_op(rng)
                if i >= first_measured:
                    result.sent += 1
                    sec_index = min(len(result.seconds) - 1, int(scheduled - start - warmup_s))
                    result.seconds[sec_index].scheduled += 1
                    result.send_lag_max_s = max(result.send_lag_max_s, now - scheduled)
                    if i == first_measured:
                        first_send = now
                    last_send = now
                if fast is not None:
                    started = fast.start(op)
                    if isinstance(started, Outcome):  # failed locally (overload, bad request)
                        record(i, op.label, scheduled, started, clock())
                    else:
                        futures[i] = started
                        started.add_done_callback(functools.partial(settled, i, op.label, scheduled))
                    continue
                task = loop.create_task(one(i, op, scheduled))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
            sent = due
        if now >= next_report:
            reporter()
            next_report += 1.0
        if sent < total:
            # At least one tick: a sleep shorter than the loop's timer resolution returns at once,
            # and a loop spinning on it burns a core the cluster needs. Requests that fall due
            # within a tick leave together; latency still counts from each one's scheduled time, so
            # the tick shows in the numbers rather than hiding in them.
            await asyncio.sleep(max(_TICK_S, start + sent / rate - clock()))
    if result.sent > 1 and last_send > first_send:
        result.actual_send_rate = (result.sent - 1) / (last_send - first_send)
    # Drain: every request gets its reply or its own timeout; a stuck one counts as unanswered.
    deadline = max(window_end, clock()) + drain_s
    while (inflight or futures) and clock() < deadline:
        await asyncio.wait([*inflight, *futures.values()], timeout=min(1.0, deadline - clock()))
        if inflight or futures:
            reporter()
    result.client_cpu_s = time.process_time() - cpu_start
    left = [*inflight, *futures.values()]
    result.unanswered = len(left)
    for pending in left:
        pending.cancel()
    if left:
        await asyncio.gather(*left, return_exceptions=True)
    result.build_histograms()
    if progress is not None:
        p = result.percentiles_ms()
        progress(
            f"  done: {result.answered}/{result.sent} answered at {result.throughput:.0f}/s "
            f"(asked {rate:g}/s, sent at {result.actual_send_rate:.0f}/s)  p50 {p['p50']:.1f} ms  "
            f"p99 {p['p99']:.1f} ms  p99.9 {p['p99.9']:.1f} ms  max {p['max']:.1f} ms  "
            f"{dict(result.statuses)}"
        )
    return result


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
