"""DeathStar's two SFaaS workloads (Gan et al., 2019, as ported to stateful functions by Beldi and Styx).

**Hotel / travel reservation** (``deathstar-hotel``, app
``styx_py.benchmarks.deathstar:hotel_app``). Entities:

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
three are read-only. Invariant: no hotel or flight holds more bookings than its capacity, and hotel and
flight bookings are exactly the reservations recorded in the users' ledgers, each with both its parts.

**Movie review** (``deathstar-movie``, app ``styx_py.benchmarks.deathstar:movie_app``).
``frontend.compose`` at
the user runs DeathStar's compose-review call graph, 9 invocations: ``unique_id.generate`` (the review id,
from ``ctx.uuid()``), ``user.user_id`` (user name → id), ``movie_id.movie_id`` (title → id),
``text.upload`` (validates the text), ``rating.upload`` (validates the rating and adds it to the movie's
running count and sum, like DeathStar's rating service), then asynchronously ``review_storage.store`` (the
review under its id), ``user_review.append`` and ``movie_review.append`` (the id in the user's and in the
movie's review lists). Invariant: every stored review is complete (id, user, movie, text, rating,
timestamp), appears exactly once in its user's list and once in its movie's list, no list names a review
that is not stored or is someone else's, and each movie's rating count and sum equal those of its reviews.

**Mixes** (the Styx paper, §8 and Table 1: "Deathstar Movie — 2k keys, 9-10 function calls, 0%
transactions; Deathstar Travel — 2k keys, 3 function calls, 0.5% transactions", both uniform). Travel is
DeathStarBench's hotel-reservation mix (``wrk2`` mixed workload: search 0.6, recommend 0.39, user login
0.005, reserve 0.005), the reserve share being Table 1's 0.5% transactions of 3 calls (reservation,
hotel, flight); ``Options.extra["mix"]`` (label → weight) replaces it, e.g. in tests that need many
reservations. Movie is compose-review only, as in DeathStarBench's ``compose-review`` script; Table 1's
"0% transactions" means the baselines run it without a transaction, while styx-py runs every request as one.

**Populations** at ``Options.scale`` 1.0 (each count is scaled and rounded, at least 1): hotel — 100
hotels and 100 flights with ``Options.extra["capacity"]`` (default 10) rooms or seats each, as the Styx
authors' DeathStar port loads them, and DeathStar's 500 users ``Cornell_0 …``; movie — 1 000 users and
1 000 movies (the port's populations, Table 1's 2k keys). Hotel positions, ratings and password salts
come from ``Random(Options.seed)``; rate plans follow DeathStar's (by hotel number).

Loading uses one bulk function per operator: ``load(items)`` fans out ``init(value)`` calls with
``call_async``, ``LOAD_CHUNK`` entities per transaction, ``LOAD_CONCURRENCY`` transactions in flight.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from styx_py import Abort, Context, Graph, Operator
from styx_py.benchmarks.workload import Op, Options, Progress, State, Workload, read_many
from styx_py.core.operator import UserFunction
from styx_py.core.partitioning import Key

if TYPE_CHECKING:
    from styx_py.client import Call, StyxClient

PARTITIONS = 4
LOAD_CHUNK = 500  # entities initialised per loading transaction
LOAD_CONCURRENCY = 256  # loading transactions in flight

_F = TypeVar("_F", bound=UserFunction)


def _bulk_state(op: Operator) -> Operator:
    """Give ``op`` the loader pair and a reader: ``init(value)`` sets this entity's state, ``load(items)``
    (run on any key, e.g. ``loader3``) fans ``init`` out to ``[key, value]`` pairs in one transaction,
    ``read()`` returns the state (None when absent)."""

    async def init(ctx: Context, value: Any) -> None:
        await ctx.put(value)

    async def load(ctx: Context, items: list[list[Any]]) -> int:
        for key, value in items:
            ctx.call_async(op, "init", key, value)
        return len(items)

    async def read(ctx: Context) -> Any:
        return await ctx.get()

    op.function(init)
    op.function(load)
    op.function(read, read_only=True)
    return op


def _register(op: Operator, *, name: str | None = None, read_only: bool = False) -> Callable[[_F], _F]:
    """``@op.function(name=…, read_only=…)`` keeping the function's type (that form returns ``Any``)."""

    def register(fn: _F) -> _F:
        op.function(fn, name=name, read_only=read_only)
        return fn

    return register


