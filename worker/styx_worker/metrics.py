"""Prometheus metrics of one worker (served by :class:`styx_py.io.metrics.MetricsServer`).

Cheap by construction: the worker's totals (summed once per epoch), its gauges and the ingress
consumer's high watermarks are read at scrape time by a collector; only snapshot uploads and
recoveries (rare, off the epoch loop) observe histograms. Nothing is added per transaction.
The worker is seen only through :class:`MetricsSource`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from styx_py.core.wire import Status
from styx_py.io.metrics import SLOW_BUCKETS_S, SNAPSHOT_BYTES_BUCKETS
from styx_worker.txn import Tally

if TYPE_CHECKING:
    from styx_worker.egress import KafkaSink
    from styx_worker.ingress import KafkaIngress

__all__ = ["ABORT_CAUSES", "MetricsSource", "WorkerGauges", "WorkerMetrics"]


@dataclass(frozen=True)
class WorkerGauges:
    rescheduled_waiting: int
    ingress_buffered: int
    inflight_tasks: int
    open_epochs: int
    waiting_resends: int
    partitions: int
    generation: int
    completed_epoch: int
    push_clients: int  # clients subscribed to their replies (styx_worker.feed)
    replies_pushed: int  # since the start (a counter)
    changelog_skipped: int = 0  # changelog records replays found on the topic already (a counter)
    external_calls_pending: int = 0  # intents in this worker's partitions (styx_worker.outbox)
    external_calls_running: int = 0  # of them, being called now
    timers_pending: int = 0  # timers in this worker's partitions
    admission_size: int = 0  # the batch size admission control chose (styx_worker.admission)


class MetricsSource(Protocol):
    """What the metrics read of a worker, at scrape time."""

    @property
    def totals(self) -> Tally: ...

    def gauges(self) -> WorkerGauges: ...

    def readiness(self) -> tuple[bool, str]: ...


# Reply status of an aborted transaction -> the cause label; anything else is "other".
ABORT_CAUSES = {Status.ABORT: "user_abort", Status.ERROR: "user_error", Status.BAD: "bad_request"}


class WorkerMetrics:
    def __init__(self, source: MetricsSource) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.snapshot_duration = Histogram(
            "styx_worker_snapshot_upload_duration_seconds",
            "uploading this worker's part of a snapshot to S3",
            buckets=SLOW_BUCKETS_S,
            registry=r,
        )
        self.snapshot_size = Histogram(
            "styx_worker_snapshot_size_bytes",
            "bytes this worker uploaded for one snapshot",
            buckets=SNAPSHOT_BYTES_BUCKETS,
            registry=r,
        )
        self.snapshot_failures = Counter(
            "styx_worker_snapshot_failures", "snapshot uploads that failed", registry=r
        )
        self.recovery_duration = Histogram(
            "styx_worker_recovery_duration_seconds",
            "restoring the last snapshot and reading the logs, per recovery",
            buckets=SLOW_BUCKETS_S,
            registry=r,
        )
        self.recoveries = Counter("styx_worker_recoveries", "recoveries, by result", ["result"], registry=r)
        self._recovered, self._recovery_failed = (
            self.recoveries.labels("ok"),
            self.recoveries.labels("failed"),
        )
        self.source = source
        self.collector = _Collector(source)
        r.register(self.collector)

    def readiness(self) -> tuple[bool, str]:
        """``/readyz``: part of a deployed cluster and not recovering."""
        return self.source.readiness()

    def watch_kafka(self, ingress: KafkaIngress, sink: KafkaSink) -> None:
        """Also report the Kafka ingress lag and the producer queue (real processes only)."""
        self.collector.ingress = ingress
        self.collector.sink = sink

    def snapshot(self, ok: bool, seconds: float, size: int) -> None:
        if ok:
            self.snapshot_duration.observe(seconds)
            self.snapshot_size.observe(size)
        else:
            self.snapshot_failures.inc()

    def recovery(self, ok: bool, seconds: float) -> None:
        if ok:
            self._recovered.inc()
            self.recovery_duration.observe(seconds)
        else:
            self._recovery_failed.inc()


class _Collector(Collector):
    def __init__(self, source: MetricsSource) -> None:
        self.source = source
        self.ingress: KafkaIngress | None = None
        self.sink: KafkaSink | None = None

    def collect(self) -> Iterator[Metric]:
        t = self.source.totals
        g = self.source.gauges()
        yield CounterMetricFamily(
            "styx_worker_epochs", "epochs this worker completed (rate: epochs/s)", value=t.epochs
        )
        yield CounterMetricFamily(
            "styx_worker_changelog_replay_skipped",
            "changelog records a replay did not write again: the topic held them already",
            value=g.changelog_skipped,
        )
        yield CounterMetricFamily(
            "styx_worker_transactions_committed",
            "transactions rooted on this worker that committed",
            value=t.committed,
        )
        aborted = CounterMetricFamily(
            "styx_worker_transactions_aborted",
            "transactions rooted on this worker that aborted, by cause: user_abort (Abort raised), "
            "user_error (another exception in user code), bad_request (unknown operator/function, "
            "bad key or arguments)",
            labels=["cause"],
        )
        by_status = t.by_status
        other = sum(by_status) - sum(by_status[s] for s in ABORT_CAUSES)
        for status, cause in ABORT_CAUSES.items():
            aborted.add_metric([cause], by_status[status])
        aborted.add_metric(["other"], other)
        yield aborted
        yield CounterMetricFamily(
            "styx_worker_transactions_fallback",
            "transactions re-run under locks after an Aria conflict (counted on every worker)",
            value=t.fallback,
        )
        yield CounterMetricFamily(
            "styx_worker_transactions_rescheduled",
            "transactions moved to the next epoch (read/write set changed in the fallback phase)",
            value=t.rescheduled,
        )
        yield CounterMetricFamily(
            "styx_worker_requests_refused",
            "new requests not admitted (over the admission bound), answered refused / Overloaded",
            value=t.refused,
        )
        yield GaugeMetricFamily(
            "styx_worker_admission_size",
            "the batch size admission control chose for the next epoch (at most epoch_size_max)",
            value=g.admission_size,
        )
        yield GaugeMetricFamily(
            "styx_worker_rescheduled_waiting",
            "rescheduled transactions waiting for the next epoch",
            value=g.rescheduled_waiting,
        )
        yield GaugeMetricFamily(
            "styx_worker_ingress_buffered",
            "requests fetched from Kafka, not yet sequenced (bounded by max_pending_requests)",
            value=g.ingress_buffered,
        )
        yield GaugeMetricFamily(
            "styx_worker_inflight_tasks", "invocation and upload tasks running", value=g.inflight_tasks
        )
        yield GaugeMetricFamily(
            "styx_worker_open_epochs", "epochs started and not finished", value=g.open_epochs
        )
        yield GaugeMetricFamily(
            "styx_worker_waiting_resends",
            "resent request ids waiting for their first copy's reply",
            value=g.waiting_resends,
        )
        yield GaugeMetricFamily("styx_worker_partitions", "partitions this worker owns", value=g.partitions)
        yield GaugeMetricFamily(
            "styx_worker_external_calls_pending",
            "external calls asked for in this worker's partitions whose outcome has not committed",
            value=g.external_calls_pending,
        )
        yield GaugeMetricFamily(
            "styx_worker_external_calls_running",
            "external calls this worker is making now (attempts and backoff)",
            value=g.external_calls_running,
        )
        yield GaugeMetricFamily(
            "styx_worker_timers_pending",
            "timers in this worker's partitions not fired or cancelled yet",
            value=g.timers_pending,
        )
        yield GaugeMetricFamily(
            "styx_worker_generation", "the generation this worker runs", value=g.generation
        )
        yield GaugeMetricFamily(
            "styx_worker_completed_epoch", "the last epoch completed", value=g.completed_epoch
        )
        yield GaugeMetricFamily(
            "styx_worker_push_clients", "clients this worker pushes their replies to", value=g.push_clients
        )
        yield CounterMetricFamily(
            "styx_worker_replies_pushed",
            "replies pushed to their clients as they left for the egress topic",
            value=g.replies_pushed,
        )
        if self.ingress is not None:
            lag = GaugeMetricFamily(
                "styx_worker_ingress_lag",
                "ingress requests on Kafka not yet sequenced: the partition's high watermark minus the "
                "next offset to sequence (known after the first fetch)",
                labels=["partition"],
            )
            for partition, value in sorted(self.ingress.lag().items()):
                lag.add_metric([str(partition)], value)
            yield lag
            yield CounterMetricFamily(
                "styx_worker_ingress_skipped",
                "ingress records skipped: not a request, and no usable request id to answer",
                value=self.ingress.counts.skipped,
            )
            pushed = CounterMetricFamily(
                "styx_worker_ingress_pushed",
                "ingress records pushed by their clients: taken (before the fetch had them), late (the "
                "fetch had them first, or not read here), mismatched (unlike the topic's copy: never "
                "expected; logged)",
                labels=["outcome"],
            )
            pushed.add_metric(["taken"], self.ingress.counts.pushed_taken)
            pushed.add_metric(["late"], self.ingress.counts.pushed_late)
            pushed.add_metric(["mismatched"], self.ingress.counts.push_mismatches)
            yield pushed
            yield CounterMetricFamily(
                "styx_worker_ingress_unpushed",
                "ingress records the fetch brought first, while requests were pushed, whose push did not "
                "come in time (styx_worker.pace): such records put the configured fetch wait back",
                value=self.ingress.pace.unpushed,
            )
            yield CounterMetricFamily(
                "styx_worker_ingress_paced_polls",
                "ingress polls followed by a pause: the fetch only confirmed pushed records (worker.pace)",
                value=self.ingress.counts.paced,
            )
            yield GaugeMetricFamily(
                "styx_worker_ingress_fetch_wait_ms",
                "the ingress consumer's fetch wait now: longer while idle, while requests come pushed, or "
                "while the broker starves it (styx_py/io/fetching.py)",
                value=self.ingress.fetch_wait.applied_ms,
            )
        if self.sink is not None:
            yield GaugeMetricFamily(
                "styx_worker_egress_queued",
                "replies and sequencer-log entries waiting for the Kafka producer",
                value=self.sink.queued,
            )
            yield CounterMetricFamily(
                "styx_worker_egress_records", "records handed to the Kafka producer", value=self.sink.sent
            )
            yield CounterMetricFamily(
                "styx_worker_changelog_records",
                "changelog records queued for the Kafka producer (one per committed write)",
                value=self.sink.changelog_records,
            )
            every = (self.sink.lanes, self.sink.log_lanes, self.sink.request_lanes)
            yield CounterMetricFamily(
                "styx_worker_produce_in_doubt_found",
                "records of a produce in doubt (the broker may have stored it without answering) found "
                "stored when read back, so not sent again (styx_py/io/indoubt.py)",
                value=sum(lanes.found_in_doubt for lanes in every),
            )
            yield CounterMetricFamily(
                "styx_worker_produce_in_doubt_resent",
                "records of a produce in doubt not found stored when read back, so sent again",
                value=sum(lanes.resent_in_doubt for lanes in every),
            )
            yield CounterMetricFamily(
                "styx_worker_egress_batches",
                "record batches produced (replies and sequencer-log entries): what a broker that stores "
                "batches one by one pays for, more than for records",
                value=self.sink.lanes.batches_sent,
            )
