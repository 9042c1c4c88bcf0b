"""StateStore: committed writes and the delta map that incremental snapshots ship.

Pins down: the delta holds the last write of every key since the previous ``take_delta`` (deletes
as ``None``); ``load_writes`` (recovery) changes the state but records no delta; and replaying the
deltas in epoch order on an empty store rebuilds exactly the state the writes produced one by one.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from styx_worker.conflicts import EntityKey
from styx_worker.state import StateStore, Writes

keys = st.tuples(
    st.sampled_from(["acct", "order"]), st.one_of(st.integers(0, 5), st.sampled_from(["x", "y"]))
)
values = st.one_of(st.none(), st.binary(min_size=1, max_size=4))
write_sets = st.dictionaries(keys, values, max_size=6)


def test_delta_holds_the_last_write_per_key_including_deletes() -> None:
    store = StateStore()
    store.apply({("a", 1): b"1", ("a", 2): b"2"})
    store.apply({("a", 1): b"3", ("a", 2): None, ("b", "k"): None})
    assert store.get(("a", 1)) == b"3"
    assert store.get(("a", 2)) is None
    assert ("b", "k") not in store.data, "deleting a missing key leaves nothing behind"
    assert store.take_delta() == {("a", 1): b"3", ("a", 2): None, ("b", "k"): None}
    assert store.take_delta() == {}, "take_delta starts a fresh delta"
    assert dict(store.items()) == {("a", 1): b"3"}
    assert len(store) == 1


def test_load_writes_changes_state_but_records_no_delta() -> None:
    store = StateStore()
    store.apply({("a", 1): b"old"})
    store.take_delta()
    store.load_writes([("a", 1, None), ("a", 2, b"2"), ("a", 2, b"3")])
    assert dict(store.items()) == {("a", 2): b"3"}
    assert store.delta == {}
    store.apply({("a", 9): b"9"})
    assert store.take_delta() == {("a", 9): b"9"}


@settings(max_examples=150, deadline=None)
@given(epochs=st.lists(st.lists(write_sets, max_size=4), max_size=6))
def test_deltas_in_epoch_order_rebuild_the_state(epochs: list[list[Writes]]) -> None:
    live = StateStore()
    expected: dict[EntityKey, bytes] = {}
    deltas: list[Writes] = []
    for epoch in epochs:
        for writes in epoch:
            live.apply(writes)
            for key, value in writes.items():  # the model: one write at a time
                if value is None:
                    expected.pop(key, None)
                else:
                    expected[key] = value
        delta = live.take_delta()
        last = {k: v for writes in epoch for k, v in writes.items()}
        assert delta == last, "the delta is the last write of each key in the epoch"
        deltas.append(delta)
    assert live.data == expected
    restored = StateStore()
    for delta in deltas:
        restored.load_writes((op, key, value) for (op, key), value in delta.items())
    assert restored.data == expected
    assert None not in restored.data.values()
