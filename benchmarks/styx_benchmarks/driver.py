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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
from hdrh.histogram import HdrHistogram

from styx_benchmarks.cpu import ProcessCpu
from styx_benchmarks.workload import Op, Workload
from styx_py.core.errors import Overloaded, StyxError
from styx_py.io.runtime import steady_gc

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
_HIST_MAX_US = 600_000_000
# The driver wakes at most once per tick and sends every request due by then (see run_open_loop): 1 ms,
# and 2 ms from BUSY_RATE requests a second up. Each wake-up costs a process on this VM ~25-35 µs of CPU
# (a bare 1 ms sleep 25 µs, a uvloop sleep 35 µs), which at 8 000/s, where the 1 ms tick woke the load
# generator ~700 times a second, was 2.5-3 µs of its CPU per request; the longer tick adds ~0.5 ms to
# the mean latency, counted from each request's schedule (benchmarks/results/lean-client.md).
_TICK_S = 0.001
BUSY_TICK_S = 0.002
BUSY_RATE = 4_000.0


def tick_for(rate: float) -> float:
    """The driver's tick at ``rate`` requests a second (see above)."""
    return BUSY_TICK_S if rate >= BUSY_RATE else _TICK_S


# While the driver runs, the cyclic GC runs as in the servers (styx_py.io.runtime.steady_gc). The load
# generator's objects die young (a request lives until its reply): at 8 000/s Python's default
# threshold ran ~1 300 collections in a 10 s run, full ones among them, 1.4 s of CPU (16 µs per
# request) and pauses of 60 to 160 ms (a gc.callbacks probe, cpu_cost --cluster echo).


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, _HIST_MAX_US, 3)


@dataclass(frozen=True, slots=True)
class Outcome:
    # committed | aborted | failed | refused (the cluster did not admit it) | error (no reply: timeout,
    # the client's own overload, send failure)
    status: str
    cause: str = ""  # abort / failure cause, normalised (numbers and keys replaced by '#')


def record_all(hist: HdrHistogram, raw: array[int]) -> None:
    """Record every value of ``raw`` (≥ 1) into ``hist``, with one ``record_value`` per distinct bucket.

    HdrHistogram's ``record_value`` is Python (~3 µs each, two per request: 6 % of the load generator's
    CPU at 8 000/s). Each value is first rounded down to the lowest value of its bucket, which gives
    the very same counts, minimum and maximum (``tests/test_bench.py``), so values are counted per
    bucket with numpy and recorded once per bucket."""
    if not raw:
        return
    assert hist.unit_magnitude == 0, "record_all assumes a histogram whose lowest value is 1"
    values = np.frombuffer(raw, dtype=np.int64)
    exponents = np.frexp(values.astype(np.float64))[1]  # bit lengths (exact below 2**53)
    shifts = np.maximum(0, exponents - (hist.sub_bucket_half_count_magnitude + 1)).astype(np.int64)
    buckets, counts = np.unique((values >> shifts) << shifts, return_counts=True)
    for value, count in zip(buckets.tolist(), counts.tolist(), strict=True):
        hist.record_value(value, count)


class Sender(Protocol):
    async def send(self, op: Op) -> Outcome: ...


Settle = Callable[[Any, BaseException | None], None]
"""Called once per request started by a :class:`CallbackSender`: ``(reply, None)`` or ``(None, error)``."""


class CallbackSender(Sender, Protocol):
    """A sender with the driver's fast path: a callback per request instead of a task or future."""

    def start(self, op: Op, done: Settle) -> Outcome | None:
        """Send ``op`` now and call ``done`` once with its reply or failure; or the outcome of a
        request that failed locally (``done`` is then never called)."""
        ...

    def outcome(self, reply: Any, error: BaseException | None) -> Outcome: ...


_VARIABLE = re.compile(r"[\w.'\"-]*\d[\w.'\"-]*")


def normalise_cause(message: str | None) -> str:
    """Group abort messages by cause: tokens holding digits (keys, amounts) become '#'."""
    return _VARIABLE.sub("#", message or "")[:80]