def _scaled(n: int, scale: float) -> int:
    return max(1, round(n * scale))


def _mix(default: Mapping[str, float], override: Any) -> tuple[list[str], list[float]]:
    """Labels and cumulative weights of a request mix (``override`` replaces ``default`` when given)."""
    mix = default if override is None else override
    if not isinstance(mix, Mapping) or not mix:
        raise ValueError(f"mix must be a non-empty mapping of request kind to weight, got {mix!r}")
    unknown = sorted(set(mix) - set(default))
    if unknown:
        raise ValueError(f"unknown request kinds {unknown} in mix; known: {sorted(default)}")
    if any(not isinstance(w, int | float) or w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"mix weights must be non-negative numbers with a positive sum, got {dict(mix)}")
    labels = [label for label, weight in mix.items() if weight > 0]
    cumulative: list[float] = []
    total = 0.0
    for label in labels:
        total += float(mix[label])
        cumulative.append(total)
    return labels, cumulative


def _draw(rng: random.Random, labels: list[str], cumulative: list[float]) -> str:
    coin = rng.random() * cumulative[-1]
    for label, edge in zip(labels, cumulative, strict=True):
        if coin < edge:
            return label
    return labels[-1]


def _ids(items: Iterable[Any], limit: int = 5) -> str:
    """A short, sorted rendering of ids for messages."""
    ids = sorted(map(str, items))
    if not ids:
        return "nothing"
    more = f", … ({len(ids)} in all)" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def _password_hash(salt: str, password: str) -> str:
    return hashlib.sha256((salt + password).encode()).hexdigest()


# ==== Hotel / travel reservation ===========================================================================

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
# DeathStar's rate plans: (rate, inclusive rate) by hotel number modulo 5; stays run from 2015-04-09.
RATES = [(109.0, 123.17), (120.0, 140.0), (124.0, 144.0), (132.0, 158.0), (232.0, 258.0)]
RECOMMEND_BY = ("dis", "rate", "price")

HOTEL_MIX = {"search": 0.6, "recommend": 0.39, "login": 0.005, "reserve": 0.005}
HOTEL_DEFAULTS = {"hotels": 100, "flights": 100, "users": 500}
DEFAULT_CAPACITY = 10

search = Operator("search", partitions=PARTITIONS)
geo = _bulk_state(Operator("geo", partitions=PARTITIONS))
rates = _bulk_state(Operator("rate", partitions=PARTITIONS))
recommender = _bulk_state(Operator("recommend", partitions=PARTITIONS))
hotel_users = _bulk_state(Operator("user", partitions=PARTITIONS))
hotels = _bulk_state(Operator("hotel", partitions=PARTITIONS))
flights = _bulk_state(Operator("flight", partitions=PARTITIONS))
reservations = _bulk_state(Operator("reservation", partitions=PARTITIONS))


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


@_register(search, name="nearby", read_only=True)
async def search_nearby(
    ctx: Context, lat: float, lon: float, in_date: str, out_date: str
) -> list[dict[str, Any]]:
    """Hotels near (lat, lon) with a rate plan covering the stay, nearest first (ctx.key: the cell)."""
    found: list[dict[str, Any]] = []
    for hotel in await ctx.call(geo, "nearby", ctx.key, lat, lon):
        plan = await ctx.call(rates, "plan", hotel, in_date, out_date)
        if plan is not None:
            found.append({"hotel": hotel, "rate": plan["rate"], "rate_inclusive": plan["rate_inclusive"]})
    return found


@_register(geo, name="nearby", read_only=True)
async def geo_nearby(ctx: Context, lat: float, lon: float) -> list[str]:
    """The ≤ SEARCH_RESULTS hotels within SEARCH_RADIUS_KM of (lat, lon), nearest first."""
    near = []
    for hotel, hlat, hlon in await ctx.get(default=[]):
        d = distance_km(lat, lon, hlat, hlon)
        if d <= SEARCH_RADIUS_KM:
            near.append((d, hotel))
    near.sort()
    return [hotel for _, hotel in near[:SEARCH_RESULTS]]


