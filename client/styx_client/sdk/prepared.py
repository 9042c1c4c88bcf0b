"""The lean path for load generators: :class:`Prepared`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from styx_client.sdk.ids import RequestIds
from styx_client.sdk.requests import Targets
from styx_client.sdk.shell import Shell
from styx_client.sdk.waiters import Done
from styx_py.core.partitioning import partition_of
from styx_py.core.requests import lean_request
from styx_py.core.wire import Key

__all__ = ["Prepared"]


class Prepared:
    """Requests to one ``operator.function`` without a future per request: :meth:`send` hands each
    reply (or its failure) to a callback.

    Same checks and guarantees as :meth:`StyxClient.submit` (the record goes through the same
    :func:`~styx_py.core.requests.encode_request`; a generated request id is checked against the
    table; ``max_pending``; a timeout per request, reported by the shared deadline sweep), minus what
    a load generator does not use: chosen request ids, joining an id in flight, cancellation. What it
    saves per request (the operator and function are looked up once; no ``*args``/keywords packing,
    caller future or done callback) is measured in benchmarks/results/client-cpu.md. The callback is
    the waiter's ``done`` itself (:mod:`styx_client.sdk.waiters`).
    """

    __slots__ = (
        "_new_rid",
        "_partitions",
        "_started",
        "_targets",
        "function",
        "operator",
        "reply_to",
        "timeout_s",
    )

    def __init__(
        self,
        started: Callable[[], Shell],
        reply_to: str,
        operator: str,
        function: str,
        partitions: int,
        timeout_s: float,
        new_rid: RequestIds,
        targets: Targets,
    ) -> None:
        self._started = started  # the client's shell, or raise why it cannot send (not started, closed)
        self.reply_to = reply_to
        self._new_rid = new_rid
        self._targets = targets  # the deployment as prepared (an update keeps an operator's partitions)
        self._partitions = partitions
        self.operator = operator
        self.function = function
        self.timeout_s = timeout_s

    def send(self, key: Key, args: tuple[Any, ...] | list[Any], done: Done) -> str:
        """Send ``operator.function(key, *args)`` now; its request id.

        Raises :class:`BadRequest`, :class:`Overloaded` or :class:`StyxError` here, nothing sent,
        exactly as :meth:`StyxClient.submit`, except that a request the window sheds is refused before
        its arguments are encoded (and checked), and takes no request id. Otherwise
        ``done(reply, None)`` or ``done(None, error)`` is called exactly once: a
        :class:`RequestTimeout` after ``timeout_s``, :class:`Unavailable` when the record could not be
        delivered, :class:`StyxError` when the client closes first.
        ``done`` runs inside the client's reader or deadline task, so it must be quick and must not raise.
        """
        shell = self._started()
        operator, function = self.operator, self.function
        if type(key) is str or type(key) is int:
            partition = partition_of(key, self._partitions)
        else:  # the message of a bad key, as on the normal path
            partition = self._targets.partition(operator, key, function)
        core = shell.core
        core.table.check_room()  # shed before an id and the record are made: the cheapest refusal
        rid = self._new_rid()
        record = lean_request(
            rid,
            operator,
            function,
            key,
            args,
            shell.transport.wall_ms(),
            shell.reply_partition,
            self.reply_to,
        )
        # Registered before producing: the reply may be read before produce() even returns.
        entry = core.admit_new(rid, record, partition)
        waiter = core.wait(entry, done, self.timeout_s, (operator, function, key, rid), shell.loop.time())
        shell.deadline_added(waiter.deadline)
        shell.produce(entry)
        return rid
