"""DeathStar's hotel app with the geo index as range reads (``styx_benchmarks.deathstar:hotel_range_app``).

The same operators and requests as :mod:`~styx_benchmarks.deathstar.hotel` (the grid-cell variant),
except for the geo index and what reads it:

* ``geo`` holds one entity per hotel, keyed by a sortable position: :func:`geo_key` is
  ``"{band:04d}/{lon step:08d}/{hotel}"``, a latitude band of :data:`GEO_BAND_DEG` (counted from the
  south pole) then the longitude in steps of 1e-5° (about 1 m, counted from the antimeridian), both
  fixed-width, so str order is band order, then longitude order. The value is a covering entry
  ``[hotel, lat, lon, rating, price]``: a search needs no read beyond the scan to rank the hotels.
* *search* (``search.nearby``, at the query's cell as in the grid variant, only to spread the roots
  over partitions) scans, in each latitude band the search circle overlaps, the longitude window of
  the circle (:func:`search_ranges`: one or two ``ctx.scan`` calls, each visiting every partition of
  ``geo``), keeps the ≤ 5 nearest hotels within 4 km and reads their rate plans (``rate.plan``);
* *recommend* (``recommend.recommend``) scans the same ranges and ranks the hotels within 4 km by
  distance, rating or price (the grid variant ranks the 3 x 3 block of cells around the query);
* *move* (``hotel.move(lat, lon)``) relocates a hotel: the hotel entity names its geo key (field
  ``geo``), ``geo.relocate`` at that key deletes the entry and inserts it at the new position's key,
  and the hotel records the new key, in one transaction. A move into or out of a range that a
  search of the same epoch scanned, by a lower tid, is a conflict (no phantoms): the search re-runs
  in the fallback and sees the index after the move.

Shaped by ``ctx.scan``'s limits: a scan returns at most :data:`~styx_py.core.limits.MAX_SCAN_LIMIT`
rows (1 000), so :func:`geo_scan` pages with ``after=`` when a range holds more (never at the standard
scale: a range holds a few hotels); in the fallback a scan locks its whole partition of ``geo``, so
the index is an operator of its own (its lock holds up only moves, never bookings or rate reads),
and the roots of searches live in other operators than ``geo`` (a transaction that scans a partition
and invokes an entity of it runs alone, after the fallback). Every scan visits every partition of
``geo``: a search costs (bands overlapped) x ``PARTITIONS`` scan calls plus one call per hotel found.
No wrap-around at the antimeridian: DeathStar's area lies far from it.
"""

from __future__ import annotations

import math
from typing import Any

from styx_benchmarks.deathstar.common import BULK_STATE, PARTITIONS
from styx_benchmarks.deathstar.hotel import (
    EARTH_RADIUS_KM,
    FUNCTIONS,
    SEARCH_RADIUS_KM,
    best_of,
    distance_km,
    nearest,
    with_rates,
)
from styx_benchmarks.graphs import FunctionTable, Overrides, build_graph
from styx_py import Abort, Context, Graph
from styx_py.core.limits import MAX_SCAN_LIMIT
from styx_py.core.partitioning import Key

GEO_BAND_DEG = 0.1  # a latitude band: 11.1 km, so a 4 km search circle (8 km tall) overlaps 1 or 2
LON_STEPS_PER_DEG = 100_000
GEO_PAGE = MAX_SCAN_LIMIT  # rows per scan; a range with more is read in pages (after=)
# Bounds are widened by this much so that float rounding never cuts off a hotel on the circle's edge.
MARGIN_DEG = 1e-9


def band_of(lat: float) -> int:
    return math.floor((lat + 90.0) / GEO_BAND_DEG)


def lon_step(lon: float) -> int:
    return math.floor((lon + 180.0) * LON_STEPS_PER_DEG)


def geo_key(lat: float, lon: float, hotel: str) -> str:
    """The geo index key of ``hotel`` at (lat, lon): sorts by latitude band, then longitude."""
    return f"{band_of(lat):04d}/{lon_step(lon):08d}/{hotel}"


