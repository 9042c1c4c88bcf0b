"""Jobs: invocations handed to the cluster, one task each in the gateway's task group.

A job is started once per request id and every HTTP waiter for that id awaits the same future, so a
retry while the first attempt runs joins it and the request is never sent twice by this gateway. A job
waits for its reply up to ``max_reply_timeout_s`` even when its HTTP caller stopped waiting earlier, and
stores a final reply in the idempotency table (:class:`~styx_client.gateway.replies.ReplyCache`).
"""

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from styx_client.gateway.cluster import Backend
from styx_client.gateway.config import GatewayConfig
from styx_client.gateway.metrics import GatewayMetrics
from styx_client.gateway.outcomes import Outcome, failure, overloaded, reply_outcome, retry_after
from styx_client.gateway.recent import Recent, RecentInvocations
from styx_client.gateway.replies import ReplyCache
from styx_py.core.errors import BadRequest, Overloaded, RequestTimeout, StyxError
from styx_py.core.wire import Key, Reply

__all__ = ["GatewayStats", "Job", "JobCall", "Jobs"]

JobCall = tuple[str, Key, str, list[Any]]
"""What a job runs: ``(operator, key, function, args)``."""


@dataclass(slots=True)
class GatewayStats:
    """Counters for tests and monitoring (monotonic)."""

    jobs_started: int = 0
    peak_pending: int = 0
    idempotent_hits: int = 0
    joined_in_flight: int = 0
    shed: int = 0
    cluster_hits: int = 0
    """``GET /v1/invocations/{id}`` answered from the cluster's reply tables (another replica's request)."""


@dataclass(slots=True)
class Job:
    """One request handed to the cluster; every HTTP waiter for its id awaits ``done``."""

    rid: str
    fingerprint: bytes | None
    done: asyncio.Future[Outcome]
    cache: bool
    entry: Recent | None = None
    """Its entry in the recent-invocations window (the invocations clients sent, not state reads)."""
    reply: Reply | None = None


class Jobs:
    """The pending jobs by request id, bounded by ``max_pending``.

    Jobs run in :attr:`group`, the gateway's task group, which :meth:`Gateway.run` sets while it serves.
    """

    def __init__(
        self,
        config: GatewayConfig,
        replies: ReplyCache,
        stats: GatewayStats,
        metrics: GatewayMetrics,
        recent: RecentInvocations,
    ) -> None:
        self.config = config
        self.replies = replies
        self.recent = recent
        self.stats = stats
        self.metrics = metrics
        self.group: asyncio.TaskGroup | None = None
        self._pending: dict[str, Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, rid: object) -> bool:
        return rid in self._pending

    def get(self, rid: str) -> Job | None:
        return self._pending.get(rid)

    def overloaded(self, message: str) -> Outcome:
        return overloaded(message, self.config.timing.retry_after_s)

    def start(
        self, rid: str, fingerprint: bytes | None, call: JobCall, backend: Backend, *, cache: bool
    ) -> Job | Outcome:
        """Admit and start one invocation, or answer 429 (nothing is sent then).

        The caller has checked availability and the target first.
        """
        if len(self._pending) >= self.config.limits.max_pending:
            self.stats.shed += 1
            return self.overloaded(
                f"{len(self._pending)} invocations pending (max_pending={self.config.limits.max_pending})"
            )
        assert self.group is not None, "Gateway.run() is not running"
        job = Job(rid, fingerprint, asyncio.get_running_loop().create_future(), cache)
        if cache:
            job.entry = self.recent.started(rid, *call)
        self._pending[rid] = job
        self.stats.jobs_started += 1
        self.stats.peak_pending = max(self.stats.peak_pending, len(self._pending))
        task = self.group.create_task(self._execute(job, call, backend), name=f"job-{rid[:16]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    def cancel(self) -> None:
        """Cancel every running job (their waiters get 503): the gateway is shutting down."""
        for task in list(self._tasks):
            task.cancel()

    async def wait(self, job: Job, timeout_s: float) -> Outcome:
        """The job's outcome, or 504 after ``timeout_s`` (the job goes on)."""
        try:
            return await asyncio.wait_for(asyncio.shield(job.done), timeout_s)
        except TimeoutError:
            return failure(
                504,
                "timeout",
                f"no reply within {timeout_s} s; the transaction may still commit: GET "
                f"/v1/invocations/{job.rid} or retry with the same Idempotency-Key",
                request_id=job.rid,
            )

    async def _execute(self, job: Job, call: JobCall, backend: Backend) -> None:
        outcome: Outcome | None = None
        started = time.perf_counter()
        try:
            outcome = await self._submit(job, call, backend)
        except asyncio.CancelledError:
            outcome = failure(503, "unavailable", "the gateway is shutting down", request_id=job.rid)
            raise
        finally:
            del self._pending[job.rid]
            if job.entry is not None and outcome is not None:
                elapsed_ms = (time.perf_counter() - started) * 1000
                self.recent.finished(job.entry, outcome, job.reply, elapsed_ms)
            if outcome is not None and not job.done.done():
                job.done.set_result(outcome)

    async def _submit(self, job: Job, call: JobCall, backend: Backend) -> Outcome:
        """Send the request and wait for its reply; the HTTP answer either way (a final one is cached)."""
        operator, key, function, args = call
        started = time.perf_counter()
        try:
            reply = await backend.submit(
                operator, key, function, *args, request_id=job.rid, timeout_s=self.config.timing.job_timeout_s
            )
        except StyxError as exc:
            return self._not_replied(job.rid, exc)
        job.reply = reply
        elapsed = time.perf_counter() - started
        self.metrics.transactions.labels(reply.status).observe(elapsed)
        outcome = reply_outcome(reply, elapsed * 1000, self.config.timing.retry_after_s)
        if job.cache and outcome.status < 500:
            self.replies.put(job.rid, job.fingerprint, outcome)
        return outcome

    def _not_replied(self, rid: str, exc: StyxError) -> Outcome:
        """The answer for a request the client raised on (no reply from the cluster)."""
        match exc:
            case RequestTimeout():
                message = (
                    f"no reply within {self.config.timing.job_timeout_s} s; the transaction may still commit"
                )
                return failure(504, "timeout", message, request_id=rid)
            case Overloaded():
                return self.overloaded(str(exc))
            case BadRequest():  # raised locally by the client: nothing was sent
                return failure(422, "bad_request", str(exc), request_id=rid)
            case _:
                headers = retry_after(self.config.timing.retry_after_s)
                message = f"cannot reach the cluster: {exc}"
                return failure(503, "unavailable", message, request_id=rid, headers=headers)
