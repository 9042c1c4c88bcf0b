"""The audit's checks of external calls and timers (pure; docs/effects.md), made during the serial replay.

The intents and the timers are state of the system operators ``styx.outbox`` and ``styx.timers``
(:mod:`styx_py.core.effects`), written by the transactions that ask for them; the logs do not carry
them, so :class:`EffectsCheck` follows that state through the serial replay's writes (an intent's
recording transaction, a timer's due time as recorded) and takes the completions and the firings from
the logged requests and the cluster's replies (``styx.outbox.complete`` answers True when it took
effect, ``styx.timers.fire`` answers "fired").

- ``effects.response`` — each intent a committed transaction recorded has exactly one completion that
  took effect by the end of the log, or is still pending in the replay's final ``styx.outbox`` state
  (a warning: the run ended with calls in flight); no completion takes effect for an intent that was
  never recorded or was cleared otherwise.
- ``effects.continuation`` — per idempotency key, at most one completion request took effect (so the
  continuation ran once), and it is the transaction that cleared the intent in the serial replay.
- ``timers.fired`` — each timer fired at most once, only a timer that was set, and not before its due
  time: the firing transaction's sequenced time (its ingress record's timestamp, ``ctx.now()``) is at
  least the due time the setting transaction recorded.

A completion whose continuation failed is written again by the worker to record the outcome without
it (``styx.outbox.complete`` with the failure: it answers "continuation failed: …"); that one is the
completion that took effect. :meth:`EffectsCheck.tally` says how much was checked: intents recorded,
completions (responses) that took effect, continuations run and failed, timers set and fired.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from styx_py.audit.rules import ERROR, INFO, WARNING, Finding
from styx_py.core.effectids import OUTBOX, TIMERS
from styx_py.core.wire import decode_value

__all__ = ["TALLY", "EffectsCheck", "settled"]

TALLY = "effects.checked"  # the check name of :meth:`EffectsCheck.tally`'s finding (severity INFO)
SETTLED = "continuation failed: "


def settled(result: Any) -> bool:
    """Whether a completion's result says it recorded the outcome without its failed continuation."""
    return isinstance(result, str) and result.startswith(SETTLED)


EntityKey = tuple[str, Any]


def _where(epoch: int, tid: int) -> str:
    return f"tid {tid} epoch {epoch}"