class SdkSender:
    """Through the SDK (Kafka ingress → cluster → Kafka egress)."""

    def __init__(self, client: Any, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._prepared: dict[tuple[str, str], Any] = {}
        self.last_request_id: str | None = None  # of the last request start() sent

    async def send(self, op: Op) -> Outcome:
        try:
            reply = await self.client.submit(
                op.operator, op.key, op.function, *op.args, timeout_s=self.timeout_s
            )
        except StyxError as exc:
            return _error_outcome(exc)
        return _reply_outcome(reply)

    def start(self, op: Op, done: Settle) -> Outcome | None:
        """The driver's fast path: send now through the client's lean path
        (:meth:`~styx_client.StyxClient.prepare`, one per operator and function); ``done`` gets the
        reply. No task, future, closure or timer per request."""
        prepared = self._prepared.get((op.operator, op.function))
        try:
            if prepared is None:
                prepared = self._prepared[(op.operator, op.function)] = self.client.prepare(
                    op.operator, op.function, timeout_s=self.timeout_s
                )
            self.last_request_id = prepared.send(op.key, op.args, done)
        except StyxError as exc:
            return _error_outcome(exc)
        return None

    @staticmethod
    def outcome(reply: Any, error: BaseException | None) -> Outcome:
        """What a request of :meth:`start` came to."""
        if error is not None:
            return _error_outcome(error)
        return _reply_outcome(reply)


SHED = Outcome("refused", "Overloaded (client)")
ENTITY = Outcome("refused", "Overloaded (entity)")


def _error_outcome(exc: BaseException) -> Outcome:
    """A request the SDK raised on: one it refused itself, nothing sent, while the cluster refuses
    (``Overloaded``, styx_client.sdk.window) counts as refused, at once; anything else is an error."""
    return SHED if isinstance(exc, Overloaded) else Outcome("error", type(exc).__name__)


COMMITTED = Outcome("committed")  # shared: most outcomes, no object per request


def _reply_outcome(reply: Any) -> Outcome:
    if reply.status == "committed":
        return COMMITTED
    if reply.status == "aborted":
        return Outcome("aborted", normalise_cause(reply.error))
    if reply.status == "refused" and getattr(reply, "reason", "") == "entity":
        return ENTITY  # behind its root entity's queue (a hot key), not the cluster's backlog
    return Outcome(reply.status, reply.error_type or normalise_cause(reply.error))


class HttpSender:
    """Through the HTTP gateway (POST /v1/invocations) on keep-alive connections."""

    def __init__(self, gateway_url: str, timeout_s: float) -> None:
        from styx_benchmarks.http_overhead import KeepAliveClient

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
    refused: int = 0  # not admitted (admission control): answered "refused", nothing ran
    completed_here: int = 0  # replies that *arrived* in this second (throughput as seen by the client)
    committed_here: int = 0  # … of which committed
    hist: HdrHistogram = field(default_factory=new_histogram)
    raw: array[int] = field(default_factory=lambda: array("q"))  # µs, histogrammed after the run


# Outcome codes of Outcomes.codes (0: none yet).
_COMMITTED, _ABORTED, _FAILED, _ERROR, _REFUSED = 1, 2, 3, 4, 5


_STATUS_CODES = {"aborted": _ABORTED, "error": _ERROR, "refused": _REFUSED}


class Outcomes:
    """The outcome of every measured request of a run, as it comes: when (the driver's clock), which
    kind (an index into ``labels``) and its status (a code, with the name and cause of every status but
    committed counted as they come). :meth:`fill` derives the run's counts, seconds and raw latencies
    from them, exactly as recording each one into its second would have."""

    def __init__(self, n: int) -> None:
        self.finished = array("d", [math.nan]) * n
        self.codes = bytearray(n)
        self.kinds = bytearray(n)
        self.labels: list[str] = []
        self._kind: dict[str, int] = {}
        self.other: Counter[str] = Counter()  # statuses other than committed, by name
        self.causes: Counter[str] = Counter()  # "status: cause", as RunResult.causes

    def add(self, j: int, label: str, outcome: Outcome, finished: float) -> None:
        self.finished[j] = finished
        kind = self._kind.get(label)
        if kind is None:
            kind = self._kind[label] = len(self.labels)
            assert kind < 256, "at most 256 request kinds"
            self.labels.append(label)
        self.kinds[j] = kind
        status = outcome.status
        if status == "committed":
            self.codes[j] = _COMMITTED
            return
        self.codes[j] = _STATUS_CODES.get(status, _FAILED)
        self.other[status] += 1
        self.causes[f"{status}: {outcome.cause}"] += 1

    def latencies_us(self, lo: int, hi: int, start: float, first: int, rate: float) -> list[int]:
        """Sorted latencies (µs) of the answered requests ``lo .. hi - 1`` (progress lines)."""
        return sorted(
            int((self.finished[j] - (start + (j + first) / rate)) * 1e6)
            for j in range(lo, min(hi, len(self.codes)))
            if self.codes[j] and self.codes[j] != _ERROR
        )

    def fill(self, result: RunResult, start: float, first: int, rate: float) -> None:
        """Count every outcome into ``result``: statuses, causes, answers, each second's counts and raw
        latencies (request ``j`` was scheduled at ``start + (j + first) / rate``), the last reply."""
        codes = np.frombuffer(self.codes, dtype=np.uint8)
        got = codes != 0
        result.statuses.update(self.other)
        committed = int(np.count_nonzero(codes == _COMMITTED))
        if committed:
            result.statuses["committed"] += committed
        result.causes.update(self.causes)
        answered = got & (codes != _ERROR)
        result.answered += int(np.count_nonzero(answered))
        if not got.any():
            return
        n_seconds = len(result.seconds)
        warmup_s = result.warmup_s
        scheduled = start + (np.arange(len(codes), dtype=np.int64) + first) / rate
        # The same arithmetic, in the same order, as the per-request record it replaces; requests
        # with no outcome get their schedule as a stand-in finish (they are counted nowhere).
        finished = np.where(got, np.frombuffer(self.finished, dtype=np.float64), scheduled)
        second = np.minimum(n_seconds - 1, (scheduled - start - warmup_s).astype(np.int64))

        def per_second(mask: np.ndarray, at: np.ndarray = second) -> list[int]:
            counts: list[int] = np.bincount(at[mask], minlength=n_seconds)[:n_seconds].tolist()
            return counts

        since = finished - start - warmup_s
        if answered.any():
            result.last_reply_s = max(result.last_reply_s, float(since[answered].max()))
        arrived = since.astype(np.int64)  # truncated towards zero, as int() does
        here = answered & (arrived >= 0) & (arrived < n_seconds)
        columns = {
            "committed": per_second(codes == _COMMITTED),
            "aborted": per_second(codes == _ABORTED),
            "failed": per_second(codes == _FAILED),
            "errors": per_second(codes == _ERROR),
            "refused": per_second(codes == _REFUSED),
            "completed_here": per_second(here, arrived),
            "committed_here": per_second(here & (codes == _COMMITTED), arrived),
        }
        for name, counts in columns.items():
            for sec, n in zip(result.seconds, counts, strict=True):
                setattr(sec, name, getattr(sec, name) + n)
        us = np.clip(((finished - scheduled) * 1e6).astype(np.int64), 1, _HIST_MAX_US)
        # A refused request's latency (how fast it was told) is kept apart: the latencies of the run
        # are those of the requests the cluster admitted.
        result.refused_raw.extend(us[codes == _REFUSED].tolist())
        answered &= codes != _REFUSED
        kinds = np.frombuffer(self.kinds, dtype=np.uint8)
        for kind, label in enumerate(self.labels):
            result.raw_by_label.setdefault(label, array("q")).extend(us[answered & (kinds == kind)].tolist())
        order = np.argsort(second[answered], kind="stable")
        by_second = us[answered][order]
        bounds = np.searchsorted(second[answered][order], np.arange(n_seconds + 1)).tolist()
        for k, sec in enumerate(result.seconds):
            sec.raw.extend(by_second[bounds[k] : bounds[k + 1]].tolist())


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
    hist: HdrHistogram = field(default_factory=new_histogram)  # of the admitted requests
    refused_hist: HdrHistogram = field(default_factory=new_histogram)  # refused: how fast they were told
    refused_raw: array[int] = field(default_factory=lambda: array("q"))
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
    # µs of CPU per answered transaction (warm-up included) of each process named to run_open_loop, over
    # the same span as client_cpu_s (warm-up, measured window and drain); "client" is this process,
    # "total" their sum.
    cpu_us_per_txn: dict[str, float] = field(default_factory=dict)
    # The request id of the first request of the measured window a sender with ``last_request_id``
    # sent (its ids only grow), and the latency as the logs see it, request record to reply record
    # (styx_benchmarks.log_latency), when the caller could read it.
    first_request_id: str | None = None
    latency_log_ms: dict[str, Any] | None = None
    # Of the replies the SDK client took during the run (warm-up included), the share a worker pushed
    # before their egress copy came (styx_client.sdk.push); None through the gateway.
    replies_pushed_share: float | None = None
    requests_pushed_share: float | None = None
    # Of the SDK client's ingress batches during the run: requests per batch, and the share that waited
    # for more first (busy linger, styx_py/io/batching.py); None through the gateway.
    requests_per_batch: float | None = None
    batches_lingered_share: float | None = None
    # How fast the machine ran Python just before and just after the run (benchmarks.cpu.loop_ms).
    machine_loop_ms: dict[str, float] | None = None  # {"before": ms, "after": ms}
    # What the cluster's epochs did over the run (warm-up included), from the coordinator's totals
    # before and after it (bench.engine_totals): epochs, per second, transactions per epoch, and
    # fallback runs per transaction.
    engine: dict[str, float] | None = None
    # A run cut short (Ctrl-C, SIGTERM): the seconds of its measured window that had passed; the
    # window, its seconds and the counts are then those of that span (run_open_loop's ``interrupted``).
    interrupted_after_s: float | None = None

    @property
    def throughput(self) -> float:
        """Answered requests (any status) per second, over the window or until the last of them was
        answered if that is later: a system that falls behind serves fewer than it was offered."""
        return self.answered / max(self.duration_s, self.last_reply_s)

    @property
    def served(self) -> float:
        """Answered requests that the cluster admitted (not refused) per second, like throughput."""
        return (self.answered - self.statuses["refused"]) / max(self.duration_s, self.last_reply_s)

    def build_histograms(self) -> None:
        for sec in self.seconds:
            record_all(sec.hist, sec.raw)
            self.hist.add(sec.hist)
        for label, raw in self.raw_by_label.items():
            record_all(self.by_label.setdefault(label, new_histogram()), raw)
            self.label_counts[label] = len(raw)
        record_all(self.refused_hist, self.refused_raw)

    def percentiles_ms(self, hist: HdrHistogram | None = None) -> dict[str, float]:
        h = hist or self.hist
        if h.get_total_count() == 0:
            return {f"p{p:g}": math.nan for p in PERCENTILES} | {"max": math.nan, "mean": math.nan}
        out = {f"p{p:g}": h.get_value_at_percentile(p) / 1000 for p in PERCENTILES}
        out["max"] = h.get_max_value() / 1000
        out["mean"] = h.get_mean_value() / 1000
        return out

    def set_latency_log(self, values_ms: list[int]) -> dict[str, Any]:
        """Set (and return) :attr:`latency_log_ms` from per-request latencies read from the logs (whole
        ms), summarised as the client-observed ones are, plus their ``count``."""
        summary: dict[str, Any] = {"count": len(values_ms)}
        if values_ms:
            hist = new_histogram()
            record_all(hist, array("q", (max(1, min(_HIST_MAX_US, v * 1000)) for v in values_ms)))
            summary = self.percentiles_ms(hist) | summary
        self.latency_log_ms = summary
        return summary

    def latency_curve_ms(self) -> dict[str, list[tuple[float, float]]]:
        """(percentile, ms) at ten points per decade of rarity (0, 20.6, 36.9 … 90 … 99 … 99.999),
        then the maximum at 100·(1 - 1/n) where the largest of n samples sits, overall (``all``) and per
        request kind: the data of the percentile plot."""
        out: dict[str, list[tuple[float, float]]] = {}
        for label, h in [("all", self.hist), *sorted(self.by_label.items())]:
            n = h.get_total_count()
            if not n:
                continue
            # Up to the percentile where 1 in n samples lies beyond (rarer points repeat the max).
            steps = min(50, int(10 * math.log10(n)))
            pts = [100.0 * (1.0 - 10 ** (-i / 10)) for i in range(steps + 1)]
            out[label] = [(round(p, 4), h.get_value_at_percentile(p) / 1000) for p in pts]
            out[label].append((round(100.0 * (1.0 - 1.0 / n), 6), h.get_max_value() / 1000))
        return out

    def drift(self) -> dict[str, float | None]:
        """How latency moved within the run, from the per-second p50s of the measured window: the
        least-squares slope (ms per second) and the mean p50 of its first and last thirds. A system
        in a steady state has a slope near 0; one whose costs grow with the run (a broker that scans
        its stored batches, a queue building up) does not."""
        points = [
            (i, s.hist.get_value_at_percentile(50) / 1000)
            for i, s in enumerate(self.seconds)
            if s.hist.get_total_count()
        ]
        if len(points) < 3:
            return {"p50_slope_ms_per_s": None, "p50_first_third_ms": None, "p50_last_third_ms": None}
        xs = np.array([x for x, _ in points], dtype=float)
        ys = np.array([y for _, y in points], dtype=float)
        slope = float(np.polyfit(xs, ys, 1)[0])
        third = max(1, len(points) // 3)
        return {
            "p50_slope_ms_per_s": round(slope, 2),
            "p50_first_third_ms": round(float(ys[:third].mean()), 2),
            "p50_last_third_ms": round(float(ys[-third:].mean()), 2),
        }

    @property
    def lost(self) -> int:
        """Requests that got no reply, or an error instead of one."""
        return self.unanswered + self.statuses["error"]

    def kept_up(self, p99_limit_ms: float = 1000.0) -> bool:
        """The admitted work kept up: nothing lost, some of it answered, p99 of the admitted requests under
        the limit. Refusals are allowed: that is admission control at work."""
        return (
            self.lost == 0
            and self.answered > self.statuses["refused"]
            and self.percentiles_ms()["p99"] < p99_limit_ms
        )

    def sustainable(self, p99_limit_ms: float = 1000.0, served_share: float = 0.98) -> bool:
        """Sustained its rate: the admitted work kept up (:meth:`kept_up`) and at least ``served_share``
        of the rate was served (admitted and answered)."""
        return self.kept_up(p99_limit_ms) and self.served >= served_share * self.rate

    def summary(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "sent": self.sent,
            "answered": self.answered,
            "unanswered": self.unanswered,
            "throughput": round(self.throughput, 1),
            "served": round(self.served, 1),  # admitted requests answered per second
            "refused": self.statuses["refused"],
            "last_reply_s": round(self.last_reply_s, 3),
            "actual_send_rate": round(self.actual_send_rate, 1),
            "send_lag_max_ms": round(self.send_lag_max_s * 1000, 2),
            # The load generator's own cost (driver + SDK, whole process), warm-up and drain included.
            "client_cpu_us_per_request": round(self.client_cpu_s / max(1, self.requests_total) * 1e6, 1),
            "cpu_us_per_txn": dict(self.cpu_us_per_txn),
            "drift": self.drift(),
            **({} if self.latency_log_ms is None else {"latency_log_ms": self.latency_log_ms}),
            **({} if (pushed := self.replies_pushed_share) is None else {"replies_pushed_share": pushed}),
            **({} if (share := self.requests_pushed_share) is None else {"requests_pushed_share": share}),
            **({} if (per := self.requests_per_batch) is None else {"requests_per_batch": per}),
            **({} if (share := self.batches_lingered_share) is None else {"batches_lingered_share": share}),
            **({} if (loop := self.machine_loop_ms) is None else {"machine_loop_ms": loop}),
            **({} if (engine := self.engine) is None else {"engine": engine}),
            "statuses": dict(self.statuses),
            "causes": dict(self.causes.most_common(20)),
            "latency_ms": self.percentiles_ms(),  # of the admitted requests
            **(
                {"latency_ms_refused": self.percentiles_ms(self.refused_hist)}
                if self.refused_hist.get_total_count()
                else {}
            ),
            "latency_ms_by_label": {
                label: self.percentiles_ms(h) | {"count": self.label_counts[label]}
                for label, h in sorted(self.by_label.items())
            },
            "sustainable_p99_1s": self.sustainable(),
            "check": self.check,
            "check_skipped": self.check_skipped or None,
            **({} if (cut := self.interrupted_after_s) is None else {"interrupted_after_s": cut}),
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
                    "refused": s.refused,
                    "replies_arrived": s.completed_here,
                    "committed_arrived": s.committed_here,
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
    processes: Mapping[str, int] | None = None,
    interrupted: Callable[[RunResult], None] | None = None,
) -> RunResult:
    """Send ``rate`` requests/s for ``warmup_s + duration_s`` seconds on the clock; wait for replies.

    Cancelled (Ctrl-C, SIGTERM) in its measured window, the run hands ``interrupted`` what it measured
    until then (a :class:`RunResult` of the window's part that had passed, ``interrupted_after_s``
    set; requests without a reply yet count as unanswered), then lets the cancellation through.

    ``processes`` (name -> pid, the cluster's processes) are charged their CPU time over the run, as
    this process is: ``RunResult.cpu_us_per_txn``.

    ``clock`` is ``perf_counter`` by default, not ``loop.time()``: uvloop's loop clock has 1 ms
    resolution and is cached per loop iteration, which would quantise every latency to whole
    milliseconds. The driver's own tests pass a virtual loop's clock (they run on simulated time)."""
    if rate <= 0 or duration_s <= 0 or warmup_s < 0:
        raise ValueError(f"rate and duration must be > 0 and warmup >= 0: {rate=} {duration_s=} {warmup_s=}")
    with steady_gc():
        return await _run_open_loop(
            workload,
            sender,
            rate,
            duration_s,
            warmup_s,
            seed,
            drain_s,
            progress,
            quiet,
            clock,
            processes or {},
            interrupted,
        )


async def _run_open_loop(
    workload: Workload,
    sender: Sender,
    rate: float,
    duration_s: float,
    warmup_s: float,
    seed: int,
    drain_s: float,
    progress: Callable[[str], None] | None,
    quiet: bool,
    clock: Callable[[], float],
    processes: Mapping[str, int],
    interrupted: Callable[[RunResult], None] | None,
) -> RunResult:
    import random

    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    result = RunResult(rate=rate, duration_s=duration_s, warmup_s=warmup_s)
    result.seconds = [Second() for _ in range(math.ceil(duration_s))]
    last_second = len(result.seconds) - 1
    total = round(rate * (warmup_s + duration_s))
    result.requests_total = total
    cluster_cpu = ProcessCpu(processes)
    cluster_cpu.start()
    cpu_start = time.process_time()
    first_measured = math.ceil(rate * warmup_s)
    start = clock() + 0.05
    window_end = start + warmup_s + duration_s
    inflight: set[asyncio.Future[Any]] = set()  # tasks of Sender.send
    # CallbackSender: no task or future per request; ``settled`` is each request's one callback.
    fast = cast(CallbackSender, sender) if hasattr(sender, "start") else None
    open_count = 0  # requests of the fast path without an outcome yet
    drained: asyncio.Future[None] | None = None  # set when open_count drops to 0 (during the drain)
    finished = False  # after the drain: outcomes that still come are not counted
    done_count = 0
    first_send = last_send = 0.0

    # Each measured request's outcome as it comes, in flat arrays (request i at i - first_measured);
    # every count, second and histogram is derived from them after the run (Outcomes.fill). A record
    # is a few stores: building the per-second counts per request costs ~2 µs of the load generator at
    # 8 000/s (py-spy: 5.8 % of its CPU; benchmarks/results/lean-client.md).
    outcomes = Outcomes(total - first_measured)

    def record(i: int, label: str, outcome: Outcome, finished: float) -> None:
        nonlocal done_count
        done_count += 1
        if i >= first_measured:
            outcomes.add(i - first_measured, label, outcome, finished)

    async def one(i: int, op: Op) -> None:
        try:
            outcome = await sender.send(op)
        except Exception as exc:  # noqa: BLE001 - a sender bug is counted, never lost in a task
            outcome = Outcome("error", f"{type(exc).__name__}: {exc}"[:80])
        record(i, op.label, outcome, clock())

    def settled(i: int, label: str, reply: Any, error: BaseException | None) -> None:
        nonlocal open_count
        if finished:
            return
        open_count -= 1
        assert fast is not None
        record(i, label, fast.outcome(reply, error), clock())
        if open_count == 0 and drained is not None and not drained.done():
            drained.set_result(None)

    def reporter() -> None:
        if progress is None or quiet:
            return
        elapsed = clock() - start
        phase = "warm-up" if elapsed < warmup_s else "measure"
        second = max(0, min(len(result.seconds), int(elapsed - warmup_s)) - 1)
        lo = max(0, math.ceil((second + warmup_s) * rate) - first_measured)
        hi = max(lo, math.ceil((second + 1 + warmup_s) * rate) - first_measured)
        recent = outcomes.latencies_us(lo, hi, start, first_measured, rate)
        p = {
            k: (recent[min(len(recent) - 1, int(q * len(recent)))] / 1000 if recent else math.nan)
            for k, q in (("p50", 0.5), ("p99", 0.99))
        }
        progress(
            f"  [{phase} {elapsed:5.1f}s] sent {sent:>8}  done {done_count:>8}  "
            f"in flight {len(inflight) + open_count:>6}  "
            f"p50 {p['p50']:7.1f} ms  p99 {p['p99']:7.1f} ms  aborted {outcomes.other['aborted']}  "
            f"errors {outcomes.other['error']}"
        )

    def scheduled_in_window(lo: int, hi: int, now: float) -> None:
        """Count requests ``lo .. hi - 1`` (all measured), sent together at ``now``, per second."""
        nonlocal first_send, last_send
        result.sent += hi - lo
        # The first of them is the latest behind its schedule.
        result.send_lag_max_s = max(result.send_lag_max_s, now - (start + lo / rate))
        if lo == first_measured:
            first_send = now
        last_send = now
        first = min(last_second, int(start + lo / rate - start - warmup_s))
        if first == min(last_second, int(start + (hi - 1) / rate - start - warmup_s)):
            result.seconds[first].scheduled += hi - lo
            return
        for i in range(lo, hi):  # a tick across a second's end: once a second
            result.seconds[min(last_second, int(start + i / rate - start - warmup_s))].scheduled += 1

    def cut_short() -> RunResult:
        """What the run measured until it was cancelled: the window up to now, its requests so far."""
        nonlocal finished
        finished = True  # outcomes that still come are not counted
        elapsed = min(duration_s, clock() - start - warmup_s)
        result.interrupted_after_s = result.duration_s = round(max(elapsed, 0.001), 3)
        del result.seconds[max(1, math.ceil(elapsed)) :]
        result.requests_total = sent
        result.unanswered = len(inflight) + open_count
        if result.sent > 1 and last_send > first_send:
            result.actual_send_rate = (result.sent - 1) / (last_send - first_send)
        result.client_cpu_s = time.process_time() - cpu_start
        cluster_cpu.stop()
        cluster_cpu.used["client"] = result.client_cpu_s
        result.cpu_us_per_txn = cluster_cpu.per_transaction_us(done_count)
        outcomes.fill(result, start, first_measured, rate)
        result.build_histograms()
        return result

    tick_s = tick_for(rate)
    sent = 0
    try:
        next_report = start + 1.0
        next_op = workload.next_op
        start_op = fast.start if fast is not None else None
        partial = functools.partial
        while sent < total:
            now = clock()
            due = min(total, int((now - start) * rate) + 1)
            if due > sent:
                if due > first_measured:
                    scheduled_in_window(max(sent, first_measured), due, now)
                for i in range(sent, due):
                    op = next_op(rng)
                    if start_op is not None:
                        open_count += 1
                        failed = start_op(op, partial(settled, i, op.label))
                        if failed is not None:  # failed locally (overload, bad request)
                            open_count -= 1
                            record(i, op.label, failed, clock())
                        elif i >= first_measured and result.first_request_id is None:
                            result.first_request_id = getattr(fast, "last_request_id", None)
                        continue
                    task = loop.create_task(one(i, op))
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
                await asyncio.sleep(max(tick_s, start + sent / rate - clock()))
        if result.sent > 1 and last_send > first_send:
            result.actual_send_rate = (result.sent - 1) / (last_send - first_send)
        # Drain: every request gets its reply or its own timeout; a stuck one counts as unanswered.
        deadline = max(window_end, clock()) + drain_s
        while (inflight or open_count) and clock() < deadline:
            if open_count:
                drained = loop.create_future()
            waiting = [*inflight, drained] if drained is not None else [*inflight]
            await asyncio.wait(waiting, timeout=min(1.0, deadline - clock()))
            drained = None
            if inflight or open_count:
                reporter()
    except asyncio.CancelledError:
        if interrupted is not None and clock() > start + warmup_s:  # else nothing was measured yet
            interrupted(cut_short())
        raise
    result.client_cpu_s = time.process_time() - cpu_start
    cluster_cpu.stop()
    cluster_cpu.used["client"] = result.client_cpu_s
    result.cpu_us_per_txn = cluster_cpu.per_transaction_us(done_count)
    # Fast-path requests still open are given up on: their outcomes, when they come (a timeout of
    # the sender, or its client closing), are not counted.
    finished = True
    left = [*inflight]
    result.unanswered = len(left) + open_count
    for pending in left:
        pending.cancel()
    if left:
        await asyncio.gather(*left, return_exceptions=True)
    outcomes.fill(result, start, first_measured, rate)
    result.build_histograms()
    if progress is not None:
        p = result.percentiles_ms()
        progress(
            f"  done: {result.answered}/{result.sent} answered at {result.throughput:.0f}/s "
            f"(asked {rate:g}/s, sent at {result.actual_send_rate:.0f}/s)  p50 {p['p50']:.1f} ms  "
            f"p99 {p['p99']:.1f} ms  p99.9 {p['p99.9']:.1f} ms  max {p['max']:.1f} ms  "
            f"{dict(result.statuses)}"
        )
        drift = result.drift()
        if drift["p50_slope_ms_per_s"] is not None:
            progress(
                f"  drift: p50 {drift['p50_first_third_ms']:.1f} ms in the first third of the window, "
                f"{drift['p50_last_third_ms']:.1f} ms in the last ({drift['p50_slope_ms_per_s']:+.2f} ms/s)"
            )
        cpu = "  ".join(f"{name} {us:g}" for name, us in result.cpu_us_per_txn.items())
        progress(f"  CPU µs per transaction: {cpu}")
    return result


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
