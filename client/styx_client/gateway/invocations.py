"""What the ``/v1`` invocation and state routes do, as outcomes (``app.py`` turns them into responses).

Idempotency: a request id comes from the ``Idempotency-Key`` header, else the body's ``request_id``,
else a fresh id, and is the request id the cluster sees (so server-side dedup applies as well). A
client-chosen id is looked up first in the reply cache (a final reply: the identical body again), then
among the pending jobs (join it); only then is a new job started. Reusing an id with a different payload
is 422 ``idempotency_key_reused``.

Replies any replica can serve: ``GET /v1/invocations/{id}`` for an id this process neither caches nor
runs asks the cluster (:mod:`.lookups`), polling with a growing interval (``lookup_interval_s`` up to
``max_lookup_interval_s``) until ``wait_s`` ends. A POST retried on another replica is simply sent
again with the same request id: the cluster answers a resent id from its reply table without running
it twice (or, while the first copy runs, with that copy's reply).
"""

import asyncio
import contextlib
import hashlib
import json
from typing import Any, Protocol

import msgspec

from styx_client.gateway.cluster import ClusterLink
from styx_client.gateway.config import GatewayConfig
from styx_client.gateway.jobs import GatewayStats, Job, JobCall, Jobs
from styx_client.gateway.lookups import ClusterReplies, Found
from styx_client.gateway.models import (
    ID_RE,
    MAX_ID_CHARS,
    InvocationAccepted,
    StateView,
)
from styx_client.gateway.outcomes import Outcome, failure, ok, reply_outcome, retry_after
from styx_client.gateway.replies import ReplyCache
from styx_client.sdk import RequestIds
from styx_py.core.errors import BadRequest
from styx_py.core.requests import encode_request
from styx_py.core.wire import Key

__all__ = ["InvocationCall", "Invocations"]


class InvocationCall(Protocol):
    """A validated ``POST /v1/invocations`` body: the pydantic ``InvocationRequest`` of FastAPI's
    handler or the msgspec ``InvocationBody`` of the lean one (:mod:`.lean`)."""

    @property
    def operator(self) -> str: ...
    @property
    def key(self) -> Key: ...
    @property
    def function(self) -> str: ...
    @property
    def args(self) -> list[Any]: ...
    @property
    def request_id(self) -> str | None: ...


class Invocations:
    """Invocations by request id: cached replies first, then pending jobs, then a new job."""

    def __init__(
        self,
        config: GatewayConfig,
        link: ClusterLink,
        jobs: Jobs,
        replies: ReplyCache,
        stats: GatewayStats,
        cluster_replies: ClusterReplies,
    ) -> None:
        self.config = config
        self.link = link
        self.jobs = jobs
        self.replies = replies
        self.stats = stats
        self.cluster_replies = cluster_replies
        self._new_rid = RequestIds()  # for requests without a client-chosen id

    async def invoke(
        self, body: InvocationCall, idempotency_key: str | None, wait: bool, timeout_s: float | None
    ) -> Outcome:
        """``POST /v1/invocations``: the reply, 202 (``wait`` false) or why there is none."""
        rid, problem = _request_id(idempotency_key, body.request_id)
        if problem is not None:
            return problem
        if rid is None:
            job = self._start(self._new_rid(), None, body)
        else:
            fingerprint = _fingerprint(body.operator, body.key, body.function, body.args)
            cached = self._cached(rid, fingerprint, wait)
            if cached is not None:
                return cached
            job = self._join(rid, fingerprint, body)
        if isinstance(job, Outcome):
            return job
        if not wait:
            return _accepted(job.rid)
        return await self.jobs.wait(job, timeout_s or self.config.timing.reply_timeout_s)

    def _cached(self, rid: str, fingerprint: bytes, wait: bool) -> Outcome | None:
        """The cached reply for ``rid`` (202 without ``wait``), 422 for a reused id, None if not cached."""
        cached = self.replies.get(rid)
        if cached is None:
            return None
        if cached.fingerprint != fingerprint:
            return _reused(rid)
        self.stats.idempotent_hits += 1
        return cached.outcome if wait else _accepted(rid)

    def _join(self, rid: str, fingerprint: bytes, body: InvocationCall) -> Job | Outcome:
        """The pending job for ``rid`` (422 for a reused id), else a new one."""
        job = self.jobs.get(rid)
        if job is None:
            return self._start(rid, fingerprint, body)
        if job.fingerprint != fingerprint:
            return _reused(rid)
        self.stats.joined_in_flight += 1
        return job

    def _start(self, rid: str, fingerprint: bytes | None, body: InvocationCall) -> Job | Outcome:
        call: JobCall = (body.operator, body.key, body.function, body.args)
        return self._admit(rid, fingerprint, call, cache=True, request_id=rid)

    def _admit(
        self, rid: str, fingerprint: bytes | None, call: JobCall, *, cache: bool, request_id: str | None
    ) -> Job | Outcome:
        """Start a job for ``call`` unless the cluster cannot take it (503), its target is not deployed
        (404), its key is not UTF-8 (422), it breaks a limit every path checks (422 ``bad_request``)
        or too many are pending (429)."""
        operator, key, function, _args = call
        problem = self.link.unavailable(request_id) or self.link.check_target(operator, function)
        if problem is None and isinstance(key, str) and not _utf8(key):
            problem = failure(422, "invalid_request", "key is not valid UTF-8 (lone surrogate)")
        if problem is None:
            problem = _limits(rid, call)
        if problem is not None:
            return problem
        backend = self.link.backend
        assert backend is not None, "unavailable() answers 503 until the backend is connected"
        return self.jobs.start(rid, fingerprint, call, backend, cache=cache)

    async def fetch(self, rid: str, wait_s: float) -> Outcome:
        """``GET /v1/invocations/{rid}``: the cached reply, the job's once done (long-poll), else the
        cluster's (any replica's request), else 202 (running) / 404 (unknown) / 503 (cannot tell)."""
        cached = self.replies.get(rid)
        if cached is not None:
            return cached.outcome
        job = self.jobs.get(rid)
        if job is None:
            return await self._from_cluster(rid, wait_s)
        if wait_s > 0:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(job.done), wait_s)
        return _pending(rid)

    async def _from_cluster(self, rid: str, wait_s: float) -> Outcome:
        """The reply the cluster's reply tables hold for ``rid``, polled until ``wait_s`` has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        interval = self.config.timing.lookup_interval_s
        while True:
            found = await self.cluster_replies.find(rid)
            reply = found.reply
            if reply is not None:
                self.stats.cluster_hits += 1
                return reply_outcome(reply, None, self.config.timing.retry_after_s)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return self.not_found(rid, found)
            await asyncio.sleep(min(interval, remaining))
            interval = min(2 * interval, self.config.timing.max_lookup_interval_s)

    def not_found(self, rid: str, found: Found) -> Outcome:
        """No reply anywhere: 202 while it runs, 503 when some worker could not say, else 404."""
        if found.pending:
            return _pending(rid)
        if not found.complete:
            why = found.error or "a worker is recovering or did not answer"
            return failure(
                503,
                "unavailable",
                f"cannot tell whether {rid!r} has a reply: {why}; retry shortly",
                request_id=rid,
                headers=retry_after(self.config.timing.retry_after_s),
            )
        return failure(
            404,
            "unknown_request",
            f"no invocation {rid!r} is pending here or has a reply in the cluster (each partition keeps "
            "its latest replies); one sent moments ago may not have reached its worker yet: long-poll "
            "with wait_s",
            request_id=rid,
        )

    async def state(self, operator: str, key: Key, timeout_s: float) -> Outcome:
        """``GET /v1/state/{operator}/{key}``: the operator's state function, run as a transaction."""
        function = self.link.state_function(operator)
        if function is None:
            problem = self.link.unavailable(None) or self.link.check_target(operator, None)
            return problem or _no_state(operator)
        rid = f"state-{self._new_rid()}"
        started = self._admit(rid, None, (operator, key, function, []), cache=False, request_id=None)
        if isinstance(started, Outcome):
            return started
        outcome = await self.jobs.wait(started, timeout_s)
        if outcome.status != 200:
            return outcome
        reply = msgspec.json.decode(outcome.body)
        view = StateView(
            operator=operator,
            key=key,
            value=reply["result"],
            function=function,
            tid=reply["tid"],
            epoch=reply["epoch"],
        )
        return ok(view)