class EffectsCheck:
    """Fed every committed transaction in commit order (:meth:`feed`), with its request, the cluster's
    reply result (decoded) and the serial replay's writes (encoded values, None: deleted)."""

    def __init__(self, max_findings: int = 20) -> None:
        self.max_findings = max_findings
        self.state: dict[EntityKey, dict[str, Any]] = {}  # the system operators' state, as replayed
        self.recorded: dict[str, str] = {}  # call id -> where it was recorded
        self.cleared: dict[str, str] = {}  # call id -> where the replay cleared it (last time)
        self.took_effect: dict[str, list[str]] = {}  # call id -> completion request ids that took effect
        self.due: dict[str, int] = {}  # timer id -> due time (ms) as recorded
        self.fired: dict[str, list[str]] = {}  # timer id -> firing request ids
        self.findings: list[Finding] = []
        self.counts: dict[tuple[str, str], int] = {}
        self.calls = 0
        self.timers = 0
        self.responses = 0  # completions that took effect
        self.continuations = 0  # of those, the ones that ran a continuation
        self.continuations_failed = 0  # ... and the ones that recorded the outcome of a failed one
        self.fires = 0  # timers fired (their target called)
        self.with_then: set[str] = set()  # call ids whose intent, as cleared last, had a continuation

    def _find(self, check: str, subject: str, message: str, severity: str = ERROR) -> None:
        n = self.counts[check, severity] = self.counts.get((check, severity), 0) + 1
        if n <= self.max_findings:
            self.findings.append(Finding(check, subject, message, severity))

    def feed(
        self,
        request_id: str,
        operator: str,
        function: str,
        args: Any,
        now_ms: int,
        epoch: int,
        tid: int,
        result: Any,
        writes: Mapping[EntityKey, bytes | None],
    ) -> None:
        where = _where(epoch, tid)
        added: set[str] = set()
        removed: set[str] = set()
        for entity, raw in writes.items():
            if entity[0] not in (OUTBOX, TIMERS):
                continue
            before = self.state.get(entity, {})
            after: dict[str, Any] = {} if raw is None else dict(decode_value(raw))
            if after:
                self.state[entity] = after
            else:
                self.state.pop(entity, None)
            for name in after.keys() - before.keys():
                added.add(name)
                if entity[0] == OUTBOX:
                    self.calls += 1
                    self.recorded[name] = where
                    self.took_effect.pop(name, None)  # a new intent under a completed key: a new call
                else:
                    self.timers += 1
                    self.due[name] = int(after[name][0])
                    self.fired.pop(name, None)
            for name in before.keys() - after.keys():
                removed.add(name)
                if entity[0] == OUTBOX:
                    self.cleared[name] = where
                    if before[name][3]:
                        self.with_then.add(name)
                    else:
                        self.with_then.discard(name)
        if operator == OUTBOX and function == "complete" and (result is True or settled(result)):
            call = str(args[0])
            self.responses += 1
            if settled(result):
                self.continuations_failed += 1
            elif call in self.with_then and call in removed:
                self.continuations += 1
            self._completed(request_id, call, where, removed)
        elif operator == TIMERS and function == "fire" and result == "fired":
            self.fires += 1
            self._fired(request_id, str(args[0]), now_ms, where)

    def _completed(self, request_id: str, call: str, where: str, removed: set[str]) -> None:
        done = self.took_effect.setdefault(call, [])
        done.append(request_id)
        if call not in self.recorded:
            self._find(
                "effects.response",
                call,
                f"completion {request_id} ({where}) took effect for intent {call!r}, which no committed "
                "transaction recorded",
            )
        if len(done) > 1:
            self._find(
                "effects.continuation",
                call,
                f"intent {call!r}: {len(done)} completions took effect ({', '.join(done)}; the last at "
                f"{where}): its continuation ran more than once",
            )
        if call not in removed:
            self._find(
                "effects.continuation",
                call,
                f"completion {request_id} ({where}) says it took effect for {call!r}, but in the serial "
                "replay it did not clear that intent",
            )

    def _fired(self, request_id: str, timer: str, now_ms: int, where: str) -> None:
        fires = self.fired.setdefault(timer, [])
        fires.append(request_id)
        due = self.due.get(timer)
        if due is None:
            self._find(
                "timers.fired", timer, f"{request_id} ({where}) fired timer {timer!r}, which was never set"
            )
        elif now_ms < due:
            self._find(
                "timers.fired",
                timer,
                f"{request_id} ({where}) fired timer {timer!r} at sequenced time {now_ms} ms, "
                f"{due - now_ms} ms before its due time {due} ms",
            )
        if len(fires) > 1:
            self._find(
                "timers.fired", timer, f"timer {timer!r} fired {len(fires)} times ({', '.join(fires)})"
            )

    def counted(self) -> dict[str, int]:
        return {
            "intents": self.calls,
            "responses": self.responses,
            "continuations": self.continuations,
            "continuations_failed": self.continuations_failed,
            "timers": self.timers,
            "timers_fired": self.fires,
        }

    def tally(self) -> Finding:
        """How much was checked, as a finding of severity INFO (the audit takes it out of the findings
        and into the report's inputs and ``report.json``)."""
        return Finding(TALLY, "effects", json.dumps(self.counted(), sort_keys=True), INFO)

    def finish(self) -> list[Finding]:
        """The findings, with the intents left without a completion at the end of the log."""
        pending = {name for (op, _), calls in self.state.items() if op == OUTBOX for name in calls}
        for call, where in sorted(self.recorded.items()):
            if self.took_effect.get(call):
                continue
            if call in pending:
                self._find(
                    "effects.response",
                    call,
                    f"intent {call!r} (recorded at {where}) is still pending at the end of the log "
                    "(a call in flight when the run ended)",
                    WARNING,
                )
            else:
                self._find(
                    "effects.response",
                    call,
                    f"intent {call!r} (recorded at {where}) was cleared at {self.cleared.get(call, '?')} "
                    "without a completion that took effect",
                )
        for (check, severity), n in sorted(self.counts.items()):
            if n > self.max_findings:
                more = n - self.max_findings
                self.findings.append(
                    Finding(check, "effects", f"{n} such findings in all ({more} not listed)", severity)
                )
        return self.findings
