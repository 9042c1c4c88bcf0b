"""A scan from the key index (styx_worker.scan.partition_rows) answers what the full walk does
(styx_py.core.scan.select over every committed entity overlaid with the transaction's writes), on
random states with int, str and mixed keys, while commits insert, update and delete keys between scans
(the index kept in place, and rebuilt after a commit too large for that)."""

from __future__ import annotations

import random

import pytest

from styx_py.core.partitioning import Key, partition_of
from styx_py.core.scan import ScanRange, select
from styx_worker import keyindex
from styx_worker.scan import partition_rows
from styx_worker.state import StateStore, Writes

OP, OTHER, N = "acct", "other", 3


def _key(rng: random.Random, kinds: str) -> Key:
    kind = rng.choice(kinds)
    if kind == "i":
        return rng.randrange(-20, 60)
    return "".join(rng.choice("abc") for _ in range(rng.randrange(0, 4)))


def _bound(rng: random.Random, kinds: str) -> Key | None:
    return None if rng.random() < 0.3 else _key(rng, kinds)


def _range(rng: random.Random, kinds: str) -> tuple[ScanRange, int]:
    prefix = None if rng.random() < 0.6 else "".join(rng.choice("abc") for _ in range(rng.randrange(0, 3)))
    scan = ScanRange(
        OP,
        _bound(rng, kinds),
        rng.random() < 0.5,
        _bound(rng, kinds),
        rng.random() < 0.7,
        prefix,
        rng.randrange(N),
        N,
    )
    return scan, rng.randrange(1, 12)


def _writes(rng: random.Random, kinds: str, count: int) -> Writes:
    out: Writes = {}
    for _ in range(count):
        op = OP if rng.random() < 0.8 else OTHER
        out[(op, _key(rng, kinds))] = None if rng.random() < 0.35 else rng.randbytes(rng.randrange(1, 4))
    return out


def _full_walk(store: StateStore, buffer: Writes, scan: ScanRange, rows: int) -> tuple[list, ScanRange]:
    def mine(o: str, k: Key) -> bool:
        return o == OP and partition_of(k, N) == scan.partition

    entries: dict[Key, bytes | None] = {k: v for (o, k), v in store.data.items() if mine(o, k)}
    entries.update((k, v) for (o, k), v in buffer.items() if mine(o, k))
    return select(scan, rows, entries.items())


@pytest.mark.parametrize("kinds", ["i", "s", "is"])
@pytest.mark.parametrize("seed", range(12))
def test_index_scan_equals_full_walk(kinds: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyindex, "REBUILD_AFTER", 6)  # the random keys are few: rebuilds happen too
    rng = random.Random(f"{kinds}/{seed}")
    store = StateStore()
    store.apply(_writes(rng, kinds, 60))
    compared, rebuilt = 0, 0
    for step in range(120):
        big = step % 20 == 19  # likely more than REBUILD_AFTER keys added or removed: the index dropped
        store.apply(_writes(rng, kinds, 60 if big else rng.randrange(0, 6)), epoch=step)
        rebuilt += OP not in store.index.by_op
        for _ in range(3):
            buffer = _writes(rng, kinds, rng.randrange(0, 5))
            scan, rows = _range(rng, kinds)
            assert partition_rows(store, buffer, scan, rows) == _full_walk(store, buffer, scan, rows)
            compared += 1
        built = store.index.by_op.get(OP)
        if built is not None:  # the index kept in place holds the committed keys, in order
            for p in range(N):
                keys = [k for o, k in store.data if o == OP and partition_of(k, N) == p]
                assert built[1].get(p, []) == sorted(keys, key=lambda k: (isinstance(k, str), k))
    assert compared == 360 and rebuilt >= 1 and OP in store.index.by_op