@_register(rates, name="plan", read_only=True)
async def rate_plan(ctx: Context, in_date: str, out_date: str) -> dict[str, Any] | None:
    """This hotel's rate plan if it covers the stay (ISO dates compare as strings), else None."""
    plan: dict[str, Any] | None = await ctx.get()
    if plan is None or not plan["in_date"] <= in_date < out_date <= plan["out_date"]:
        return None
    return plan


@_register(recommender, name="recommend", read_only=True)
async def recommend_hotels(ctx: Context, require: str, lat: float, lon: float) -> list[str]:
    """DeathStar's recommendation near (lat, lon): the nearest ("dis"), best rated ("rate") or cheapest
    ("price") hotels of the cell's block, all of them on a tie."""
    if require not in RECOMMEND_BY:
        raise Abort(f"unknown recommendation criterion {require!r}; expected one of {RECOMMEND_BY}")
    scored: list[tuple[float, str]] = []
    for hotel, hlat, hlon, rating, price in await ctx.get(default=[]):
        if require == "dis":
            score = distance_km(lat, lon, hlat, hlon)
        else:
            score = -rating if require == "rate" else price
        scored.append((score, hotel))
    if not scored:
        return []
    best = min(score for score, _ in scored)
    return sorted(hotel for score, hotel in scored if score == best)


@_register(hotel_users, read_only=True)
async def login(ctx: Context, password: str) -> bool:
    """Whether ``password`` matches this user's stored salted hash."""
    user = await ctx.get()
    return user is not None and _password_hash(user["salt"], password) == user["hash"]


async def _book(ctx: Context, reservation_id: str, enforce_capacity: bool) -> int:
    """Take one room/seat of this hotel/flight for ``reservation_id``; return how many are left."""
    entity = await ctx.get()
    if entity is None:
        raise Abort(f"{ctx.operator} {ctx.key} does not exist")
    bookings: list[str] = entity["bookings"]
    capacity: int = entity["capacity"]
    if enforce_capacity and len(bookings) >= capacity:
        raise Abort(f"{ctx.operator} {ctx.key} is full: {len(bookings)} of {capacity} booked")
    bookings.append(reservation_id)
    await ctx.put(entity)
    return capacity - len(bookings)


@_register(hotels, name="reserve")
async def reserve_room(ctx: Context, reservation_id: str) -> int:
    return await _book(ctx, reservation_id, enforce_capacity=True)


@_register(flights, name="reserve")
async def reserve_seat(ctx: Context, reservation_id: str) -> int:
    return await _book(ctx, reservation_id, enforce_capacity=True)


@reservations.function
async def reserve(ctx: Context, hotel_id: str, flight_id: str) -> str:
    """Book a room and a seat for this user in one transaction; either being full aborts both."""
    reservation_id = ctx.uuid().hex
    ctx.call_async(hotels, "reserve", hotel_id, reservation_id)
    # By name, not by the operator object: the broken variant of the app swaps in its own "flight".
    ctx.call_async("flight", "reserve", flight_id, reservation_id)
    ledger = await ctx.get(default=[])
    ledger.append({"id": reservation_id, "hotel": hotel_id, "flight": flight_id})
    await ctx.put(ledger)
    return reservation_id


hotel_app = Graph(
    "deathstar-hotel", [search, geo, rates, recommender, hotel_users, hotels, flights, reservations]
)

# A deliberately wrong variant for the tests: its flights take seats without checking capacity.
_unchecked_flights = _bulk_state(Operator("flight", partitions=PARTITIONS))


@_register(_unchecked_flights, name="reserve")
async def reserve_seat_unchecked(ctx: Context, reservation_id: str) -> int:
    return await _book(ctx, reservation_id, enforce_capacity=False)


broken_hotel_app = Graph(
    "deathstar-hotel-broken",
    [search, geo, rates, recommender, hotel_users, hotels, _unchecked_flights, reservations],
)


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


