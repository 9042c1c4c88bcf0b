"""Record batching for aiokafka producers: one produce per partition per drain, not one per record.

aiokafka's per-record ``send`` costs tens of microseconds of Python each (metadata look-up, the
accumulator's drain waits) and, at high rates, makes many tiny batches; the broker's fetch cost
grows with the number of stored batches (Tansu). :class:`BatchLanes` queues records per (topic,
partition) and a drain task turns each lane's queue into as few ``BatchBuilder`` batches as fit,
submitted with ``send_batch``. While a lane's batch is in flight, its next records accumulate: the
batch size adapts to the load with no added latency when idle.

With ``busy_linger_s``, a lane whose last batch carried at least ``busy_records`` records (a busy
lane) waits that long after the batch is acknowledged before it sends the next one, so more records
share it. A lane that sends batches of fewer records sends at once: the linger costs nothing at low
load, and at high load it cuts the produce requests and the batches the broker stores, both of which
cost CPU per batch (benchmarks/results/busy-linger-and-gc.md).

Each record carries an ``on_done(offset, error)`` callback, called once: with the record's offset
when the broker acknowledged its batch, or with the error that failed it, and optionally Kafka headers.
A failed produce (aiokafka's ``KafkaError``, an ``OSError``) is the records' owners' to handle. Any
other exception while sending is a bug: the owners hear of it too (nobody waits for ever), and
:meth:`BatchLanes.run` raises it, so that it ends the task group running it instead of dying in a
send task nobody awaits.
Its Kafka timestamp is the time it was added, as aiokafka's ``send`` and Kafka's own producers stamp a
record when it is handed over, not when its batch is built (which for a lane with a batch in flight
comes after that batch is acknowledged): a worker's reply record is stamped when the reply is also
pushed to its client, a client's request when the SDK sent it.

A batch whose produce is in doubt (:data:`~styx_py.io.indoubt.IN_DOUBT`: the broker may have stored it
without answering; a producer made with :func:`~styx_py.io.indoubt.no_blind_retries` fails it so
instead of sending it again) is settled by ``reread``, when the owner gives one: the lane's partition
is read back from the end of this producer's last acknowledged batch in it, each record of the batch
found there (the same key and value) is done at the offset it is stored at, and only the others are
sent again, so a broker that dies mid-request does not get a record twice (what the read cannot tell
apart: :func:`~styx_py.io.kafka_logs.read_back`). Without ``reread`` the records fail with the error, as
with any failed produce.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiokafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]

from styx_py.core.limits import BUSY_RECORDS
from styx_py.io.indoubt import IN_DOUBT

OnDone = Callable[[int, BaseException | None], None]
Headers = list[tuple[str, bytes]]  # aiokafka's C record builder takes a list, nothing else
# key, value, on_done, headers, Kafka timestamp (ms: when it was added)
Entry = tuple[bytes | None, bytes, OnDone | None, Headers, int]
_NO_HEADERS: Headers = []  # shared, never modified
log = logging.getLogger("styx.batching")
# (topic, partition, from offset) -> (offset, key, value) of every record stored there from that offset
Reread = Callable[[str, int, int], Awaitable[list[tuple[int, bytes | None, bytes]]]]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


# What a failed produce raises: reported to the records' owners (anything else is also raised by run()).
PRODUCE_FAILURES = (KafkaError, OSError)


class BatchLanes:
    def __init__(self, producer: Any, busy_linger_s: float = 0.0, busy_records: int = BUSY_RECORDS) -> None:
        if busy_linger_s < 0 or busy_records < 1:
            raise ValueError(f"busy_linger_s={busy_linger_s} must be >= 0, busy_records={busy_records} >= 1")
        self.producer = producer
        self.busy_linger_s = busy_linger_s
        self.busy_records = busy_records
        self.lingering: dict[tuple[str, int], Cancellable] = {}  # busy lanes waiting (in busy)
        # How a linger is timed and records stamped: the loop's call_later and the wall clock, unless a
        # test gives its own.
        self.call_later: Callable[[float, Callable[[], None]], Cancellable] | None = None
        self.clock_ns: Callable[[], int] = time.time_ns
        self.lingered = 0  # batches that waited busy_linger_s first
        self.lanes: dict[tuple[str, int], list[Entry]] = {}
        self.wakeup = asyncio.Event()
        self.busy: set[tuple[str, int]] = set()  # lanes with a batch in flight
        self.tasks: set[asyncio.Task[None]] = set()
        self.records_sent = 0
        self.batches_sent = 0
        # The broker stamped a batch with its own append time (a topic with LogAppendTime): the
        # records are not stored with the timestamps add() returned.
        self.log_append_time = False
        # Per lane, records added and records done (acknowledged or failed). A lane has one batch in
        # flight at a time and finishes its records in order, so "done >= n" means its first n are.
        self.added: dict[tuple[str, int], int] = {}
        self.done: dict[tuple[str, int], int] = {}
        self.flushes: list[tuple[dict[tuple[str, int], int], asyncio.Future[None]]] = []
        self.failure: BaseException | None = None  # a bug in a send task, raised by run()
        # Settles a batch whose produce is in doubt (module docstring); None: it fails.
        self.reread: Reread | None = None
        self.ends: dict[tuple[str, int], int] = {}  # lane -> the offset after its last acknowledged batch
        self.found_in_doubt = 0  # records of in-doubt batches found stored (not sent again)
        self.resent_in_doubt = 0  # records of in-doubt batches not found, sent again

    def flush(self) -> asyncio.Future[None]:
        """Done when every record added before this call is acknowledged (or failed). Records added
        later are not waited for, so a steady stream of new records cannot hold it up."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        targets = {lane: n for lane, n in self.added.items() if self.done.get(lane, 0) < n}
        if targets:
            self.flushes.append((targets, done))
        else:
            done.set_result(None)
        return done

    def retire(self, keep: set[str], *shared: BatchLanes) -> None:
        """Keep only the lanes of ``keep`` (and any lane with records queued, in flight or waited for),
        and narrow the producer's metadata to their topics. aiokafka refreshes the metadata of every
        topic a producer ever wrote to, and with log segments (:mod:`styx_py.core.segments`) a producer
        moves to a new topic at every rotation. ``shared``: the other lanes on the same producer, retired
        alike: the metadata is the producer's, so a topic any of them still uses stays in it (a batch
        whose topic left the metadata finds no leader, waits, and fails after ``request_timeout_ms``
        with aiokafka's ``NotLeaderForPartitionError``)."""
        used = self._forget_unused(keep)
        for lanes in shared:
            assert lanes.producer is self.producer, "lanes retired together share one producer"
            used |= lanes._forget_unused(keep)
        self.producer.client.set_topics(sorted(keep | used))

    def _forget_unused(self, keep: set[str]) -> set[str]:
        """Forget the settled lanes of topics not in ``keep``; the topics not in it still in use."""
        waited = {lane for targets, _ in self.flushes for lane in targets}
        used: set[str] = set()
        for lane in [lane for lane in self.added if lane[0] not in keep]:
            settled = self.done.get(lane, 0) >= self.added[lane]
            if self.lanes.get(lane) or lane in self.busy or lane in waited or not settled:
                used.add(lane[0])
                continue
            del self.added[lane]
            self.done.pop(lane, None)
            self.lanes.pop(lane, None)
        return used

    def pending(self) -> int:
        return sum(len(q) for q in self.lanes.values())

    def add(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes,
        on_done: OnDone | None,
        headers: Headers | None = None,
        stamp: int | None = None,
    ) -> int:
        """Queue one record; its Kafka timestamp (ms), which it is stored with, is returned: ``stamp``,
        or now (a record its owner held back first keeps the time it was handed over)."""
        lane = (topic, partition)
        queue = self.lanes.get(lane)
        if queue is None:
            queue = self.lanes[lane] = []
        if stamp is None:
            stamp = self.clock_ns() // 1_000_000
        queue.append((key, value, on_done, _NO_HEADERS if headers is None else headers, stamp))
        self.added[lane] = self.added.get(lane, 0) + 1
        if lane not in self.busy:
            self.wakeup.set()
        return stamp

    async def run(self) -> None:
        """Drain forever: every idle lane with records gets one send task. Raises what a send task
        failed with other than a failed produce (module docstring)."""
        try:
            while True:
                await self.wakeup.wait()
                self.wakeup.clear()
                if self.failure is not None:
                    raise self.failure
                for lane in [lane for lane, q in self.lanes.items() if q and lane not in self.busy]:
                    records = self.lanes.pop(lane)
                    self.busy.add(lane)
                    task = asyncio.get_running_loop().create_task(self._send(lane, records))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
        finally:
            for task in list(self.tasks):
                task.cancel()
            for handle in self.lingering.values():
                handle.cancel()
            self.lingering.clear()

    async def send_queued(self) -> None:
        """Once :meth:`run` has stopped (the owner is closing): send what is still queued, each lane's
        records as batches, and wait until they are acknowledged or failed. Lingers are moot."""
        for handle in self.lingering.values():
            handle.cancel()
        self.lingering.clear()
        queued = [(lane, self.lanes.pop(lane)) for lane, q in list(self.lanes.items()) if q]
        await asyncio.gather(*(self._send(lane, records) for lane, records in queued))
        if self.failure is not None:
            raise self.failure

    async def _send(self, lane: tuple[str, int], records: list[Entry]) -> None:
        settled = 0  # records[:settled] were handed to the producer or failed: their owners will hear
        try:
            i = 0
            while i < len(records):
                builder = self.producer.create_batch()
                start = i
                while i < len(records):
                    key, value, _, headers, ts = records[i]
                    if builder.append(key=key, value=value, timestamp=ts, headers=headers) is None:
                        break
                    i += 1
                if i == start:  # one record larger than a batch: aiokafka's builder takes it alone
                    key, value, _, headers, ts = records[i]
                    builder = self.producer.create_batch()
                    if builder.append(key=key, value=value, timestamp=ts, headers=headers) is None:
                        self._fail(
                            lane, records[i : i + 1], ValueError(f"record of {len(value)} bytes too large")
                        )
                        i += 1
                        settled = i
                        continue
                    i += 1
                settled = i
                await self._submit(lane, builder, records[start:i])
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the owners learn of it; run() raises a bug
            # Including those already in the builder that raised: they were never sent.
            self._fail(lane, records[settled:], exc)
            self._crash(exc)
        else:
            if self.busy_linger_s > 0 and len(records) >= self.busy_records:
                # Busy: the lane stays in ``busy`` while it lingers, so its records keep joining the
                # queue that becomes its next batch.
                self.lingered += 1
                later = self.call_later or asyncio.get_running_loop().call_later
                self.lingering[lane] = later(self.busy_linger_s, functools.partial(self._linger_over, lane))
                return
        finally:
            if lane not in self.lingering:
                self._idle(lane)

    def _linger_over(self, lane: tuple[str, int]) -> None:
        del self.lingering[lane]
        self._idle(lane)

    def _idle(self, lane: tuple[str, int]) -> None:
        self.busy.discard(lane)
        if self.lanes.get(lane):
            self.wakeup.set()

    async def _submit(self, lane: tuple[str, int], builder: Any, part: list[Entry]) -> None:
        topic, partition = lane
        while True:
            delivery: asyncio.Future[Any] | None = None
            try:
                delivery = await self.producer.send_batch(builder, topic, partition=partition)
                metadata = await delivery
            except asyncio.CancelledError:
                if delivery is not None:
                    # Abandoned (the producer is stopping): its error, if it gets one, is not news.
                    delivery.add_done_callback(_retrieve)
                self._fail(lane, part, RuntimeError("producer stopped before the batch was acknowledged"))
                raise
            except BaseException as exc:  # noqa: BLE001 - the owners learn of it; run() raises a bug
                if self.reread is not None and isinstance(exc, IN_DOUBT):
                    try:
                        part = await self._settle(lane, part)
                    except asyncio.CancelledError:
                        self._fail(lane, part, RuntimeError("producer stopped while a batch was in doubt"))
                        raise
                    except BaseException as failed:  # noqa: BLE001 - the read failed: as the produce did
                        self._fail(lane, part, failed)
                        self._crash(failed)
                        return
                    if not part:
                        return
                    builder = self._rebuild(part)
                    continue
                self._fail(lane, part, exc)
                self._crash(exc)
                return
            break
        self.batches_sent += 1
        self.records_sent += len(part)
        if metadata.timestamp_type == 1:
            self.log_append_time = True
        base = metadata.offset
        self.ends[lane] = max(self.ends.get(lane, 0), base + len(part))
        for j, (_, _, on_done, _, _) in enumerate(part):
            if on_done is not None:
                on_done(base + j, None)
        self._finished(lane, len(part))

    async def _settle(self, lane: tuple[str, int], part: list[Entry]) -> list[Entry]:
        """``part``'s produce is in doubt: its records found stored (read back from the end of the lane's
        last acknowledged batch) are done at their offsets; the others are returned, to send again."""
        assert self.reread is not None
        topic, partition = lane
        stored: dict[tuple[bytes | None, bytes], list[int]] = {}
        for offset, key, value in await self.reread(topic, partition, self.ends.get(lane, 0)):
            stored.setdefault((key, value), []).append(offset)
        missing: list[Entry] = []
        found = 0
        for entry in part:
            offsets = stored.get((entry[0], entry[1]))
            if not offsets:
                missing.append(entry)
                continue
            offset = offsets.pop(0)
            self.ends[lane] = max(self.ends.get(lane, 0), offset + 1)
            found += 1
            if entry[2] is not None:
                entry[2](offset, None)
        log.warning(
            "a produce to %s[%d] was in doubt: %d of its %d records found stored, %d sent again",
            topic,
            partition,
            found,
            len(part),
            len(missing),
        )
        self.found_in_doubt += found
        self.resent_in_doubt += len(missing)
        self.records_sent += found
        self._finished(lane, found)
        return missing

    def _rebuild(self, part: list[Entry]) -> Any:
        """One batch of ``part``, records of one batch already (so they fit in one)."""
        builder = self.producer.create_batch()
        for key, value, _, headers, ts in part:
            if builder.append(key=key, value=value, timestamp=ts, headers=headers) is None:
                raise AssertionError("records of one batch no longer fit in one")
        return builder

    def _fail(self, lane: tuple[str, int], part: list[Entry], exc: BaseException) -> None:
        for _, _, on_done, _, _ in part:
            if on_done is not None:
                on_done(-1, exc)
        self._finished(lane, len(part))

    def _crash(self, exc: BaseException) -> None:
        """Unless ``exc`` is a failed produce (the owners' to handle): keep it for run() to raise."""
        if not isinstance(exc, PRODUCE_FAILURES) and self.failure is None:
            self.failure = exc
            self.wakeup.set()

    def _finished(self, lane: tuple[str, int], n: int) -> None:
        self.done[lane] = self.done.get(lane, 0) + n
        waiting = []
        for targets, done in self.flushes:
            if all(self.done.get(ln, 0) >= k for ln, k in targets.items()):
                if not done.done():
                    done.set_result(None)
            elif not done.done():
                waiting.append((targets, done))
        self.flushes = waiting


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