def search_ranges(lat: float, lon: float, radius_km: float = SEARCH_RADIUS_KM) -> list[tuple[str, str]]:
    """The key ranges ``[start, end)`` that hold every hotel within ``radius_km`` of (lat, lon): one per
    latitude band the circle overlaps, each the circle's longitude window in that band.

    Bounds of the equirectangular distance (:func:`~styx_benchmarks.deathstar.hotel.distance_km`):
    within the radius, |Δlat| ≤ r/R and |Δlon| ≤ r / (R cos(mean latitude)), and the mean latitude is
    at most |lat| + Δlat from the equator."""
    dlat = math.degrees(radius_km / EARTH_RADIUS_KM) + MARGIN_DEG
    worst = math.radians(min(89.0, abs(lat) + dlat))
    dlon = math.degrees(radius_km / EARTH_RADIUS_KM) / math.cos(worst) + MARGIN_DEG
    low, high = lon_step(lon - dlon), lon_step(lon + dlon) + 1
    bands = range(band_of(lat - dlat), band_of(lat + dlat) + 1)
    return [(f"{band:04d}/{low:08d}", f"{band:04d}/{high:08d}") for band in bands]


async def geo_scan(ctx: Context, start: str | None, end: str | None) -> list[tuple[Key, Any]]:
    """Every geo entry with a key in ``[start, end)`` (None: unbounded), in pages of GEO_PAGE rows."""
    rows = await ctx.scan("geo", start=start, end=end, limit=GEO_PAGE)
    found = list(rows)
    while len(rows) == GEO_PAGE:
        rows = await ctx.scan("geo", after=rows[-1][0], end=end, limit=GEO_PAGE)
        found += rows
    return found


async def entries_near(ctx: Context, lat: float, lon: float) -> list[list[Any]]:
    """The geo entries of the ranges around (lat, lon), a superset of the hotels within the radius."""
    entries: list[list[Any]] = []
    for start, end in search_ranges(lat, lon):
        entries += [value for _, value in await geo_scan(ctx, start, end)]
    return entries


async def search_nearby(
    ctx: Context, lat: float, lon: float, in_date: str, out_date: str
) -> list[dict[str, Any]]:
    """Hotels within the radius of (lat, lon) with a rate plan covering the stay, nearest first."""
    hotels = nearest(lat, lon, await entries_near(ctx, lat, lon))
    return await with_rates(ctx, hotels, in_date, out_date)


async def recommend_near(ctx: Context, require: str, lat: float, lon: float) -> list[str]:
    """DeathStar's recommendation over the hotels within the radius of (lat, lon)."""
    near = [
        e for e in await entries_near(ctx, lat, lon) if distance_km(lat, lon, e[1], e[2]) <= SEARCH_RADIUS_KM
    ]
    return best_of(require, lat, lon, near)


async def index(ctx: Context) -> list[tuple[Key, Any]]:
    """The whole geo index as ``[(key, entry)]`` in key order (the workload's check reads it)."""
    return await geo_scan(ctx, None, None)


async def relocate(ctx: Context, lat: float, lon: float) -> str:
    """Move this geo entry to (lat, lon): delete it and insert it at the new key; return that key."""
    entry = await ctx.get()
    if entry is None:
        raise Abort(f"geo entry {ctx.key} does not exist")
    hotel, _, _, rating, price = entry
    key = geo_key(lat, lon, hotel)
    moved = [hotel, lat, lon, rating, price]
    if key == ctx.key:
        await ctx.put(moved)
    else:
        await ctx.delete()
        ctx.call_async(ctx.operator, "init", key, moved)
    return key


async def move(ctx: Context, lat: float, lon: float) -> str:
    """Relocate this hotel to (lat, lon): its geo entry moves to the new key, which the hotel records."""
    entity = await ctx.get()
    if entity is None:
        raise Abort(f"hotel {ctx.key} does not exist")
    entity["geo"] = await ctx.call("geo", "relocate", entity["geo"], lat, lon)
    await ctx.put(entity)
    return str(entity["geo"])


# The grid variant's tables with the geo index, its readers and the move replaced (same graph order).
RANGE_FUNCTIONS: dict[str, FunctionTable] = {
    **FUNCTIONS,
    "search": {"nearby": (search_nearby, True), "index": (index, True)},
    "geo": {**BULK_STATE, "relocate": (relocate, False)},
    "recommend": {"recommend": (recommend_near, True)},
    "hotel": {**FUNCTIONS["hotel"], "move": (move, False)},
}


def build_hotel_range_app(name: str = "deathstar-hotel-range", overrides: Overrides | None = None) -> Graph:
    """The hotel reservation graph with the range-read geo index (``overrides``: as build_hotel_app)."""
    return build_graph(name, ((op, PARTITIONS, fns) for op, fns in RANGE_FUNCTIONS.items()), overrides)


hotel_range_app = build_hotel_range_app()
