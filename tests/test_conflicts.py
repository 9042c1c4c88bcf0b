"""Aria-style conflict detection (worker.conflicts): hand-worked cases, the paper's Figure 4, properties, and
blind adds (``Context.add``) beside reads and puts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from styx_py.core.barrier import combine_votes
from styx_py.core.context import added
from styx_py.core.wire import Vote
from styx_worker.conflicts import EntityKey, find_conflicts, write_minima


def k(name: str) -> EntityKey:
    return ("acct", name)


def test_waw_lower_to_higher_conflicts() -> None:
    assert find_conflicts({}, {1: [k("a")], 2: [k("a")]}) == [2]


def test_raw_higher_reads_what_lower_wrote_conflicts() -> None:
    assert find_conflicts({2: [k("a")]}, {1: [k("a")]}) == [2]


def test_war_lower_reads_higher_writes_does_not_conflict() -> None:
    assert find_conflicts({1: [k("a")]}, {2: [k("a")]}) == []


def test_read_read_and_disjoint_keys_do_not_conflict() -> None:
    assert find_conflicts({1: [k("a")], 2: [k("a")]}, {1: [k("b")], 2: [k("c")]}) == []


def test_same_name_on_different_operators_is_a_different_key() -> None:
    assert find_conflicts({}, {1: [("acct", "a")], 2: [("ledger", "a")]}) == []


def test_lowest_writer_wins_among_many() -> None:
    writes = {5: [k("a")], 3: [k("a")], 9: [k("a"), k("b")], 4: [k("b")]}
    assert write_minima(writes, frozenset()) == {k("a"): 3, k("b"): 4}
    assert find_conflicts({}, writes) == [5, 9]


def test_excluded_writer_causes_no_conflict_but_is_itself_checked() -> None:
    # 1 aborted: its write reservation on a is dropped, so 2 (reads a) does not conflict.
    assert find_conflicts({2: [k("a")]}, {1: [k("a")]}, excluded={1}) == []
    # 2 aborted, but its decision was taken after reading a, which 1 (live) wrote: 2 must re-run.
    assert find_conflicts({2: [k("a")]}, {1: [k("a")], 2: [k("b")]}, excluded={2}) == [2]
    # ... and 2's own write reservation on b does not hurt 3.
    assert find_conflicts({3: [k("b")]}, {1: [k("a")], 2: [k("b")]}, excluded={2}) == []


def test_result_is_sorted_and_unique() -> None:
    reads = {7: [k("a"), k("b")], 4: [k("a")]}
    writes = {1: [k("a"), k("b")], 7: [k("a"), k("b")], 4: [k("b")]}
    assert find_conflicts(reads, writes) == [4, 7]


def test_paper_figure_4() -> None:
    """Styx paper, Figure 4 and section 6.1.

    RW sets: W1 -> {k1: T1}; W2 -> {k2: T1, T2; k8: T2, T3}; W3 -> {k3: T3}. T1 commits lock-free
    on W1 and W2; T2 and T3 conflict (at k2 and k8) and go to the lock-based fallback.
    """
    t1, t2, t3 = 1, 2, 3
    k1, k2, k3, k8 = k("k1"), k("k2"), k("k3"), k("k8")
    workers = {
        "w1": ({t1: [k1]}, {t1: [k1]}),
        "w2": ({t1: [k2], t2: [k2, k8], t3: [k8]}, {t1: [k2], t2: [k2, k8], t3: [k8]}),
        "w3": ({t3: [k3]}, {t3: [k3]}),
    }
    local = {w: find_conflicts(reads, writes) for w, (reads, writes) in workers.items()}
    assert local == {"w1": [], "w2": [t2, t3], "w3": []}
    # T2 is caught at k2 alone (T1 wrote it), T3 at k8 alone (T2 wrote it).
    assert find_conflicts({t2: [k2]}, {t1: [k2], t2: [k2]}) == [t2]
    assert find_conflicts({t3: [k8]}, {t2: [k8], t3: [k8]}) == [t3]

    votes = [Vote(0, w, c, [], 0) for w, c in local.items()]
    fallback, _ = combine_votes(votes)
    assert fallback == [t2, t3]
    committed_lock_free = sorted({t1, t2, t3} - set(fallback))
    assert committed_lock_free == [t1]


# ---- property -------------------------------------------------------------------------------------

KEYS = [k(c) for c in "abcdef"]
keysets = st.lists(st.sampled_from(KEYS), max_size=4, unique=True)
txn_sets = st.dictionaries(st.integers(1, 40), st.tuples(keysets, keysets), max_size=12)


@settings(max_examples=300, deadline=None)
@given(txns=txn_sets, data=st.data())
def test_non_conflicting_set_is_order_independent(
    txns: dict[int, tuple[list[EntityKey], list[EntityKey]]], data: st.DataObject
) -> None:
    reads = {t: r for t, (r, _) in txns.items() if r}
    writes = {t: w for t, (_, w) in txns.items() if w}
    excluded = frozenset(data.draw(st.sets(st.sampled_from(sorted(txns))) if txns else st.just(set())))

    conflicts = find_conflicts(reads, writes, excluded)
    assert conflicts == sorted(set(conflicts))

    # Brute-force oracle of the Aria rule.
    expected = {
        t
        for t, (r, w) in txns.items()
        if any(lo < t and lo not in excluded and set(wl) & (set(r) | set(w)) for lo, (_, wl) in txns.items())
    }
    assert set(conflicts) == expected

    commit = sorted(set(txns) - set(conflicts) - excluded)
    # No two committed txns write the same key; none read what a lower live txn wrote.
    for i, a in enumerate(commit):
        for b in commit[i + 1 :]:
            assert not set(txns[a][1]) & set(txns[b][1])
        for lo, (_, wl) in txns.items():
            if lo < a and lo not in excluded:
                assert not set(wl) & set(txns[a][0])

    def apply(order: list[int]) -> dict[EntityKey, int]:
        state: dict[EntityKey, int] = {}
        for t in order:
            for key in txns[t][1]:
                state[key] = t
        return state

    other = data.draw(st.permutations(commit), label="commit order")
    assert apply(commit) == apply(list(other))


# ---- blind adds (Context.add) ------------------------------------------------------------------------


def test_adds_of_one_key_do_not_conflict_with_each_other() -> None:
    writes = {1: [k("a")], 2: [k("a")], 3: [k("a")]}
    adds = {1: {k("a")}, 2: {k("a")}, 3: {k("a")}}
    assert find_conflicts({}, writes, adds=adds) == []
    assert find_conflicts({}, writes) == [2, 3], "as puts they would"


def test_an_add_conflicts_with_a_lower_put_and_a_put_with_a_lower_add() -> None:
    assert find_conflicts({}, {1: [k("a")], 2: [k("a")]}, adds={2: {k("a")}}) == [2]
    assert find_conflicts({}, {1: [k("a")], 2: [k("a")]}, adds={1: {k("a")}}) == [2]


def test_a_read_after_a_lower_add_conflicts_and_before_it_does_not() -> None:
    assert find_conflicts({2: [k("a")]}, {1: [k("a")]}, adds={1: {k("a")}}) == [2]
    assert find_conflicts({1: [k("a")]}, {2: [k("a")]}, adds={2: {k("a")}}) == []


def test_an_aborted_put_below_an_add_is_no_conflict() -> None:
    writes = {1: [k("a")], 2: [k("a")]}
    assert find_conflicts({}, writes, excluded={1}, adds={2: {k("a")}}) == []


op_kinds = st.sampled_from(["read", "put", "add"])
add_sets = st.dictionaries(
    st.integers(1, 8),
    st.dictionaries(st.sampled_from([k(x) for x in "abc"]), op_kinds, min_size=1, max_size=3),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(txns=add_sets, data=st.data())
def test_what_commits_beside_adds_equals_every_serial_order_of_it(
    txns: dict[int, dict[EntityKey, str]], data: st.DataObject
) -> None:
    """Each tid reads, puts or adds to each of its keys. The rule, brute force: a tid conflicts when
    a lower tid wrote a key it reads or puts, or put a key it adds to. And what commits gives the
    same state in tid order and in any other order, with each add applied to the state so far."""
    reads = {t: [key for key, kind in ops.items() if kind == "read"] for t, ops in txns.items()}
    writes = {t: [key for key, kind in ops.items() if kind != "read"] for t, ops in txns.items()}
    adds = {t: {key for key, kind in ops.items() if kind == "add"} for t, ops in txns.items()}
    conflicts = find_conflicts(reads, writes, adds=adds)

    def clashes(t: int) -> bool:
        return any(
            lo < t and (theirs == "put" or mine != "add")
            for lo, lower in txns.items()
            for key, mine in txns[t].items()
            if (theirs := lower.get(key)) in ("put", "add")
        )

    assert set(conflicts) == {t for t in txns if clashes(t)}
    commit = sorted(set(txns) - set(conflicts))

    def apply(order: list[int]) -> dict[EntityKey, int]:
        state: dict[EntityKey, int] = {}
        for t in order:
            for key, kind in txns[t].items():
                if kind == "put":
                    state[key] = 100 * t
                elif kind == "add":
                    state[key] = state.get(key, 0) + t
        return state

    other = data.draw(st.permutations(commit), label="commit order")
    assert apply(commit) == apply(list(other))


def test_added_adds_to_numbers_and_fields_and_names_what_it_cannot_add_to() -> None:
    assert added(None, 3) == 3 and added(2.5, 1) == 3.5
    assert added(None, 3, "n") == {"n": 3}
    assert added({"n": 1, "x": "a"}, 2, "n") == {"n": 3, "x": "a"}
    assert added({"x": "a"}, 2, "n") == {"x": "a", "n": 2}
    for value, amount, field, message in (
        ("a", 1, None, "the state is a str, not a number"),
        (True, 1, None, "the state is a bool, not a number"),
        ([1], 1, "n", "the state is a list, not a dict with field 'n'"),
        ({"n": "a"}, 1, "n", "field 'n' is a str, not a number"),
        (1, True, None, "amount must be an int or a float, not bool"),
    ):
        with pytest.raises(TypeError, match=message):
            added(value, amount, field)
