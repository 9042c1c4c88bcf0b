"""What the client sends: requests checked against the deployed graph, encoded, and their partition.

Everything here raises :class:`~styx_py.core.errors.BadRequest` locally, before anything is sent, for
what the cluster would reject anyway: an unknown operator or function, a key that is not str or int,
arguments msgpack cannot carry, and every limit of :mod:`styx_py.core.limits` (request id, names and
key lengths, request size, argument nesting), checked by :mod:`styx_py.core.requests`, the same
checks in the same order as the workers apply them to every ingress record.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

from styx_py.core.errors import BadRequest, ConfigError
from styx_py.core.partitioning import partition_of
from styx_py.core.requests import encode_request as checked_request
from styx_py.core.wire import Key, request_decoder

__all__ = ["Call", "Targets", "encode_request", "same_request"]

Call = tuple[str, Key, str, tuple[Any, ...]]
"""One entry of :meth:`StyxClient.submit_many`: ``(operator, key, function, args)``."""


class Targets:
    """The deployed operators as the client knows them: partition counts and, optionally, functions.

    ``functions`` (operator -> function names), when given, rejects an unknown function locally like
    an unknown operator, without a round trip to the cluster.
    """

    __slots__ = ("functions", "operators")

    def __init__(
        self, operators: Mapping[str, int], functions: Mapping[str, Collection[str]] | None = None
    ) -> None:
        if not operators:
            raise ConfigError("operators: at least one operator (name -> partition count) is needed")
        for name, partitions in operators.items():
            if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
                raise ConfigError(
                    f"operators[{name!r}]: partition count must be an int >= 1, not {partitions!r}"
                )
        self.operators: dict[str, int] = dict(operators)
        self.functions: dict[str, frozenset[str]] | None = (
            {name: frozenset(fns) for name, fns in functions.items()} if functions is not None else None
        )

    def partition(self, operator: str, key: Key, function: str) -> int:
        """The ingress partition of ``(operator, key)``, after checking the call can be valid."""
        partitions = self.operators.get(operator)
        if partitions is None:
            raise BadRequest(f"unknown operator {operator!r}; known: {sorted(self.operators)}")
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise BadRequest(f"entity keys must be str or int, got {type(key).__name__}")
        if self.functions is not None:
            known = self.functions.get(operator)
            if known is not None and function not in known:
                raise BadRequest(
                    f"operator {operator!r} has no function {function!r}; known: {sorted(known)}"
                )
        return partition_of(key, partitions)


def encode_request(
    rid: str,
    operator: str,
    function: str,
    key: Key,
    args: tuple[Any, ...],
    reply_partition: int = -1,
    reply_to: str = "",
) -> bytes:
    """The ingress record of one request, stamped with the wall-clock time in ms; its reply goes to
    egress partition ``reply_partition`` and is pushed to the client connection ``reply_to``."""
    ts_ms = time.time_ns() // 1_000_000
    return checked_request(rid, operator, function, key, args, ts_ms, reply_partition, reply_to)


def same_request(sent: bytes, record: bytes) -> bool:
    """Whether two records of :func:`encode_request` carry the same request: all but the timestamp and
    where the reply goes (the cluster answers a resent id on the partition, and to the client, of the
    copy it just read).

    Only called when a request id is reused, so the decoding is no cost per request."""
    if sent == record:
        return True
    return _request_part(sent) == _request_part(record)


def _request_part(record: bytes) -> tuple[Any, ...]:
    req = request_decoder.decode(record)
    return (req.request_id, req.operator, req.function, req.key, bytes(req.args))