def _load_calls(groups: Iterable[tuple[str, list[tuple[Key, Any]]]]) -> list[Call]:
    """The bulk-loading transactions: ``load`` with ``LOAD_CHUNK`` ``[key, value]`` pairs each."""
    calls: list[Call] = []
    for operator, items in groups:
        for n, start in enumerate(range(0, len(items), LOAD_CHUNK)):
            chunk = [[key, value] for key, value in items[start : start + LOAD_CHUNK]]
            calls.append((operator, f"loader{n}", "load", (chunk,)))
    return calls


async def _run_load(
    client: StyxClient, name: str, calls: list[Call], entities: int, progress: Progress
) -> None:
    replies = await client.submit_many(calls, concurrency=LOAD_CONCURRENCY)
    bad = [(call, r) for call, r in zip(calls, replies, strict=True) if r.status != "committed"]
    if bad:
        (operator, key, _, _), reply = bad[0]
        raise RuntimeError(f"{name} load failed: {operator}.load at {key!r}: {reply.status} {reply.error}")
    progress(f"{name}: loaded {entities} entities in {len(calls)} transactions")


class HotelReservation(Workload):
    """DeathStar hotel/travel reservation; see the module docstring for the data model and the mix."""

    name = "deathstar-hotel"
    app = "styx_py.benchmarks.deathstar:hotel_app"
    description = "DeathStar travel: search, recommend, login, reserve hotel + flight"

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        o = self.options
        if not o.scale > 0:
            raise ValueError(f"scale must be positive, got {o.scale}")
        self.hotels = _scaled(HOTEL_DEFAULTS["hotels"], o.scale)
        self.flights = _scaled(HOTEL_DEFAULTS["flights"], o.scale)
        self.users = _scaled(HOTEL_DEFAULTS["users"], o.scale)
        capacity = o.extra.get("capacity", DEFAULT_CAPACITY)
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity: int = capacity
        self.labels, self.cumulative = _mix(HOTEL_MIX, o.extra.get("mix"))

    # ---- load ------------------------------------------------------------------------------------------
    def initial_state(self) -> dict[str, list[tuple[Key, Any]]]:
        """Every entity the loader creates, by operator: ``[(key, value)]``."""
        rng = random.Random(self.options.seed)
        geo_cells: defaultdict[str, list[list[Any]]] = defaultdict(list)
        recommend_cells: defaultdict[str, list[list[Any]]] = defaultdict(list)
        rate_plans: list[tuple[Key, Any]] = []
        for i in range(self.hotels):
            key = hotel_key(i)
            lat, lon = rng.uniform(LAT_MIN, LAT_MAX), rng.uniform(LON_MIN, LON_MAX)
            rating = round(rng.uniform(2.5, 5.0), 1)
            rate, inclusive = RATES[i % len(RATES)]
            row, col = cell_of(lat, lon)
            for r in range(max(0, row - 1), min(CELL_ROWS, row + 2)):
                for c in range(max(0, col - 1), min(CELL_COLS, col + 2)):
                    geo_cells[f"{r}:{c}"].append([key, lat, lon])
                    recommend_cells[f"{r}:{c}"].append([key, lat, lon, rating, inclusive])
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
            users.append((hotel_user_key(i), {"salt": salt, "hash": _password_hash(salt, hotel_password(i))}))
        return {
            "hotel": [
                (hotel_key(i), {"capacity": self.capacity, "bookings": []}) for i in range(self.hotels)
            ],
            "flight": [
                (flight_key(i), {"capacity": self.capacity, "bookings": []}) for i in range(self.flights)
            ],
            "user": users,
            "rate": rate_plans,
            "geo": sorted(geo_cells.items()),
            "recommend": sorted(recommend_cells.items()),
        }

    def load_calls(self) -> list[Call]:
        return _load_calls(self.initial_state().items())

    async def load(self, client: StyxClient, progress: Progress = print) -> None:
        entities = sum(len(items) for items in self.initial_state().values())
        await _run_load(client, self.name, self.load_calls(), entities, progress)

    # ---- run -------------------------------------------------------------------------------------------
    def next_op(self, rng: random.Random) -> Op:
        kind = _draw(rng, self.labels, self.cumulative)
        if kind == "search":
            lat, lon = _search_point(rng)
            in_day = rng.randint(9, 23)
            out_day = rng.randint(in_day + 1, 24)
            return Op(kind, "search", cell_key(lat, lon), "nearby", (lat, lon, _date(in_day), _date(out_day)))
        if kind == "recommend":
            require = rng.choice(RECOMMEND_BY)
            lat, lon = _search_point(rng)
            return Op(kind, "recommend", cell_key(lat, lon), "recommend", (require, lat, lon))
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
                f"{operator} {key} does not book it (it books {_ids(bookings)})"
            )
        return errors


