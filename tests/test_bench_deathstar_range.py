"""DeathStar hotel search with the geo index as range reads (styx_benchmarks.deathstar.hotel_range).

* the key ranges of a search hold every hotel within the radius (a property over random points);
* the range app, run by the serial model, answers every search and recommendation as a brute-force
  model over the same hotels does, through moves and in pages of one row; its searches equal the
  grid app's on the same requests;
* the workload's check catches a broken index;
* the in-process cluster: load + requests with moves, every reply and the state equal the serial
  execution, and the check is clean;
* real services: ``styx bench deathstar-hotel --geo range`` runs and checks clean;
* ``python -m styx_benchmarks.geo_cost`` runs both variants.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from styx_benchmarks import geo_cost
from styx_benchmarks.deathstar import (
    SEARCH_RADIUS_KM,
    HotelReservation,
    distance_km,
    geo_key,
    hotel_app,
    hotel_range,
    hotel_range_app,
    search_ranges,
)
from styx_benchmarks.deathstar.hotel import LAT_MAX, LAT_MIN, LON_MAX, LON_MIN
from styx_benchmarks.workload import Op, Options
from styx_client import result_of
from styx_py.cli import main as styx_main
from styx_py.core.graph import Graph
from styx_py.core.partitioning import Key
from styx_py.core.serial import apply_serially
from styx_py.core.wire import Phase, Request, encode_value
from styx_py.stack.local import LocalStack
from styx_py.testing.cluster import SimCluster, check_against_serial
from tests.service_fixtures import ClusterFactory

GEO_APP = "styx_benchmarks.deathstar:hotel_range_app"
WITH_MOVES = {"search": 0.4, "recommend": 0.2, "login": 0.05, "reserve": 0.15, "move": 0.2}


def range_workload(scale: float = 0.3, **extra: Any) -> HotelReservation:
    return HotelReservation(Options(scale=scale, seed=7, extra={"geo": "range", **extra}))


def test_search_ranges_hold_every_point_within_the_radius() -> None:
    rng = random.Random(2)
    for _ in range(2000):
        lat, lon = rng.uniform(LAT_MIN, LAT_MAX), rng.uniform(LON_MIN, LON_MAX)
        ranges = search_ranges(lat, lon)
        assert 1 <= len(ranges) <= 2
        # A point at a random bearing, at most the radius away (many right on its edge).
        bearing, d = rng.uniform(0, 2 * math.pi), SEARCH_RADIUS_KM * min(1.0, rng.uniform(0, 1.3))
        dlat = math.degrees(d * math.cos(bearing) / 6371.0)
        hlat = lat + dlat
        hlon = lon + math.degrees(d * math.sin(bearing) / 6371.0) / math.cos(math.radians(lat + dlat / 2))
        if distance_km(lat, lon, hlat, hlon) <= SEARCH_RADIUS_KM:
            key = geo_key(hlat, hlon, "hotel1")
            assert any(start <= key < end for start, end in ranges), (lat, lon, hlat, hlon)


# ---- the serial model against brute force ----------------------------------------------------------------


class Serial:
    """The state of an app run one request at a time by the serial model."""

    def __init__(self, graph: Graph, w: HotelReservation) -> None:
        self.graph = graph
        self.state: dict[tuple[str, Key], bytes] = {
            (op, key): encode_value(value) for op, items in w.initial_state().items() for key, value in items
        }
        self.tid = 0

    async def run(self, op: Op) -> tuple[str, Any]:
        self.tid += 1
        args = msgspec.Raw(encode_value(list(op.args)))
        request = Request(f"r{self.tid}", op.operator, op.function, op.key, args)
        return await apply_serially(self.graph, self.state, request, self.tid)


def brute_force(positions: dict[str, tuple[float, float, float, float]], op: Op) -> Any:
    """What a search or recommendation returns, computed over every hotel."""
    require, lat, lon = op.args if op.label == "recommend" else ("", *op.args[:2])
    near = sorted(
        (distance_km(lat, lon, hlat, hlon), hotel, rating, price)
        for hotel, (hlat, hlon, rating, price) in positions.items()
        if distance_km(lat, lon, hlat, hlon) <= SEARCH_RADIUS_KM
    )
    if op.label == "search":
        return [hotel for _, hotel, _, _ in near[:5]]
    scores = [(d if require == "dis" else -r if require == "rate" else p, h) for d, h, r, p in near]
    best = min((s for s, _ in scores), default=None)
    return sorted(h for s, h in scores if s == best)


async def check_against_brute_force(w: HotelReservation, n_ops: int) -> Counter[str]:
    serial = Serial(hotel_range_app, w)
    positions = {entry[0]: (entry[1], entry[2], entry[3], entry[4]) for _, entry in w.initial_state()["geo"]}
    seen: Counter[str] = Counter()
    rng = random.Random(11)
    for _ in range(n_ops):
        op = w.next_op(rng)
        status, result = await serial.run(op)
        assert status == "committed" or op.label == "reserve", (op, status, result)
        if op.label == "move":
            hotel = str(op.key)
            positions[hotel] = (op.args[0], op.args[1], *positions[hotel][2:])
            assert result == geo_key(op.args[0], op.args[1], hotel)
        elif op.label == "search":
            assert [found["hotel"] for found in result] == [
                h for h in brute_force(positions, op) if rate_covers(h, op)
            ], op
            seen["found"] += bool(result)
        elif op.label == "recommend":
            assert result == brute_force(positions, op), op
            seen["recommended"] += bool(result)
        seen[op.label] += 1
    state = {k: msgspec.msgpack.decode(v) for k, v in serial.state.items()}
    assert w.check_state(state) == []
    return seen


def rate_covers(hotel: str, op: Op) -> bool:
    """The workload's rate plans: stays from the 9th, to the 17th (even hotels) or the 24th (odd)."""
    last = "2015-04-17" if int(hotel.removeprefix("hotel")) % 2 == 0 else "2015-04-24"
    return op.args[3] <= last


