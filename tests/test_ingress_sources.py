"""The worker ingress's pure parts, with no broker and no event loop (styx_worker.sources, .pushed).

Pins down: records are buffered per (segment, partition) source in offset order and taken round robin
in source order, the positions follow what was taken; a segment that leaves the live ones is drained
(read on until taken to its high watermark, and at least ``drain_s``); the buffer's bound; a pushed
record is buffered only as the next offset of its source, kept while ahead of it (up to
``MAX_PUSHED_AHEAD``), counted late when the fetch had it, and compared with the fetched copy.
"""

from __future__ import annotations

import logging

import msgspec
import pytest

from styx_py.core.limits import MAX_PUSHED_AHEAD
from styx_py.core.segments import pack
from styx_py.core.wire import IngressRecord, PushedRequest, Request, request_encoder
from styx_worker.pace import PushPace
from styx_worker.pushed import PushedRecords
from styx_worker.sources import IngressCounts, Sources


def _value(rid: str) -> bytes:
    return request_encoder.encode(Request(rid, "acct", "deposit", "k", msgspec.Raw(b"\x91\x01")))


def _fetch(sources: Sources, segment: int, partition: int, offset: int, rid: str) -> None:
    sources.accept((segment, partition), offset, rid.encode(), _value(rid), 1_000 + offset)


def _pushed(segment: int, partition: int, offset: int, rid: str) -> PushedRequest:
    return PushedRequest(segment, partition, offset, 1_000 + offset, rid.encode(), _value(rid))


def _ids(records: list[IngressRecord]) -> list[str]:
    return [r.request.request_id for r in records]


def _reading(max_pending: int = 100, partitions: tuple[int, ...] = (0, 1)) -> Sources:
    sources = Sources(max_pending, 1.0, IngressCounts())
    sources.read(sources.assign(list(partitions)))
    return sources


def test_records_are_taken_round_robin_by_source_and_the_positions_follow() -> None:
    sources = _reading()
    for i in range(3):
        _fetch(sources, 0, 1, i, f"b{i}")
    for i in range(2):
        _fetch(sources, 0, 0, i, f"a{i}")
    assert sources.count == 5 and sources.positions() == {0: {0: 0}, 1: {0: 0}}
    taken = sources.take(4)
    assert _ids(taken) == ["a0", "b0", "a1", "b1"]
    assert [r.offset for r in taken] == [pack(0, 0), pack(0, 0), pack(0, 1), pack(0, 1)]
    assert sources.positions() == {0: {0: 2}, 1: {0: 2}} and sources.count == 1
    rec = sources.take_next((0, 1))
    assert rec is not None and rec.request.request_id == "b2"
    assert sources.take_next((0, 1)) is None and sources.take_next((5, 1)) is None
    assert sources.positions() == {0: {0: 2}, 1: {0: 3}} and sources.count == 0


def test_a_record_with_no_request_is_skipped_and_counted() -> None:
    sources = _reading()
    sources.accept((0, 0), 0, None, b"", 1)  # a null record, no key: no request id to answer
    assert sources.count == 0 and sources.counts.skipped == 1
    assert sources.expect[0, 0] == 1, "the fetch goes on past it"


def test_the_buffer_is_bounded() -> None:
    sources = _reading(max_pending=2)
    _fetch(sources, 0, 0, 0, "r0")
    assert not sources.full() and sources.room() == 1
    _fetch(sources, 0, 0, 1, "r1")
    assert sources.full() and sources.room() == 0
    sources.take(1)
    assert not sources.full()


def test_a_segment_that_leaves_the_live_ones_is_drained_to_its_high_watermark() -> None:
    sources = _reading(partitions=(0,))
    _fetch(sources, 0, 0, 0, "s0r0")
    assert sources.live(0, 10.0) is None, "nothing changes"
    reading = sources.live(3, 10.0)  # live: 2 and 3; 0 and 1 left them
    assert reading == {(2, 0): 0, (3, 0): 0, (0, 0): 0, (1, 0): 0}
    assert set(sources.draining) == {(0, 0), (1, 0)}
    moot = sources.read(reading)
    assert set(moot) == {(1, 0), (2, 0), (3, 0)}, "new sources; segment 0 is kept as it was"
    assert _ids(sources.take(5)) == ["s0r0"]
    assert sources.live(1, 10.5) is None, "never back"
    highwater = {(0, 0): 2, (1, 0): 0}
    assert sources.drained(10.5, highwater.get) is None, "not drain_s yet"
    reading = sources.drained(11.0, highwater.get)
    assert reading == {(0, 0): 1, (2, 0): 0, (3, 0): 0}, "segment 0 has a record not fetched yet"
    assert sources.read(reading) == [(1, 0)] and set(sources.draining) == {(0, 0)}
    assert sources.drained(11.0, highwater.get) is None
    _fetch(sources, 0, 0, 1, "s0r1")
    assert sources.drained(11.0, highwater.get) is None, "fetched, not taken yet"
    assert _ids(sources.take(5)) == ["s0r1"]
    assert sources.drained(11.0, highwater.get) == {(2, 0): 0, (3, 0): 0}
    assert sources.draining == {}