# ==== Movie review =========================================================================================

MOVIE_DEFAULTS = {"users": 1000, "movies": 1000}
REVIEW_CHARS = 256  # DeathStar's compose-review text length
MAX_REVIEW_CHARS = 10_000
MAX_RATING = 10
REVIEW_FIELDS = ("review_id", "user_id", "movie_id", "text", "rating", "timestamp_ms")
CHARSET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?"

frontend = Operator("frontend", partitions=PARTITIONS)
unique_ids = Operator("unique_id", partitions=PARTITIONS)
movie_users = _bulk_state(Operator("user", partitions=PARTITIONS))
movie_ids = _bulk_state(Operator("movie_id", partitions=PARTITIONS))
texts = Operator("text", partitions=PARTITIONS)
ratings = _bulk_state(Operator("rating", partitions=PARTITIONS))
review_storage = _bulk_state(Operator("review_storage", partitions=PARTITIONS))
user_reviews = _bulk_state(Operator("user_review", partitions=PARTITIONS))
movie_reviews = _bulk_state(Operator("movie_review", partitions=PARTITIONS))


@_register(unique_ids, read_only=True)
async def generate(ctx: Context) -> str:
    """A fresh review id: deterministic, so a re-run or replay of the transaction draws the same one."""
    return ctx.uuid().hex


@_register(movie_users, read_only=True)
async def user_id(ctx: Context) -> str:
    user = await ctx.get()
    if user is None:
        raise Abort(f"no user named {ctx.key}")
    return str(user["user_id"])


@_register(movie_ids, read_only=True)
async def movie_id(ctx: Context) -> str:
    movie = await ctx.get()
    if movie is None:
        raise Abort(f"no movie titled {ctx.key}")
    return str(movie["movie_id"])


@_register(texts, name="upload", read_only=True)
async def upload_text(ctx: Context, text: str) -> str:
    if not isinstance(text, str) or not 0 < len(text) <= MAX_REVIEW_CHARS:
        raise Abort(f"review text must be 1 to {MAX_REVIEW_CHARS} characters")
    return text


@_register(ratings, name="upload")
async def upload_rating(ctx: Context, rating: int) -> int:
    """Validate a rating and add it to this movie's running count and sum."""
    if not isinstance(rating, int) or isinstance(rating, bool) or not 0 <= rating <= MAX_RATING:
        raise Abort(f"rating must be an int in 0..{MAX_RATING}, got {rating!r}")
    totals = await ctx.get(default={"count": 0, "sum": 0})
    totals["count"] += 1
    totals["sum"] += rating
    await ctx.put(totals)
    return rating


@review_storage.function
async def store(ctx: Context, review: dict[str, Any]) -> None:
    if await ctx.get() is not None:
        raise Abort(f"review {ctx.key} already exists")
    await ctx.put(review)


async def _append(ctx: Context, review_id: str) -> int:
    reviews = await ctx.get(default=[])
    reviews.append(review_id)
    await ctx.put(reviews)
    return len(reviews)


user_reviews.function(_append, name="append")
movie_reviews.function(_append, name="append")


