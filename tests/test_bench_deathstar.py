"""The DeathStar workloads (benchmarks.deathstar): invariant checks, mixes, and runs on a cluster.

* ``check_state`` on hand-made states: a consistent state passes (also with unrelated entities, as in
  a full snapshot) and every kind of violation is reported, naming the entity;
* the request mixes and the geo index;
* the in-process cluster: load + a few hundred requests, the state passes the check and equals the
  serial execution; the broken apps' state (``tests.apps.deathstar_broken``) fails it;
* real services (Tansu + worker processes): load, a few hundred concurrent requests drawn by
  ``next_op``, ``check()`` clean; the broken variants are caught.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from typing import Any

import pytest

from styx_benchmarks.deathstar import (
    CELL_COLS,
    CELL_DEG,
    CELL_ROWS,
    HOTEL_MIX,
    LAT_MAX,
    LAT_MIN,
    LON_MAX,
    LON_MIN,
    SEARCH_RADIUS_KM,
    HotelReservation,
    MovieReview,
    cell_key,
    distance_km,
)
from styx_benchmarks.workload import Op, Options, Workload
from styx_benchmarks.workloads import make_workload
from styx_client import StyxClient, result_of
from styx_py.core.partitioning import Key
from styx_py.core.wire import DeployRequest, Reply
from styx_py.stack.local import LocalStack, admin
from styx_py.testing.cluster import SimCluster, check_against_serial
from tests.service_fixtures import ClusterFactory

MANY_RESERVES = {"search": 0.3, "recommend": 0.1, "login": 0.1, "reserve": 0.5}


def hotel_workload(**extra: Any) -> HotelReservation:
    """4 hotels, 4 flights, 20 users; 2 rooms/seats each unless told otherwise."""
    return HotelReservation(Options(scale=0.04, seed=3, extra={"capacity": 2, **extra}))


def movie_workload() -> MovieReview:
    """20 users, 20 movies."""
    return MovieReview(Options(scale=0.02, seed=3))


# ---- hotel: check_state on hand-made states ------------------------------------------------------------


def hotel_state() -> dict[tuple[str, Key], Any]:
    """A consistent state of ``hotel_workload()``: three reservations, hotel0 and flight1 full."""
    return {
        ("hotel", "hotel0"): {"capacity": 2, "bookings": ["r1", "r2"]},
        ("hotel", "hotel1"): {"capacity": 2, "bookings": ["r3"]},
        ("hotel", "hotel2"): {"capacity": 2, "bookings": []},
        ("hotel", "hotel3"): {"capacity": 2, "bookings": []},
        ("flight", "flight0"): {"capacity": 2, "bookings": ["r3"]},
        ("flight", "flight1"): {"capacity": 2, "bookings": ["r1", "r2"]},
        ("flight", "flight2"): {"capacity": 2, "bookings": []},
        ("flight", "flight3"): {"capacity": 2, "bookings": []},
        ("reservation", "Cornell_0"): [
            {"id": "r1", "hotel": "hotel0", "flight": "flight1"},
            {"id": "r3", "hotel": "hotel1", "flight": "flight0"},
        ],
        ("reservation", "Cornell_7"): [{"id": "r2", "hotel": "hotel0", "flight": "flight1"}],
    }


def test_hotel_consistent_state_passes() -> None:
    w = hotel_workload()
    assert w.check_state(hotel_state()) == []


def test_hotel_check_ignores_other_entities_of_a_full_snapshot() -> None:
    w = hotel_workload()
    state = hotel_state()
    for operator, items in w.initial_state().items():
        for key, value in items:
            state.setdefault((operator, key), value)
    state[("search", "loader0")] = None
    state[("geo", "3:4")] = [["hotel0", 38.0, -122.1]]
    assert w.check_state(state) == []


def test_hotel_overbooking_is_reported() -> None:
    state = hotel_state()
    state[("flight", "flight1")]["bookings"].append("r4")
    state[("hotel", "hotel2")]["bookings"].append("r4")
    state[("reservation", "Cornell_3")] = [{"id": "r4", "hotel": "hotel2", "flight": "flight1"}]
    errors = hotel_workload().check_state(state)
    assert errors == ["flight flight1 is overbooked: 3 bookings for capacity 2"]


def test_hotel_booking_without_a_reservation_is_reported() -> None:
    state = hotel_state()
    state[("hotel", "hotel3")]["bookings"].append("r9")
    errors = hotel_workload().check_state(state)
    assert errors == [
        "hotel hotel3 has 1 bookings, but 0 recorded reservations name it",
        "hotel hotel3 books reservation r9, which no user's ledger records",
    ]


def test_hotel_reservation_without_its_flight_part_is_reported() -> None:
    state = hotel_state()
    state[("flight", "flight0")]["bookings"].remove("r3")
    errors = hotel_workload().check_state(state)
    assert errors == [
        "flight flight0 has 0 bookings, but 1 recorded reservations name it",
        "reservation r3 of user Cornell_0 has no flight part: "
        "flight flight0 does not book it (it books nothing)",
    ]


def test_hotel_booking_of_another_entitys_reservation_is_reported() -> None:
    state = hotel_state()
    state[("hotel", "hotel1")]["bookings"] = []
    state[("hotel", "hotel2")]["bookings"] = ["r3"]
    errors = hotel_workload().check_state(state)
    assert "hotel hotel2 books reservation r3, which names hotel hotel1" in errors
    assert (
        "reservation r3 of user Cornell_0 has no hotel part: hotel hotel1 does not book it (it books nothing)"
        in errors
    )


def test_hotel_missing_entities_and_dangling_names_are_reported() -> None:
    state = hotel_state()
    del state[("flight", "flight1")]
    errors = hotel_workload().check_state(state)
    assert errors == [
        "flight flight1 is missing",
        "reservation r1 of user Cornell_0 names flight flight1, which does not exist",
        "reservation r2 of user Cornell_7 names flight flight1, which does not exist",
    ]


def test_hotel_duplicates_and_capacity_changes_are_reported() -> None:
    state = hotel_state()
    state[("hotel", "hotel1")]["bookings"].append("r3")
    state[("flight", "flight3")]["capacity"] = 5
    state[("reservation", "Cornell_9")] = [{"id": "r2", "hotel": "hotel0", "flight": "flight1"}, {"id": "r5"}]
    errors = hotel_workload().check_state(state)
    assert errors == [
        "reservation r2 is recorded twice (users Cornell_7 and Cornell_9)",
        "user Cornell_9 records an incomplete reservation {'id': 'r5'}",
        "hotel hotel1 has 2 bookings, but 1 recorded reservations name it",
        "hotel hotel1 books reservation r3 2 times, expected once",
        "flight flight3 has capacity 5, expected 2",
    ]


# ---- movie: check_state on hand-made states ------------------------------------------------------------


def review(rid: str, user: str, movie: str, rating: int) -> dict[str, Any]:
    return {
        "review_id": rid,
        "user_id": user,
        "movie_id": movie,
        "text": f"text of {rid}",
        "rating": rating,
        "timestamp_ms": 1_700_000_000_000,
    }


def movie_state() -> dict[tuple[str, Key], Any]:
    """Three reviews by two users of two movies, fully stored and indexed."""
    return {
        ("review_storage", "a"): review("a", "user1", "movie2", 7),
        ("review_storage", "b"): review("b", "user1", "movie3", 0),
        ("review_storage", "c"): review("c", "user4", "movie2", 10),
        ("user_review", "user1"): ["a", "b"],
        ("user_review", "user4"): ["c"],
        ("movie_review", "movie2"): ["c", "a"],
        ("movie_review", "movie3"): ["b"],
        ("rating", "movie2"): {"count": 2, "sum": 17},
        ("rating", "movie3"): {"count": 1, "sum": 0},
    }


def test_movie_consistent_state_passes() -> None:
    w = movie_workload()
    assert w.check_state(movie_state()) == []
    assert w.check_state({}) == []


def test_movie_check_ignores_other_entities_of_a_full_snapshot() -> None:
    w = movie_workload()
    state = movie_state()
    for operator, items in w.initial_state().items():
        for key, value in items:
            state[(operator, key)] = value
    assert w.check_state(state) == []


def test_movie_review_missing_from_its_movie_list_is_reported() -> None:
    state = movie_state()
    state[("movie_review", "movie2")] = ["c"]
    errors = movie_workload().check_state(state)
    assert errors == ["review a appears 0 times in movie movie2's review list, expected once"]


def test_movie_review_listed_twice_is_reported() -> None:
    state = movie_state()
    state[("user_review", "user4")] = ["c", "c"]
    errors = movie_workload().check_state(state)
    assert errors == ["review c appears 2 times in user user4's review list, expected once"]


def test_movie_list_naming_a_missing_or_foreign_review_is_reported() -> None:
    state = movie_state()
    state[("user_review", "user4")] = ["c", "zz", "a"]
    errors = movie_workload().check_state(state)
    assert errors == [
        "user user4's review list names review a, which belongs to user user1",
        "user user4's review list names review zz, which is not stored",
    ]


def test_movie_incomplete_review_is_reported() -> None:
    state = movie_state()
    del state[("review_storage", "b")]["text"]
    state[("review_storage", "c")]["rating"] = 11
    errors = movie_workload().check_state(state)
    assert errors == [
        "review b lacks text",
        "review c has rating 11, expected an int in 0..10",
        # An unusable review counts as not stored: its ratings and list entries no longer add up.
        "movie movie2's rating totals are count 2 sum 17, but its 1 stored reviews give count 1 sum 7",
        "movie movie3's rating totals are count 1 sum 0, but its 0 stored reviews give count 0 sum 0",
    ]


def test_movie_rating_totals_are_checked() -> None:
    state = movie_state()
    state[("rating", "movie3")] = {"count": 1, "sum": 4}
    del state[("rating", "movie2")]
    errors = movie_workload().check_state(state)
    assert errors == [
        "movie movie2's rating totals are count 0 sum 0, but its 2 stored reviews give count 2 sum 17",
        "movie movie3's rating totals are count 1 sum 4, but its 1 stored reviews give count 1 sum 0",
    ]


# ---- mixes and data --------------------------------------------------------------------------------------


def draw(w: Workload, n: int, seed: int = 11) -> list[Op]:
    rng = random.Random(seed)
    return [w.next_op(rng) for _ in range(n)]


def test_registry_knows_both_workloads() -> None:
    assert isinstance(make_workload("deathstar-hotel"), HotelReservation)
    assert isinstance(make_workload("deathstar-movie"), MovieReview)


def test_hotel_mix_follows_the_paper() -> None:
    w = HotelReservation()
    assert (w.hotels, w.flights, w.users, w.capacity) == (100, 100, 500, 10)
    n = 40_000
    counts = Counter(op.label for op in draw(w, n))
    for label, share in HOTEL_MIX.items():
        sd = math.sqrt(share * (1 - share) / n)
        assert abs(counts[label] / n - share) < 5 * sd, (label, counts[label])


def test_ops_are_reproducible_by_seed_and_mix_can_be_replaced() -> None:
    assert draw(hotel_workload(), 200) == draw(hotel_workload(), 200)
    assert draw(movie_workload(), 50) == draw(movie_workload(), 50)
    only = HotelReservation(Options(extra={"mix": {"reserve": 1}}))
    assert {op.label for op in draw(only, 100)} == {"reserve"}
    with pytest.raises(ValueError, match="unknown request kinds"):
        HotelReservation(Options(extra={"mix": {"reserve": 1, "cancel": 1}}))
    with pytest.raises(ValueError, match="positive sum"):
        HotelReservation(Options(extra={"mix": {"reserve": 0}}))
    with pytest.raises(ValueError, match="capacity"):
        HotelReservation(Options(extra={"capacity": 0}))


def test_movie_ops_compose_valid_reviews() -> None:
    w = MovieReview()
    assert (w.users, w.movies) == (1000, 1000)
    for op in draw(w, 100):
        user, _title, rating, text = op.args
        assert (op.operator, op.function, op.key) == ("frontend", "compose", user)
        assert 0 <= rating <= 10 and len(text) == 256


def test_geo_cells_hold_every_hotel_within_the_search_radius() -> None:
    w = HotelReservation(Options(scale=2.0))
    state = w.initial_state()
    positions = {key: (lat, lon) for _, entries in state["geo"] for key, lat, lon in entries}
    assert len(positions) == w.hotels
    cells = dict(state["geo"])
    assert len(state["recommend"]) == len(cells) <= CELL_ROWS * CELL_COLS
    rng = random.Random(5)
    for _ in range(300):
        lat, lon = rng.uniform(LAT_MIN, LAT_MAX), rng.uniform(LON_MIN, LON_MAX)
        near = {
            k
            for k, (hlat, hlon) in positions.items()
            if distance_km(lat, lon, hlat, hlon) <= SEARCH_RADIUS_KM
        }
        indexed = {entry[0] for entry in cells.get(cell_key(lat, lon), [])}
        assert near <= indexed, (lat, lon)
    assert CELL_DEG * 111.0 * math.cos(math.radians(LAT_MAX)) > SEARCH_RADIUS_KM


def test_load_calls_chunk_every_entity() -> None:
    w = HotelReservation(Options(scale=2.0))
    calls = w.load_calls()
    loaded = Counter(op for op, _, fn, (items,) in calls for _ in items if fn == "load")
    assert loaded == {op: len(items) for op, items in w.initial_state().items()}
    assert max(len(args[0]) for _, _, _, args in calls) <= 500
    assert len({(op, key) for op, key, _, _ in calls}) == len(calls)


# ---- the in-process cluster ------------------------------------------------------------------------------


async def run_sim(
    app: str, w: HotelReservation | MovieReview, n_ops: int, seed: int, extra: tuple[Op, ...] = ()
) -> SimCluster:
    """Load, then ``n_ops`` requests drawn by ``next_op`` (and ``extra``), all in flight together."""
    async with SimCluster(app, workers=3, seed=seed, epoch_size_max=50) as c:
        for operator, key, function, args in w.load_calls():
            c.submit(operator, function, key, *args)
        await c.wait()
        assert all(r.status == "committed" for r in c.replies)
        for op in [*draw(w, n_ops, seed), *extra]:
            c.submit(op.operator, op.function, op.key, *op.args, request_id=f"{op.label}-{len(c.requests)}")
        await c.wait()
        await check_against_serial(c)
        return c


async def test_sim_hotel_run_keeps_the_invariants() -> None:
    w = hotel_workload(mix=MANY_RESERVES)
    wrong = Op("bad-login", "user", "Cornell_3", "login", ("3333",))
    c = await run_sim("styx_benchmarks.deathstar:hotel_app", w, 300, seed=1, extra=(wrong,))
    statuses = Counter(r.status for r in c.replies)
    assert statuses["failed"] == 0, statuses
    assert any("is full" in (r.error or "") for r in c.replies)
    assert w.check_state(c.state()) == []
    logins = {r.request_id: result_of(r) for r in c.replies if "login" in r.request_id}
    assert logins.pop(f"bad-login-{len(c.requests) - 1}") is False
    assert logins and all(result is True for result in logins.values())


async def test_sim_broken_hotel_app_is_caught() -> None:
    w = hotel_workload(mix=MANY_RESERVES)
    c = await run_sim("tests.apps.deathstar_broken:hotel_app", w, 300, seed=1)
    errors = w.check_state(c.state())
    assert any(e.startswith("flight ") and "is overbooked" in e for e in errors), errors


async def test_sim_movie_run_keeps_the_invariants() -> None:
    w = movie_workload()
    c = await run_sim("styx_benchmarks.deathstar:movie_app", w, 200, seed=2)
    assert all(r.status == "committed" for r in c.replies)
    assert w.check_state(c.state()) == []


async def test_sim_broken_movie_app_is_caught() -> None:
    w = movie_workload()
    c = await run_sim("tests.apps.deathstar_broken:movie_app", w, 50, seed=2)
    errors = w.check_state(c.state())
    assert len(errors) == 50 and all("times in movie" in e for e in errors), errors


# ---- real services ---------------------------------------------------------------------------------------


@pytest.fixture
def stack(local_cluster: ClusterFactory) -> LocalStack:
    """Coordinator + 2 worker processes on the session's Tansu, with topics of their own; nothing deployed."""
    return local_cluster()