def test_reading_again_keeps_the_buffer_at_an_unchanged_offset_and_drops_it_at_another() -> None:
    sources = _reading()
    _fetch(sources, 0, 0, 0, "a0")
    _fetch(sources, 0, 1, 0, "b0")
    assert sources.read({(0, 0): 0, (0, 1): 0}) == [], "as it was"
    assert sources.count == 2
    assert sources.read({(0, 1): 5}) == [(0, 0), (0, 1)]
    assert sources.count == 0 and sources.expect == {(0, 1): 5} and sources.positions() == {0: {}, 1: {0: 5}}


def _pushing(max_pending: int = 100) -> tuple[Sources, PushPace, PushedRecords]:
    sources = _reading(max_pending)
    pace = PushPace()
    return sources, pace, PushedRecords(sources, pace, sources.counts)


def test_a_pushed_record_is_buffered_only_as_the_next_offset_of_its_source() -> None:
    sources, _, pushed = _pushing()
    assert not pushed.offer(_pushed(0, 0, 1, "r1"), 1.0), "ahead: kept"
    assert sources.count == 0 and pushed.ahead == {(0, 0): {1: _pushed(0, 0, 1, "r1")}}
    assert pushed.offer(_pushed(0, 0, 0, "r0"), 1.0), "next: buffered, and the one ahead with it"
    assert _ids(sources.take(10)) == ["r0", "r1"] and pushed.ahead == {}
    assert sources.counts.pushed_taken == 2 and sources.counts.pushed_late == 0
    assert not pushed.offer(_pushed(0, 0, 1, "r1"), 1.0), "again: taken already"
    assert not pushed.offer(_pushed(0, 7, 0, "x"), 1.0), "a partition not read here"
    assert sources.counts.pushed_late == 2


def test_pushed_records_the_fetch_brought_first_are_late() -> None:
    sources, pace, pushed = _pushing()
    pushed.offer(_pushed(0, 0, 2, "r2"), 1.0)
    pushed.offer(_pushed(0, 0, 3, "r3"), 1.0)
    for i in range(3):
        pace.fetched_first((0, 0), i, 1.0)
        _fetch(sources, 0, 0, i, f"r{i}")
    pushed.take_ahead((0, 0))
    assert _ids(sources.take(10)) == ["r0", "r1", "r2", "r3"], "r2 fetched, r3 taken from its push"
    assert sources.counts.pushed_late == 1 and sources.counts.pushed_taken == 1
    assert set(pace.unexcused) == {((0, 0), 0), ((0, 0), 1)}, "r2 was pushed after all"


def test_a_full_buffer_leaves_the_push_to_the_fetch() -> None:
    sources, _, pushed = _pushing(max_pending=1)
    assert pushed.offer(_pushed(0, 0, 0, "r0"), 1.0)
    assert not pushed.offer(_pushed(0, 0, 1, "r1"), 1.0)
    assert sources.count == 1 and sources.counts.pushed_late == 1


def test_records_pushed_ahead_are_kept_up_to_the_bound() -> None:
    _, _, pushed = _pushing()
    for offset in range(1, MAX_PUSHED_AHEAD + 3):
        pushed.offer(_pushed(0, 0, offset, f"r{offset}"), 1.0)
    assert len(pushed.ahead[0, 0]) == MAX_PUSHED_AHEAD


def test_the_fetched_copy_is_compared_with_the_pushed_one(caplog: pytest.LogCaptureFixture) -> None:
    sources, _, pushed = _pushing()
    pushed.offer(_pushed(0, 0, 0, "r0"), 1.0)
    pushed.offer(_pushed(0, 0, 1, "r1"), 1.0)
    pushed.offer(_pushed(0, 0, 2, "r2"), 1.0)
    pushed.confirm((0, 0), 0, b"r0", _value("r0"), 1_000)
    assert sources.counts.push_mismatches == 0
    with caplog.at_level(logging.CRITICAL, logger="styx.ingress"):
        pushed.confirm((0, 0), 2, b"r2", _value("forged"), 1_002)  # r1's copy went by before a seek
    assert sources.counts.push_mismatches == 1 and "pushed unlike the topic's copy" in caplog.text
    assert not pushed.unconfirmed[0, 0], "each compared once"
    pushed.forget((0, 0))
    assert (0, 0) not in pushed.unconfirmed
