"""Exception tree of styx-py.

::

    StyxError                      operating errors a caller can handle
    ├── GraphError                 a deploy or code update was refused: the graph failed validation
    │                              (unknown target, bad partitions…) or could not be made durable
    ├── ConfigError                a configuration value is missing or invalid (names the key)
    ├── ProtocolError              bytes on the wire that are not a valid frame/message
    ├── BackendError               Kafka or S3 failed an operation (unreachable, refused, timed out,
    │                              stored bytes that do not decode); also an ``OSError``
    ├── MissingExtra               a command needs an extra that is not installed (``styx_py.extras``)
    ├── AuditError                 ``styx audit`` could not run (``styx_py.audit.failures``)
    ├── SqlError                   ``styx sql`` could not answer (``styx_py.audit.asof``):
    │   ├── UnknownTable           the query names a table that is neither an operator nor a log
    │   ├── SqlSyntaxError         Spark could not parse or analyse the query (its message, short)
    │   ├── AsOfUnavailable        no state at that epoch: before the snapshots with no changelog,
    │   │                          not run yet, or no snapshot yet
    │   └── ChangelogDisabled      an as-of read needs the changelog topic, which the cluster lacks
    ├── ScreenshotError            Chromium is missing or wrote no image (``styx_py.stack.screenshot``)
    ├── BrokerLost                 ``styx up``'s in-memory broker died, and the cluster's logs with it
                                   (``styx_py.stack.errors``; also the stack's ``ServiceError``)
    ├── TransactionFailed          a transaction did not commit; raised by the SDK (an exception
    │   │                          in a function: ``error_type`` "UserError", ``exception_type`` its class)
    │   ├── TransactionAborted     user logic aborted it with ``Abort``
    │   └── BadRequest             unknown operator/function, undecodable arguments, a limit…
    ├── RequestTimeout             no reply within the deadline (``request_id`` names the request)
    ├── Overloaded                 too many pending requests in the client, or refused by the cluster
    ├── Unavailable                the cluster cannot take requests now (unreachable, recovering)
    ├── StateReadRefused           a consistent read of committed state (``client.scan``, ``styx state``)
    │   │                          was refused; ``code`` says why (styx_py.core.wire.READ_CODES)
    │   └── EpochOutOfWindow       its epoch is older than the workers keep in memory (``oldest``: the
    │                              oldest one they can read); older epochs: ``styx sql --as-of-epoch``
    └── ExternalCallFailed         an external call failed for good (raised in its continuation by
                                   ``styx_py.core.effects.external_value``)

    Abort(Exception)               raised by user code to abort the whole transaction;
    │                              its message reaches the client
    └── PendingLimit               an external call or timer beyond a per-entity or per-partition
                                   bound (``styx_py.core.effects``)

    ScanLimitExceeded(ValueError)  ``ctx.scan`` asked for more rows than MAX_SCAN_LIMIT (or fewer
                                   than 1); uncaught, it fails the transaction as any user error

    BaseException                  internal control signals derive from it, not from Exception, so
    │                              that a user's ``except Exception`` cannot swallow them:
    ├── _Changed                   the fallback run diverged from the optimistic one (styx_worker.executor)
    ├── _CalleeFailed              a synchronous callee failed (styx_worker.executor)
    ├── _BadCall                   a call names an unknown function or has a bad key (styx_worker.executor)
    └── _Failed                    a transaction of the serial reference run failed (styx_py.core.serial)

A :class:`TransactionFailed` carries the server's reply (``reply``) and repeats what a handler looks
at: ``request_id``, ``tid``, ``epoch``, ``status``, ``error`` and ``error_type`` (``"Abort"``,
``"BadRequest"`` or ``"UserError"``). Raised locally by the SDK (a :class:`BadRequest` before
anything is sent), it has no reply and those are ``None``.

Operating errors and bugs are handled apart. The ports' implementations (:mod:`styx_py.io`) raise
:class:`BackendError` for what their client library raised (aiokafka's ``KafkaError``, minio's
``S3Error``, urllib3's errors), and the in-memory fakes raise ``OSError``: so the processes catch
``OSError`` (which includes ``TimeoutError`` and ``ConnectionError``) where S3 or Kafka can fail, and
retry or refuse with a bound. Anything else (an ``AssertionError``, a ``TypeError``, a ``KeyError``) is
a bug: it is never caught, it ends the process with its traceback (exit code 70,
:func:`styx_py.io.serving.run_until_failure`), and the supervisor restarts it.
(``tests/test_errors.py`` checks that this drawing names every class it should.)
"""

from __future__ import annotations

from typing import Protocol

# The exit status of a coordinator or worker that a bug ended (EX_SOFTWARE): a message handler or a task
# raised something other than a StyxError (styx_py.io.serving.run_until_failure).
EXIT_HANDLER_FAILED = 70