async def run_real(
    stack: LocalStack, app: str, w: Workload, n_ops: int, seed: int
) -> tuple[Counter[tuple[str, str]], list[Reply], list[str]]:
    """Deploy ``app``, load, run ``n_ops`` requests drawn by ``next_op`` concurrently, and check.

    Returns the count of (request kind, status), the replies and the check's errors.
    """
    await admin(stack.coordinator, DeployRequest(app))
    async with await StyxClient.connect(stack.coordinator, timeout_s=60) as client:
        await w.load(client, progress=lambda _: None)
        ops = draw(w, n_ops, seed)
        replies = await asyncio.gather(
            *(client.submit(op.operator, op.key, op.function, *op.args) for op in ops)
        )
        outcomes = Counter((op.label, r.status) for op, r in zip(ops, replies, strict=True))
        return outcomes, list(replies), await w.check(client)


@pytest.mark.services
async def test_real_hotel_run_keeps_the_invariants(stack: LocalStack) -> None:
    w = hotel_workload(mix=MANY_RESERVES)
    outcomes, replies, errors = await run_real(stack, w.app, w, 400, seed=4)
    ops = draw(w, 400, seed=4)
    assert errors == []
    # Every search, recommendation and login commits; 4 hotels x 2 rooms bound the reservations.
    assert {status for (label, status) in outcomes if label != "reserve"} == {"committed"}, outcomes
    assert set(outcomes) >= {("search", "committed"), ("recommend", "committed"), ("login", "committed")}
    assert 0 < outcomes[("reserve", "committed")] <= 8 < outcomes[("reserve", "aborted")], outcomes
    aborted = [r for r in replies if r.status != "committed"]
    assert all(r.status == "aborted" and "is full" in (r.error or "") for r in aborted), aborted[:3]
    recommended = [result_of(r) for op, r in zip(ops, replies, strict=True) if op.label == "recommend"]
    assert any(recommended) and {h for hs in recommended for h in hs} <= {f"hotel{i}" for i in range(4)}


@pytest.mark.services
async def test_real_broken_hotel_app_is_caught(stack: LocalStack) -> None:
    w = hotel_workload(mix=MANY_RESERVES)
    _, _, errors = await run_real(stack, "tests.apps.deathstar_broken:hotel_app", w, 400, seed=4)
    assert any(e.startswith("flight ") and "is overbooked" in e for e in errors), errors


@pytest.mark.services
async def test_real_movie_run_keeps_the_invariants(stack: LocalStack) -> None:
    w = movie_workload()
    outcomes, _, errors = await run_real(stack, w.app, w, 300, seed=5)
    assert errors == []
    assert outcomes == {("compose", "committed"): 300}


@pytest.mark.services
async def test_real_broken_movie_app_is_caught(stack: LocalStack) -> None:
    w = movie_workload()
    _, _, errors = await run_real(stack, "tests.apps.deathstar_broken:movie_app", w, 100, seed=5)
    assert len(errors) == 100 and all("times in movie" in e for e in errors), errors[:5]
