"""The DeathStar hotel / travel workload (``deathstar-hotel``): population, mix and invariant check.

**Mix**: DeathStarBench's hotel-reservation mix (``wrk2`` mixed workload: search 0.6, recommend 0.39,
user login 0.005, reserve 0.005), the reserve share being the Styx paper's Table 1 "0.5% transactions"
of 3 calls (reservation, hotel, flight); ``Options.extra["mix"]`` (label → weight) replaces it, e.g. in
tests that need many reservations.

**Population** at ``Options.scale`` 1.0 (each count is scaled and rounded, at least 1): 100 hotels and 100
flights with ``Options.extra["capacity"]`` (default 10) rooms or seats each, as the Styx authors'
DeathStar port loads them, and DeathStar's 500 users ``Cornell_0 …``. Hotel positions, ratings and
password salts come from ``Random(Options.seed)``; rate plans follow DeathStar's (by hotel number).

**Geo index** (``Options.extra["geo"]``, ``styx bench --geo``): ``"grid"`` (default, app
``hotel_app``: cell entities) or ``"range"`` (app ``hotel_range_app``: one entry per hotel under a
sortable position key, read by ``ctx.scan``). Both load the same hotels and draw the same requests;
only the range variant knows the request kind ``move`` (a hotel relocates, weight 0 unless the mix
gives it one).

**Invariant**: no hotel or flight holds more bookings than its capacity, and hotel and flight bookings
are exactly the reservations recorded in the users' ledgers, each with both its parts; with the range
index, every hotel has exactly one geo entry, at the key of the position it holds, and names it.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from styx_benchmarks.deathstar.common import (
    draw,
    format_ids,
    load_calls,
    parse_mix,
    password_hash,
    run_load,
    scaled,
)
from styx_benchmarks.deathstar.hotel import (
    CELL_COLS,
    CELL_ROWS,
    LAT_MAX,
    LAT_MIN,
    LON_MAX,
    LON_MIN,
    RECOMMEND_BY,
    cell_key,
    cell_of,
)
from styx_benchmarks.deathstar.hotel_range import geo_key
from styx_benchmarks.workload import Op, Options, Progress, State, Workload, read_many, submit_checks
from styx_py.core.partitioning import Key

if TYPE_CHECKING:
    from styx_client import Call, StyxClient

HOTEL_MIX = {"search": 0.6, "recommend": 0.39, "login": 0.005, "reserve": 0.005}
# The geo index: grid cells (hotel.py) or range reads over sorted keys (hotel_range.py); only the
# range variant knows hotel moves (none in the default mix, so both variants draw the same requests).
GEO_APPS = {
    "grid": "styx_benchmarks.deathstar:hotel_app",
    "range": "styx_benchmarks.deathstar:hotel_range_app",
}
RANGE_MIX = {**HOTEL_MIX, "move": 0.0}
HOTEL_DEFAULTS = {"hotels": 100, "flights": 100, "users": 500}
DEFAULT_CAPACITY = 10
# DeathStar's rate plans: (rate, inclusive rate) by hotel number modulo 5; stays run from 2015-04-09.
RATES = [(109.0, 123.17), (120.0, 140.0), (124.0, 144.0), (132.0, 158.0), (232.0, 258.0)]


def hotel_key(i: int) -> str:
    return f"hotel{i}"


def flight_key(i: int) -> str:
    return f"flight{i}"


def hotel_user_key(i: int) -> str:
    return f"Cornell_{i}"


def hotel_password(i: int) -> str:
    return str(i) * 10


def _date(day: int) -> str:
    return f"2015-04-{day:02d}"


def _search_point(rng: random.Random) -> tuple[float, float]:
    """A query position as DeathStar's clients draw it."""
    lat = 38.0235 + (rng.randint(0, 481) - 240.5) / 1000.0
    lon = -122.095 + (rng.randint(0, 325) - 157.0) / 1000.0
    return lat, lon