class ReplyFields(Protocol):
    """What an error reads of a :class:`~styx_py.core.wire.Reply` (the wire module imports this one)."""

    @property
    def request_id(self) -> str: ...
    @property
    def tid(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def reason(self) -> str: ...


class StyxError(Exception):
    """Base of every operating error raised by styx-py."""


class GraphError(StyxError):
    """A deploy or code update was refused: the graph failed validation, or the cluster state that
    records it could not be saved (nothing changed)."""


class ConfigError(StyxError):
    """A configuration value is missing or invalid; the message names the key."""


class ProtocolError(StyxError):
    """Bytes received on a channel are not a valid frame or message."""


class BackendError(StyxError, OSError):
    """Kafka or S3 failed an operation: unreachable, refused, timed out, or stored bytes that do not
    decode. Raised by the ports' implementations in :mod:`styx_py.io` from what their client library
    raised (its ``__cause__``); an ``OSError`` as well, so that one ``except OSError`` covers it, a
    socket's own errors and the in-memory fakes' failures."""


class TransactionFailed(StyxError):
    """A transaction did not commit. ``reply`` holds the server's reply (``None`` for an error the SDK
    raised before sending); its fields are repeated as attributes (module docstring)."""

    def __init__(self, message: str, reply: ReplyFields | None = None) -> None:
        super().__init__(message)
        self.reply = reply

    @property
    def request_id(self) -> str | None:
        return None if self.reply is None else self.reply.request_id

    @property
    def tid(self) -> int | None:
        """The transaction id the cluster gave the request (its place in the serial order)."""
        return None if self.reply is None else self.reply.tid

    @property
    def epoch(self) -> int | None:
        return None if self.reply is None else self.reply.epoch

    @property
    def status(self) -> str | None:
        """``"aborted"`` or ``"failed"``."""
        return None if self.reply is None else str(self.reply.status)

    @property
    def error(self) -> str | None:
        """The server's message: the ``Abort`` message, ``"ValueError: …"`` for a user exception."""
        return None if self.reply is None else self.reply.error

    @property
    def error_type(self) -> str | None:
        """``"Abort"``, ``"BadRequest"`` or ``"UserError"`` (an exception raised by a function)."""
        return None if self.reply is None else self.reply.error_type

    @property
    def exception_type(self) -> str | None:
        """For a ``"UserError"``: the name of the exception class the function raised (``"KeyError"``,
        or a user's own class), as the server's message starts with it; otherwise ``None``."""
        if self.error_type != "UserError" or not self.error:
            return None
        name, sep, _ = self.error.partition(": ")
        return name if sep and name.isidentifier() else None


class TransactionAborted(TransactionFailed):
    """User logic aborted the transaction with ``Abort``; ``str(exc)`` is its message."""


class BadRequest(TransactionFailed):
    """The request cannot run: unknown operator or function, undecodable arguments, a limit."""


class RequestTimeout(StyxError):
    """No reply arrived before the deadline. The request may still run: resend it with the same
    ``request_id`` to get its reply (the cluster answers a resent id with its first reply)."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class Overloaded(StyxError):
    """Retry later: the client has too many requests in flight (``reply`` None, nothing was sent), or
    the cluster refused the request, over its admission bound (``reply``: its ``refused`` reply;
    nothing ran, and the same request id is answered the same way again: retry with a new one).

    ``reason`` says which bound: ``client`` (this client's own in-flight bound), ``backlog`` (the
    cluster as a whole is over its knee: back off) or ``entity`` (calls of this function queue behind
    the request's root entity, named in the message: a hot key; the cluster admits the others)."""

    def __init__(self, message: str, reply: ReplyFields | None = None) -> None:
        super().__init__(message)
        self.reply = reply
        self.reason = "client" if reply is None else reply.reason or "backlog"


class Unavailable(StyxError):
    """The cluster cannot take requests now (broker or coordinator unreachable, recovering,
    nothing deployed); retry later. The gateway answers it with 503."""


class StateReadRefused(StyxError):
    """A read of committed state as of an epoch was refused: ``code`` is one of
    :data:`~styx_py.core.wire.READ_CODES` (an ``unavailable`` one raises :class:`Unavailable`)."""

    def __init__(self, message: str, code: str, oldest: int = -1, latest: int = -1) -> None:
        super().__init__(message)
        self.code = code
        self.oldest = oldest
        self.latest = latest


class EpochOutOfWindow(StateReadRefused):
    """The epoch asked for is older than the workers keep in memory (``state_window_epochs``, or their
    last restore or hand-off): ``oldest`` is the oldest one they can read now. Never answered with a
    newer state instead; ``styx sql --as-of-epoch`` reads older epochs from the snapshots."""


class Abort(Exception):
    """Raise inside a function to abort the whole transaction; the message reaches the client."""


class ScanLimitExceeded(ValueError):
    """``ctx.scan``'s ``limit`` is not in 1..:data:`~styx_py.core.limits.MAX_SCAN_LIMIT` (page through a
    longer range with ``after=`` the last key of the previous page)."""


class PendingLimit(Abort):
    """A transaction asked for an external call or a timer beyond a bound: the calling entity's
    (64 of each) or its partition's (``Graph(max_pending_per_partition=…)``). It aborts the
    transaction; the message, which starts with ``PendingLimit:``, names the entity or the partition."""

    def __init__(self, message: str) -> None:
        super().__init__(f"PendingLimit: {message}")


class ExternalCallFailed(StyxError):
    """An external call (``ctx.call_external``) failed for good: the service raised, or did not answer
    within the runner's bounded attempts. ``call`` is its idempotency key; the service may still have
    taken effect under it (a timeout), and answers a later call with that key alike."""

    def __init__(self, call: str, error: str) -> None:
        super().__init__(f"external call {call} failed: {error}")
        self.call = call
        self.error = error
