"""DeathStar's hotel / travel reservation app (``styx_benchmarks.deathstar:hotel_app``).

Entities:

* ``hotel`` ``hotel{i}`` and ``flight`` ``flight{i}``: ``{"capacity": rooms or seats, "bookings": [reservation
  id…]}``;
* ``reservation`` keyed by user name: that user's ledger, ``[{"id", "hotel", "flight"}…]``;
* ``user`` ``Cornell_{i}``: ``{"salt", "hash"}``, hash = sha256(salt + password), password ``str(i) * 10``;
* ``rate`` keyed by hotel: its rate plan (code, stay window, room, rate, inclusive rate);
* ``geo`` and ``recommend`` keyed by a grid cell ``"{row}:{col}"`` of 0.05° x 0.05° over DeathStar's search
  area around San Francisco: each cell holds the hotels of its 3 x 3 block of cells (``geo``: position;
  ``recommend``: position, rating and price), so one read answers a query from anywhere in the cell.

Requests: *search* (``search.nearby`` at the query's cell → ``geo.nearby``: the ≤ 5 nearest hotels within
4 km, which the 3 x 3 block always contains → ``rate.plan`` for each, keeping those that cover the stay),
*recommend* (one read of the cell's ``recommend`` entity: nearest, best rated or cheapest), *login*
(``user.login`` checks the password against the stored hash) and *reserve* (``reservation.reserve`` at the
user: the paper's Figure 2 — ``hotel.reserve`` and ``flight.reserve`` each take one room/seat or raise
``Abort`` when full, so a reservation books both or nothing, and the user's ledger records it). The first
three are read-only.

Functions call other operators by name, so :func:`build_hotel_app` can build variants with some
functions replaced (the tests' broken app) from the same functions. The variant with the geo index as
range reads over sorted keys is :mod:`~styx_benchmarks.deathstar.hotel_range`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from styx_benchmarks.deathstar.common import BULK_STATE, PARTITIONS, password_hash
from styx_benchmarks.graphs import FunctionTable, Overrides, build_graph
from styx_py import Abort, Context, Graph

# DeathStar's search area: its clients draw lat 38.0235 ± 0.2405 and lon -122.095 - 0.157 … + 0.168.
LAT_MIN, LAT_MAX = 37.783, 38.264
LON_MIN, LON_MAX = -122.252, -121.927
CELL_DEG = 0.05
CELL_ROWS = math.ceil((LAT_MAX - LAT_MIN) / CELL_DEG)
CELL_COLS = math.ceil((LON_MAX - LON_MIN) / CELL_DEG)
# Every hotel within this distance of a point lies in the 3 x 3 block around the point's cell: one cell
# is at least 0.05° of latitude (5.6 km) and 0.05° of longitude at 38.3° N (4.36 km) wide.
SEARCH_RADIUS_KM = 4.0
SEARCH_RESULTS = 5  # DeathStar's maxSearchResults
EARTH_RADIUS_KM = 6371.0
RECOMMEND_BY = ("dis", "rate", "price")


def cell_of(lat: float, lon: float) -> tuple[int, int]:
    row = min(CELL_ROWS - 1, max(0, math.floor((lat - LAT_MIN) / CELL_DEG)))
    col = min(CELL_COLS - 1, max(0, math.floor((lon - LON_MIN) / CELL_DEG)))
    return row, col


def cell_key(lat: float, lon: float) -> str:
    row, col = cell_of(lat, lon)
    return f"{row}:{col}"


def distance_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Equirectangular distance: exact enough over a few km, and cheap."""
    x = math.radians(lon2 - lon1) * math.cos(math.radians((lat1 + lat2) / 2))
    y = math.radians(lat2 - lat1)
    return EARTH_RADIUS_KM * math.hypot(x, y)


async def search_nearby(
    ctx: Context, lat: float, lon: float, in_date: str, out_date: str
) -> list[dict[str, Any]]:
    """Hotels near (lat, lon) with a rate plan covering the stay, nearest first (ctx.key: the cell)."""
    return await with_rates(ctx, await ctx.call("geo", "nearby", ctx.key, lat, lon), in_date, out_date)


async def with_rates(ctx: Context, hotels: list[str], in_date: str, out_date: str) -> list[dict[str, Any]]:
    """Of ``hotels``, in order, those whose rate plan covers the stay, with their rates."""
    found: list[dict[str, Any]] = []
    for hotel in hotels:
        plan = await ctx.call("rate", "plan", hotel, in_date, out_date)
        if plan is not None:
            found.append({"hotel": hotel, "rate": plan["rate"], "rate_inclusive": plan["rate_inclusive"]})
    return found


