"""Mencius-style tids (worker.sequencer): unique, residue-class owned, interleaved after rebalancing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from styx_worker.sequencer import Sequencer


def test_tid_formula_hand_worked() -> None:
    s = Sequencer(2, 3)
    assert [s.next_tid() for _ in range(3)] == [2, 5, 8]
    assert s.assign(2) == [11, 14]
    assert s.lc == 5
    assert s.assign(0) == []
    assert s.lc == 5


def test_sid_range_is_checked() -> None:
    with pytest.raises(AssertionError):
        Sequencer(0, 3)
    with pytest.raises(AssertionError):
        Sequencer(4, 3)


def test_rebalance_never_moves_backwards() -> None:
    s = Sequencer(1, 2, lc=10)
    s.rebalance(3)
    assert s.lc == 10
    s.rebalance(12)
    assert s.lc == 12
    assert s.next_tid() == 1 + 12 * 2


def test_owner_of_last_sid_maps_residue_zero() -> None:
    s = Sequencer(1, 4)
    assert s.owner_of(4) == 4
    assert s.owner_of(8) == 4
    assert s.owner_of(5) == 1
    assert s.owner_of(7) == 3


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 6), epochs=st.integers(1, 6), data=st.data())
def test_tids_unique_owned_and_interleaved(n: int, epochs: int, data: st.DataObject) -> None:
    # Sequencers may start at different counters (e.g. a busy one); per epoch each hands out a random
    # number of tids, through assign() or next_tid().
    lcs = data.draw(st.lists(st.integers(0, 20), min_size=n, max_size=n), label="start lcs")
    seqs = [Sequencer(sid, n, lcs[sid - 1]) for sid in range(1, n + 1)]
    all_tids: list[int] = []
    per_seq: dict[int, list[int]] = {s.sid: [] for s in seqs}
    rebalanced = False
    epoch_base = 0

    for _ in range(epochs):
        counts = data.draw(
            st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=n, max_size=n), label="epoch"
        )
        epoch_tids: dict[int, list[int]] = {}
        for s, (count, use_assign) in zip(seqs, counts, strict=True):
            tids = s.assign(count) if use_assign else [s.next_tid() for _ in range(count)]
            assert len(tids) == count
            epoch_tids[s.sid] = tids
            for t in tids:
                assert t % n == s.sid % n, (t, s.sid, n)
                assert s.owner_of(t) == s.sid
                assert all(s2.owner_of(t) == s.sid for s2 in seqs)
            per_seq[s.sid].extend(tids)
            all_tids.extend(tids)

        if rebalanced:
            # Every sequencer started this epoch at the same lc: the j-th tids of all sequencers lie in
            # one block of n consecutive ids, in sid order, so the epoch's tids interleave.
            for sid, tids in epoch_tids.items():
                for j, t in enumerate(tids):
                    assert epoch_base + j * n + 1 <= t <= epoch_base + j * n + n
                    assert t == epoch_base + j * n + sid
            for a in seqs:
                for b in seqs:
                    ta, tb = epoch_tids[a.sid], epoch_tids[b.sid]
                    for j in range(min(len(ta), len(tb))):
                        assert (ta[j] < tb[j]) == (a.sid < b.sid) or a.sid == b.sid
                        if j + 1 < len(tb):
                            assert ta[j] < tb[j + 1]

        before = [s.lc for s in seqs]
        global_lc = max(before)
        for s in seqs:
            s.rebalance(global_lc)
        after = [s.lc for s in seqs]
        assert all(a >= b for a, b in zip(after, before, strict=True)), "rebalance moved a counter back"
        assert len(set(after)) == 1, after
        assert after[0] == global_lc
        rebalanced = True
        epoch_base = global_lc * n

        # A stale (lower) global value never moves anything backwards.
        stale = data.draw(st.integers(0, global_lc), label="stale lc")
        for s in seqs:
            s.rebalance(stale)
        assert [s.lc for s in seqs] == after

    assert len(all_tids) == len(set(all_tids)), "duplicate tid"
    for _sid, tids in per_seq.items():
        assert tids == sorted(tids)
        assert len(tids) == len(set(tids))