async def test_range_search_equals_brute_force_through_moves() -> None:
    seen = await check_against_brute_force(range_workload(mix=WITH_MOVES), 600)
    assert seen["move"] > 50 and seen["found"] > 50 and seen["recommended"] > 50, seen


async def test_range_search_pages_when_a_range_holds_more_than_a_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hotel_range, "GEO_PAGE", 2)
    seen = await check_against_brute_force(range_workload(scale=1.0, mix=WITH_MOVES), 150)
    assert seen["found"] > 10, seen


async def test_range_and_grid_searches_agree_on_the_same_requests() -> None:
    grid = HotelReservation(Options(scale=1.0, seed=7))
    ranged = range_workload(scale=1.0)
    on_grid, on_range = Serial(hotel_app, grid), Serial(hotel_range_app, ranged)
    rng_grid, rng_range = random.Random(5), random.Random(5)
    searches = 0
    for _ in range(300):
        op = grid.next_op(rng_grid)
        assert ranged.next_op(rng_range) == op  # the default mix: the same request stream
        if op.label == "search":
            searches += 1
            assert await on_grid.run(op) == await on_range.run(op), op
    assert searches > 100


# ---- the check -------------------------------------------------------------------------------------------


def test_range_check_catches_a_broken_index() -> None:
    w = range_workload(scale=0.04)
    state: dict[tuple[str, Key], Any] = {
        (op, key): value for op, items in w.initial_state().items() for key, value in items
    }
    assert w.check_state(state) == []
    [(key0, entry0), (key1, _), *_] = sorted(k for k in state.items() if k[0][0] == "geo")
    stale = dict(state)
    stale[("geo", "0000/00000000/" + entry0[0])] = entry0  # a second entry of the same hotel
    del stale[key1]  # and another hotel's entry lost
    errors = w.check_state(stale)
    hotel, lat, lon = entry0[:3]
    assert f"geo entry 0000/00000000/{hotel} of {hotel} at ({lat}, {lon}) belongs at {key0[1]}" in errors
    assert any(e.endswith(f"names geo entry {key1[1]!r}, which does not exist") for e in errors), errors
    assert len(errors) == 3, errors
    with pytest.raises(ValueError, match="unknown request kinds"):
        HotelReservation(Options(extra={"mix": {"move": 1}}))  # the grid variant has no moves
    with pytest.raises(ValueError, match="geo must be one of"):
        HotelReservation(Options(extra={"geo": "quadtree"}))


# ---- the in-process cluster ------------------------------------------------------------------------------


async def test_sim_range_run_equals_the_serial_execution() -> None:
    w = range_workload(scale=0.1, capacity=2, mix=WITH_MOVES)
    async with SimCluster(GEO_APP, workers=3, seed=4, epoch_size_max=50) as c:
        for operator, key, function, args in w.load_calls():
            c.submit(operator, function, key, *args)
        await c.wait()
        assert all(r.status == "committed" for r in c.replies)
        rng = random.Random(4)
        ops = [w.next_op(rng) for _ in range(300)]
        for n, op in enumerate(ops):
            c.submit(op.operator, op.function, op.key, *op.args, request_id=f"{op.label}-{n}")
        await c.wait()
        await check_against_serial(c)
        assert w.check_state(c.state()) == []
        replies = {r.request_id: r for r in c.replies}
        outcome = Counter((op.label, replies[f"{op.label}-{n}"].status) for n, op in enumerate(ops))
        assert outcome[("move", "committed")] > 30 and outcome[("search", "committed")] > 60, outcome
        # Moves of lower tids into or out of scanned ranges: those searches re-ran in the fallback.
        rerun = [op for n, op in enumerate(ops) if replies[f"{op.label}-{n}"].phase == Phase.FALLBACK]
        assert sum(op.label == "search" for op in rerun) > 10, Counter(op.label for op in rerun)
        found = [result_of(replies[f"search-{n}"]) for n, op in enumerate(ops) if op.label == "search"]
        assert any(found), "no search found a hotel"


# ---- real services ---------------------------------------------------------------------------------------


@pytest.mark.services
def test_styx_bench_runs_the_range_variant(
    local_cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster: LocalStack = local_cluster()
    assert range_workload().app == GEO_APP
    cluster.deploy(GEO_APP)
    out = tmp_path / "results"
    args = ["--coordinator", cluster.coordinator, "--rate", "100", "--duration", "2", "--warmup", "0.5"]
    code = styx_main(
        ["bench", "deathstar-hotel", *args, "--geo", "range", "--scale", "0.1", "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "check: OK" in printed
    [results] = list(out.glob("deathstar-hotel-100-*.json"))
    doc = json.loads(results.read_text())
    assert doc["result"]["check"] == [] and doc["result"]["answered"] == 200, doc["result"]
    assert doc["config"]["options"]["extra"]["geo"] == "range"


def test_the_geo_cost_benchmark_runs_both_variants(capsys: pytest.CaptureFixture[str]) -> None:
    assert geo_cost.main(["--requests", "30", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("30 requests; range scans per search or recommendation: 1.")
    assert [line.split(":")[1].strip() for line in lines[1:]] == ["grid", "range"]
    assert all("µs of CPU per request (replies = serial execution)" in line for line in lines[1:])