async def _compose_review(ctx: Context, username: str, title: str, rating: int, text: str) -> dict[str, Any]:
    """The gathering half of compose: id, user, movie, text and rating, each from its service."""
    review_id = await ctx.call(unique_ids, "generate", ctx.key)
    uid = await ctx.call(movie_users, "user_id", username)
    mid = await ctx.call(movie_ids, "movie_id", title)
    text = await ctx.call(texts, "upload", review_id, text)
    rating = await ctx.call(ratings, "upload", mid, rating)
    return {
        "review_id": review_id,
        "user_id": uid,
        "movie_id": mid,
        "text": text,
        "rating": rating,
        "timestamp_ms": round(ctx.now() * 1000),
    }


@frontend.function
async def compose(ctx: Context, username: str, title: str, rating: int, text: str) -> str:
    """DeathStar's compose-review: gather the parts, then store the review and index it twice."""
    review = await _compose_review(ctx, username, title, rating, text)
    ctx.call_async(review_storage, "store", review["review_id"], review)
    ctx.call_async(user_reviews, "append", review["user_id"], review["review_id"])
    ctx.call_async(movie_reviews, "append", review["movie_id"], review["review_id"])
    return str(review["review_id"])


movie_app = Graph(
    "deathstar-movie",
    [
        frontend,
        unique_ids,
        movie_users,
        movie_ids,
        texts,
        ratings,
        review_storage,
        user_reviews,
        movie_reviews,
    ],
)

# A deliberately wrong variant for the tests: compose forgets the movie's review list.
_forgetful_frontend = Operator("frontend", partitions=PARTITIONS)


@_register(_forgetful_frontend, name="compose")
async def compose_forgetting_movie(ctx: Context, username: str, title: str, rating: int, text: str) -> str:
    review = await _compose_review(ctx, username, title, rating, text)
    ctx.call_async(review_storage, "store", review["review_id"], review)
    ctx.call_async(user_reviews, "append", review["user_id"], review["review_id"])
    return str(review["review_id"])


broken_movie_app = Graph(
    "deathstar-movie-broken",
    [
        _forgetful_frontend,
        unique_ids,
        movie_users,
        movie_ids,
        texts,
        ratings,
        review_storage,
        user_reviews,
        movie_reviews,
    ],
)


def movie_user_name(i: int) -> str:
    return f"username_{i}"


def movie_user_id(i: int) -> str:
    return f"user{i}"


def movie_key(i: int) -> str:
    return f"movie{i}"


def movie_title(i: int) -> str:
    return f"title_{i}"