class HotelReservation(Workload):
    """DeathStar hotel/travel reservation; see the module docstrings for the data model and the mix."""

    name = "deathstar-hotel"
    app = "styx_benchmarks.deathstar:hotel_app"
    description = "DeathStar travel: search, recommend, login, reserve hotel + flight"

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        o = self.options
        if not o.scale > 0:
            raise ValueError(f"scale must be positive, got {o.scale}")
        self.hotels = scaled(HOTEL_DEFAULTS["hotels"], o.scale)
        self.flights = scaled(HOTEL_DEFAULTS["flights"], o.scale)
        self.users = scaled(HOTEL_DEFAULTS["users"], o.scale)
        capacity = o.extra.get("capacity", DEFAULT_CAPACITY)
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity: int = capacity
        geo = o.extra.get("geo", "grid")
        if geo not in GEO_APPS:
            raise ValueError(f"geo must be one of {sorted(GEO_APPS)}, got {geo!r}")
        self.geo: str = geo
        self.app = GEO_APPS[geo]
        self.labels, self.cumulative = parse_mix(
            RANGE_MIX if geo == "range" else HOTEL_MIX, o.extra.get("mix")
        )

    # ---- load ------------------------------------------------------------------------------------------
    def initial_state(self) -> dict[str, list[tuple[Key, Any]]]:
        """Every entity the loader creates, by operator: ``[(key, value)]``. Both geo variants draw the
        same hotels (position, rating, price) and users from the seed."""
        rng = random.Random(self.options.seed)
        geo_cells: defaultdict[str, list[list[Any]]] = defaultdict(list)
        recommend_cells: defaultdict[str, list[list[Any]]] = defaultdict(list)
        geo_entries: list[tuple[Key, Any]] = []
        hotels: list[tuple[Key, Any]] = []
        rate_plans: list[tuple[Key, Any]] = []
        for i in range(self.hotels):
            key = hotel_key(i)
            lat, lon = rng.uniform(LAT_MIN, LAT_MAX), rng.uniform(LON_MIN, LON_MAX)
            rating = round(rng.uniform(2.5, 5.0), 1)
            rate, inclusive = RATES[i % len(RATES)]
            hotel: dict[str, Any] = {"capacity": self.capacity, "bookings": []}
            if self.geo == "range":
                hotel["geo"] = geo_key(lat, lon, key)
                geo_entries.append((hotel["geo"], [key, lat, lon, rating, inclusive]))
            else:
                row, col = cell_of(lat, lon)
                for r in range(max(0, row - 1), min(CELL_ROWS, row + 2)):
                    for c in range(max(0, col - 1), min(CELL_COLS, col + 2)):
                        geo_cells[f"{r}:{c}"].append([key, lat, lon])
                        recommend_cells[f"{r}:{c}"].append([key, lat, lon, rating, inclusive])
            hotels.append((key, hotel))
            plan = {
                "code": "RACK",
                "in_date": _date(9),
                "out_date": _date(17 if i % 2 == 0 else 24),
                "room": "KNG",
                "rate": rate,
                "rate_inclusive": inclusive,
            }
            rate_plans.append((key, plan))
        users: list[tuple[Key, Any]] = []
        for i in range(self.users):
            salt = rng.randbytes(8).hex()
            users.append((hotel_user_key(i), {"salt": salt, "hash": password_hash(salt, hotel_password(i))}))
        state: dict[str, list[tuple[Key, Any]]] = {
            "hotel": hotels,
            "flight": [
                (flight_key(i), {"capacity": self.capacity, "bookings": []}) for i in range(self.flights)
            ],
            "user": users,
            "rate": rate_plans,
        }
        if self.geo == "range":
            state["geo"] = sorted(geo_entries)
        else:
            state["geo"] = sorted(geo_cells.items())
            state["recommend"] = sorted(recommend_cells.items())
        return state

    def load_calls(self) -> list[Call]:
        return load_calls(self.initial_state().items())

    async def load(self, client: StyxClient, progress: Progress = print) -> None:
        entities = sum(len(items) for items in self.initial_state().values())
        await run_load(client, self.name, self.load_calls(), entities, progress)

    # ---- run -------------------------------------------------------------------------------------------
    def next_op(self, rng: random.Random) -> Op:
        kind = draw(rng, self.labels, self.cumulative)
        if kind == "search":
            lat, lon = _search_point(rng)
            in_day = rng.randint(9, 23)
            out_day = rng.randint(in_day + 1, 24)
            return Op(kind, "search", cell_key(lat, lon), "nearby", (lat, lon, _date(in_day), _date(out_day)))
        if kind == "recommend":
            require = rng.choice(RECOMMEND_BY)
            lat, lon = _search_point(rng)
            return Op(kind, "recommend", cell_key(lat, lon), "recommend", (require, lat, lon))
        if kind == "move":
            hotel = rng.randrange(self.hotels)
            lat, lon = rng.uniform(LAT_MIN, LAT_MAX), rng.uniform(LON_MIN, LON_MAX)
            return Op(kind, "hotel", hotel_key(hotel), "move", (lat, lon))
        user = rng.randrange(self.users)
        if kind == "login":
            return Op(kind, "user", hotel_user_key(user), "login", (hotel_password(user),))
        hotel, flight = rng.randrange(self.hotels), rng.randrange(self.flights)
        return Op(
            kind, "reservation", hotel_user_key(user), "reserve", (hotel_key(hotel), flight_key(flight))
        )

    # ---- check -----------------------------------------------------------------------------------------
    async def read_state(self, client: StyxClient) -> State:
        reads = [("hotel", hotel_key(i), "read") for i in range(self.hotels)]
        reads += [("flight", flight_key(i), "read") for i in range(self.flights)]
        reads += [("reservation", hotel_user_key(i), "read") for i in range(self.users)]
        state = await read_many(client, reads)
        if self.geo == "range":
            [reply] = await submit_checks(client, [("search", "check", "index", ())], concurrency=1)
            if reply.status != "committed":
                raise RuntimeError(f"reading the geo index failed: {reply.status} {reply.error}")
            state.update((("geo", key), entry) for key, entry in reply.value)
        return {k: v for k, v in state.items() if v is not None}

    def check_state(self, state: State) -> list[str]:
        errors: list[str] = []
        expected = {"hotel": [hotel_key(i) for i in range(self.hotels)]}
        expected["flight"] = [flight_key(i) for i in range(self.flights)]
        for operator, keys in expected.items():
            errors += [f"{operator} {key} is missing" for key in keys if (operator, key) not in state]

        # The ledgers: reservation id -> (user, hotel, flight); each id recorded once.
        recorded: dict[str, tuple[Key, str, str]] = {}
        for (operator, user), ledger in sorted(state.items(), key=lambda kv: str(kv[0])):
            if operator != "reservation":
                continue
            if not isinstance(ledger, list):
                errors.append(f"user {user}'s reservation ledger is not a list: {ledger!r}")
                continue
            for entry in ledger:
                fields = entry if isinstance(entry, dict) else {}
                rid, hotel, flight = fields.get("id"), fields.get("hotel"), fields.get("flight")
                if rid is None or hotel is None or flight is None:
                    errors.append(f"user {user} records an incomplete reservation {entry!r}")
                elif rid in recorded:
                    errors.append(
                        f"reservation {rid} is recorded twice (users {recorded[rid][0]} and {user})"
                    )
                else:
                    recorded[rid] = (user, hotel, flight)

        for operator, part in (("hotel", 1), ("flight", 2)):
            wanted: defaultdict[str, set[str]] = defaultdict(set)
            for rid, entry in recorded.items():
                wanted[str(entry[part])].add(rid)
            entities = sorted(
                ((str(k), v) for (op, k), v in state.items() if op == operator), key=lambda kv: kv[0]
            )
            for key, entity in entities:
                errors += self._check_bookings(operator, key, entity, wanted.pop(key, set()), recorded)
            for key, rids in sorted(wanted.items()):
                for rid in sorted(rids):
                    user = recorded[rid][0]
                    errors.append(
                        f"reservation {rid} of user {user} names {operator} {key}, which does not exist"
                    )
        if self.geo == "range":
            errors += self._check_geo_index(state)
        return errors

    def _check_geo_index(self, state: State) -> list[str]:
        """The range variant's index: one entry per hotel, at the key of the position it holds, and
        named by that hotel (a move that lost or duplicated an entry, or left the hotel naming a
        stale key, breaks this)."""
        errors: list[str] = []
        entries = {str(k): v for (op, k), v in state.items() if op == "geo"}
        named: dict[str, str] = {}
        for i in range(self.hotels):
            hotel = state.get(("hotel", hotel_key(i)))
            key = hotel.get("geo") if isinstance(hotel, dict) else None
            if hotel is None:
                continue  # reported as missing by check_state
            if not isinstance(key, str) or key not in entries:
                errors.append(f"hotel {hotel_key(i)} names geo entry {key!r}, which does not exist")
            else:
                named[key] = hotel_key(i)
        for key, entry in sorted(entries.items()):
            fields = entry if isinstance(entry, list) and len(entry) == 5 else None
            if fields is None:
                errors.append(f"geo entry {key} is malformed: {entry!r}")
                continue
            hotel, lat, lon = fields[0], fields[1], fields[2]
            if key != geo_key(lat, lon, hotel):
                errors.append(
                    f"geo entry {key} of {hotel} at ({lat}, {lon}) belongs at {geo_key(lat, lon, hotel)}"
                )
            if named.get(key) != hotel:
                errors.append(f"geo entry {key} of {hotel} is not the one hotel {hotel} names")
        return errors

    def _check_bookings(
        self,
        operator: str,
        key: str,
        entity: Any,
        wanted: set[str],
        recorded: Mapping[str, tuple[Key, str, str]],
    ) -> list[str]:
        """One hotel/flight: capacity respected, bookings = the reservations that name it."""
        errors: list[str] = []
        fields = entity if isinstance(entity, dict) else {}
        capacity, bookings = fields.get("capacity"), fields.get("bookings")
        if not isinstance(capacity, int) or not isinstance(bookings, list):
            return [f"{operator} {key} is malformed: {entity!r}"]
        if capacity != self.capacity:
            errors.append(f"{operator} {key} has capacity {capacity}, expected {self.capacity}")
        if len(bookings) > capacity:
            errors.append(f"{operator} {key} is overbooked: {len(bookings)} bookings for capacity {capacity}")
        if len(bookings) != len(wanted):
            errors.append(
                f"{operator} {key} has {len(bookings)} bookings, "
                f"but {len(wanted)} recorded reservations name it"
            )
        for rid, n in sorted(Counter(bookings).items()):
            if n > 1:
                errors.append(f"{operator} {key} books reservation {rid} {n} times, expected once")
        booked = set(bookings)
        for rid in sorted(booked - wanted):
            owner = recorded.get(rid)
            if owner is None:
                errors.append(f"{operator} {key} books reservation {rid}, which no user's ledger records")
            else:
                named = owner[1] if operator == "hotel" else owner[2]
                errors.append(f"{operator} {key} books reservation {rid}, which names {operator} {named}")
        for rid in sorted(wanted - booked):
            errors.append(
                f"reservation {rid} of user {recorded[rid][0]} has no {operator} part: "
                f"{operator} {key} does not book it (it books {format_ids(bookings)})"
            )
        return errors