def _request_id(header: str | None, body_id: str | None) -> tuple[str | None, Outcome | None]:
    """The client-chosen request id (header first), or an answer saying why it is unusable."""
    if header is not None:
        if not (0 < len(header) <= MAX_ID_CHARS and ID_RE.fullmatch(header)):
            return None, failure(
                400,
                "bad_idempotency_key",
                f"Idempotency-Key must be 1..{MAX_ID_CHARS} characters of [A-Za-z0-9._:~@+=-]",
            )
        if body_id is not None and body_id != header:
            return None, failure(
                400,
                "conflicting_request_id",
                "the Idempotency-Key header and the body's request_id differ",
                request_id=header,
            )
        return header, None
    return body_id, None


def _fingerprint(operator: str, key: Key, function: str, args: list[Any]) -> bytes:
    """Identity of a payload, to refuse an idempotency key reused for a different request."""
    call = [operator, key, function, args]
    try:
        canonical = msgspec.json.encode(call, order="sorted")
    except UnicodeEncodeError:
        canonical = json.dumps(call, sort_keys=True, ensure_ascii=True).encode()
    return hashlib.sha256(canonical).digest()


def _limits(rid: str, call: JobCall) -> Outcome | None:
    """422 ``bad_request`` for a request the cluster would refuse: the core's checks (size, argument
    nesting, lengths), the same as the SDK's and the workers'."""
    operator, key, function, args = call
    try:
        encode_request(rid, operator, function, key, args)
    except BadRequest as exc:
        return failure(422, "bad_request", str(exc), request_id=rid)
    return None


def _pending(rid: str) -> Outcome:
    return ok(InvocationAccepted(request_id=rid, location=f"/v1/invocations/{rid}"), 202)


def _accepted(rid: str) -> Outcome:
    location = f"/v1/invocations/{rid}"
    return ok(InvocationAccepted(request_id=rid, location=location), 202, (("Location", location),))


def _reused(rid: str) -> Outcome:
    return failure(
        422,
        "idempotency_key_reused",
        f"request id {rid!r} was already used for a different request",
        request_id=rid,
    )


def _no_state(operator: str) -> Outcome:
    return failure(
        404,
        "no_state_function",
        f"operator {operator!r} declares no state function (@op.function(state=True), or a single "
        "read-only function without arguments) and the gateway has no --state-function OPERATOR=FUNCTION",
    )


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
