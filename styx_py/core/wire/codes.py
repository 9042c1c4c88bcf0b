"""Codes every channel shares: the enums of the protocol, keys, the coordinator's node id."""

from __future__ import annotations

from enum import IntEnum, StrEnum

import msgspec

Key = str | int

# The coordinator's node id on every transport (workers have their own, e.g. "w1").
COORDINATOR = "coordinator"


class Status(IntEnum):
    """Outcome of one function invocation, carried by Ack and CallResult."""

    OK = 0
    ABORT = 1  # user raised Abort
    ERROR = 2  # user code raised another exception / an unencodable value
    BAD = 3  # unknown operator or function, wrong arguments, bad key
    CHANGED = 4  # fallback: read/write set or call parameters differ from the optimistic run
    PROPAGATED = 5  # failed because a synchronous callee failed (the callee carries the error)


class Phase(IntEnum):
    """The phase of an epoch an invocation runs in; also a reply's place in the serial order."""

    OPTIMISTIC = 0  # lock-free, against the state as of the epoch's start
    FALLBACK = 1  # re-run under locks in tid order
    SERIAL = 2  # a transaction that invoked one entity twice: re-run alone, after the fallback, each
    # call's whole subtree before the next (its branches could race for that entity otherwise)


class Outcome(IntEnum):
    """What became of a fallback transaction (Final.outcome)."""

    COMMIT = 0
    ABORT = 1
    RESCHEDULE = 2  # its call graph changed: it runs again in a later epoch, keeping its tid


class ReplyStatus(StrEnum):
    COMMITTED = "committed"
    ABORTED = "aborted"  # Abort raised by user code
    FAILED = "failed"  # another error: user exception, bad request
    REFUSED = "refused"  # not admitted: the worker was over its admission bound (Overloaded); nothing ran


class Refusal(StrEnum):
    """Why a request was refused (``Reply.reason``, the ``Refused`` log entry): which admission bound."""

    BACKLOG = "backlog"  # the worker's buffer is over its backlog cap: the cluster is over its knee
    ENTITY = "entity"  # rescheduled calls of its function queue behind its root entity: a hot key


class Msg(msgspec.Struct, tag_field="t", array_like=True, omit_defaults=False):
    """Base of every message: tagged, so one decoder per channel tells them apart."""


# What decoding hostile bytes can raise: bad msgpack, wrong shape, invalid UTF-8 in a string,
# nesting deep enough to exhaust the stack.
UNDECODABLE = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)