def nearest(lat: float, lon: float, entries: Iterable[list[Any]]) -> list[str]:
    """Of ``[hotel, lat, lon, …]`` entries, the ≤ SEARCH_RESULTS hotels within SEARCH_RADIUS_KM of
    (lat, lon), nearest first (by name on a tie)."""
    near = []
    for hotel, hlat, hlon, *_ in entries:
        d = distance_km(lat, lon, hlat, hlon)
        if d <= SEARCH_RADIUS_KM:
            near.append((d, hotel))
    near.sort()
    return [hotel for _, hotel in near[:SEARCH_RESULTS]]


async def geo_nearby(ctx: Context, lat: float, lon: float) -> list[str]:
    """The ≤ SEARCH_RESULTS hotels within SEARCH_RADIUS_KM of (lat, lon), nearest first."""
    return nearest(lat, lon, await ctx.get(default=[]))


async def rate_plan(ctx: Context, in_date: str, out_date: str) -> dict[str, Any] | None:
    """This hotel's rate plan if it covers the stay (ISO dates compare as strings), else None."""
    plan: dict[str, Any] | None = await ctx.get()
    if plan is None or not plan["in_date"] <= in_date < out_date <= plan["out_date"]:
        return None
    return plan


async def recommend_hotels(ctx: Context, require: str, lat: float, lon: float) -> list[str]:
    """DeathStar's recommendation near (lat, lon) over the hotels of the cell's block."""
    return best_of(require, lat, lon, await ctx.get(default=[]))


def best_of(require: str, lat: float, lon: float, entries: Iterable[list[Any]]) -> list[str]:
    """Of ``[hotel, lat, lon, rating, price]`` entries, the nearest ("dis"), best rated ("rate") or
    cheapest ("price") hotels, all of them on a tie; an unknown criterion aborts."""
    if require not in RECOMMEND_BY:
        raise Abort(f"unknown recommendation criterion {require!r}; expected one of {RECOMMEND_BY}")
    scored: list[tuple[float, str]] = []
    for hotel, hlat, hlon, rating, price in entries:
        if require == "dis":
            score = distance_km(lat, lon, hlat, hlon)
        else:
            score = -rating if require == "rate" else price
        scored.append((score, hotel))
    if not scored:
        return []
    best = min(score for score, _ in scored)
    return sorted(hotel for score, hotel in scored if score == best)


async def login(ctx: Context, password: str) -> bool:
    """Whether ``password`` matches this user's stored salted hash."""
    user = await ctx.get()
    return user is not None and password_hash(user["salt"], password) == user["hash"]


async def book(ctx: Context, reservation_id: str) -> int:
    """Take one room/seat of this hotel/flight for ``reservation_id``; return how many are left.

    A full hotel or flight aborts the whole reservation."""
    entity = await ctx.get()
    if entity is None:
        raise Abort(f"{ctx.operator} {ctx.key} does not exist")
    bookings: list[str] = entity["bookings"]
    capacity: int = entity["capacity"]
    if len(bookings) >= capacity:
        raise Abort(f"{ctx.operator} {ctx.key} is full: {len(bookings)} of {capacity} booked")
    bookings.append(reservation_id)
    await ctx.put(entity)
    return capacity - len(bookings)


async def reserve(ctx: Context, hotel_id: str, flight_id: str) -> str:
    """Book a room and a seat for this user in one transaction; either being full aborts both."""
    reservation_id = ctx.uuid().hex
    ctx.call_async("hotel", "reserve", hotel_id, reservation_id)
    ctx.call_async("flight", "reserve", flight_id, reservation_id)
    ledger = await ctx.get(default=[])
    ledger.append({"id": reservation_id, "hotel": hotel_id, "flight": flight_id})
    await ctx.put(ledger)
    return reservation_id


# Operator -> its functions (name -> (function, read-only)), in graph order.
FUNCTIONS: dict[str, FunctionTable] = {
    "search": {"nearby": (search_nearby, True)},
    "geo": {**BULK_STATE, "nearby": (geo_nearby, True)},
    "rate": {**BULK_STATE, "plan": (rate_plan, True)},
    "recommend": {**BULK_STATE, "recommend": (recommend_hotels, True)},
    "user": {**BULK_STATE, "login": (login, True)},
    "hotel": {**BULK_STATE, "reserve": (book, False)},
    "flight": {**BULK_STATE, "reserve": (book, False)},
    "reservation": {**BULK_STATE, "reserve": (reserve, False)},
}


def build_hotel_app(name: str = "deathstar-hotel", overrides: Overrides | None = None) -> Graph:
    """The hotel reservation graph; ``overrides`` replaces functions by (operator, function) (tests)."""
    return build_graph(name, ((op, PARTITIONS, fns) for op, fns in FUNCTIONS.items()), overrides)


hotel_app = build_hotel_app()