class MovieReview(Workload):
    """DeathStar movie review (compose review); see the module docstring for the data model and the mix."""

    name = "deathstar-movie"
    app = "styx_py.benchmarks.deathstar:movie_app"
    description = "DeathStar movie review: compose review across 9 functions"

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        o = self.options
        if not o.scale > 0:
            raise ValueError(f"scale must be positive, got {o.scale}")
        self.users = _scaled(MOVIE_DEFAULTS["users"], o.scale)
        self.movies = _scaled(MOVIE_DEFAULTS["movies"], o.scale)

    # ---- load ------------------------------------------------------------------------------------------
    def initial_state(self) -> dict[str, list[tuple[Key, Any]]]:
        rng = random.Random(self.options.seed)
        users: list[tuple[Key, Any]] = []
        for i in range(self.users):
            salt = rng.randbytes(8).hex()
            record = {
                "user_id": movie_user_id(i),
                "username": movie_user_name(i),
                "first_name": f"first_{i}",
                "last_name": f"last_{i}",
                "salt": salt,
                "password_hash": _password_hash(salt, f"password_{i}"),
            }
            users.append((movie_user_name(i), record))
        movies: list[tuple[Key, Any]] = [
            (movie_title(i), {"movie_id": movie_key(i), "title": movie_title(i)}) for i in range(self.movies)
        ]
        return {"user": users, "movie_id": movies}

    def load_calls(self) -> list[Call]:
        return _load_calls(self.initial_state().items())

    async def load(self, client: StyxClient, progress: Progress = print) -> None:
        entities = sum(len(items) for items in self.initial_state().values())
        await _run_load(client, self.name, self.load_calls(), entities, progress)

    # ---- run -------------------------------------------------------------------------------------------
    def next_op(self, rng: random.Random) -> Op:
        user = movie_user_name(rng.randrange(self.users))
        title = movie_title(rng.randrange(self.movies))
        rating = rng.randint(0, MAX_RATING)
        text = "".join(rng.choices(CHARSET, k=REVIEW_CHARS))
        return Op("compose", "frontend", user, "compose", (user, title, rating, text))

    # ---- check -----------------------------------------------------------------------------------------
    async def read_state(self, client: StyxClient) -> State:
        reads = [("user_review", movie_user_id(i), "read") for i in range(self.users)]
        reads += [("movie_review", movie_key(i), "read") for i in range(self.movies)]
        reads += [("rating", movie_key(i), "read") for i in range(self.movies)]
        lists = {k: v for k, v in (await read_many(client, reads)).items() if v is not None}
        review_ids = sorted(
            {rid for (op, _), v in lists.items() if op in ("user_review", "movie_review") for rid in v}
        )
        reviews = await read_many(client, (("review_storage", rid, "read") for rid in review_ids))
        return {**lists, **{k: v for k, v in reviews.items() if v is not None}}

    def check_state(self, state: State) -> list[str]:
        errors: list[str] = []
        by_operator: defaultdict[str, dict[Key, Any]] = defaultdict(dict)
        for (operator, key), value in state.items():
            by_operator[operator][key] = value
        reviews = by_operator["review_storage"]
        lists = {"user": by_operator["user_review"], "movie": by_operator["movie_review"]}
        counts = {owner: {k: Counter(v) for k, v in entries.items()} for owner, entries in lists.items()}

        stored: dict[Key, dict[str, Any]] = {}
        for rid in sorted(reviews, key=str):
            review = reviews[rid]
            problem = _review_problem(rid, review)
            if problem is not None:
                errors.append(problem)
                continue
            stored[rid] = review
            for owner in ("user", "movie"):
                holder = review[f"{owner}_id"]
                n = counts[owner].get(holder, Counter())[rid]
                if n != 1:
                    errors.append(
                        f"review {rid} appears {n} times in {owner} {holder}'s review list, expected once"
                    )

        for owner, entries in lists.items():
            for holder in sorted(entries, key=str):
                for rid in sorted(set(entries[holder]), key=str):
                    if rid not in reviews:
                        errors.append(
                            f"{owner} {holder}'s review list names review {rid}, which is not stored"
                        )
                    elif rid in stored and stored[rid][f"{owner}_id"] != holder:
                        errors.append(
                            f"{owner} {holder}'s review list names review {rid}, "
                            f"which belongs to {owner} {stored[rid][f'{owner}_id']}"
                        )

        expected: defaultdict[Key, list[int]] = defaultdict(list)
        for review in stored.values():
            expected[review["movie_id"]].append(review["rating"])
        totals = by_operator["rating"]
        for movie in sorted(set(expected) | set(totals), key=str):
            have = totals.get(movie, {"count": 0, "sum": 0})
            want = expected.get(movie, [])
            if have.get("count") != len(want) or have.get("sum") != sum(want):
                errors.append(
                    f"movie {movie}'s rating totals are count {have.get('count')} sum {have.get('sum')}, "
                    f"but its {len(want)} stored reviews give count {len(want)} sum {sum(want)}"
                )
        return errors


def _review_problem(rid: Key, review: Any) -> str | None:
    """Why a stored review is incomplete or malformed, or None."""
    if not isinstance(review, dict):
        return f"review {rid} is not a record: {review!r}"
    missing = [f for f in REVIEW_FIELDS if review.get(f) in (None, "")]
    if missing:
        return f"review {rid} lacks {', '.join(missing)}"
    if review["review_id"] != rid:
        return f"review stored under {rid} has review_id {review['review_id']}"
    not_text = [f for f in ("user_id", "movie_id", "text") if not isinstance(review[f], str)]
    if not_text:
        return f"review {rid} has non-string {', '.join(not_text)}"
    rating = review["rating"]
    if not isinstance(rating, int) or isinstance(rating, bool) or not 0 <= rating <= MAX_RATING:
        return f"review {rid} has rating {rating!r}, expected an int in 0..{MAX_RATING}"
    return None
