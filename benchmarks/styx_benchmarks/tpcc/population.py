"""TPC-C's initial population: cardinalities (:class:`Sizes`), names, NURand and the row generators.

Cardinalities per warehouse at ``scale=1.0`` are the spec's: 10 districts, 3 000 customers per district
(and one history row each), 100 000 stock rows, 3 000 initial orders per district (one per customer,
random permutation) with 5-15 lines each, the last 900 of them undelivered with a new-order row; plus
100 000 items in all. ``Options.scale`` multiplies the customers (hence initial orders and history)
and the items (hence stock): ``scale=0.01`` gives 30 customers per district and 1 000 items. The 70/30
split of delivered/undelivered initial orders is kept. The initial D_YTD is 10.00 per customer
(30 000.00 at scale 1, as in the spec) and W_YTD is ten times that, so the YTD conditions hold from the
start at every scale. Entities per warehouse at scale 1: 2 + 30 + 30 000 customers + 10 000 last names
+ 30 000 history + 100 000 stock + 30 000 orders (and 9 000 new-order rows) in 1 880 pages ≈ 172 000,
plus 100 000 items.

Customer ids, item ids and last names are drawn with NURand (A = 1023, 8191 and 255) with fixed C
constants (:func:`nurand`; the ``*_RUN`` constants are the mix's, ``C_LAST_LOAD`` the loader's).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from styx_benchmarks.tpcc.schema import (
    CUSTOMER,
    CUSTOMER_NAME,
    DISTRICT,
    DISTRICT_INFO,
    DISTRICT_YTD,
    DISTRICTS,
    HISTORY,
    ITEM,
    ORDER,
    STOCK,
    WAREHOUSE,
    WAREHOUSE_YTD,
    Row,
    order_key,
    order_page,
)

CUSTOMERS = 3000  # per district
ITEMS = 100_000
UNDELIVERED = 900 / 3000  # share of the initial orders with a new-order row (the last ones)
LOAD_TS_MS = 1_700_000_000_000  # O_ENTRY_D, C_SINCE and H_DATE of the initial population
INITIAL_PAYMENT = 1000  # H_AMOUNT of each customer's initial history row: 10.00
C_LAST_LOAD, C_LAST_RUN, C_ID_RUN, OL_I_ID_RUN = 157, 223, 259, 7911  # NURand's C (delta 66 as required)
SYLLABLES = ("BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING")
ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def last_name(n: int) -> str:
    """C_LAST of the number ``n`` in 0…999: three syllables, by digit."""
    return SYLLABLES[n // 100] + SYLLABLES[n // 10 % 10] + SYLLABLES[n % 10]


def nurand(rng: random.Random, a: int, x: int, y: int, c: int) -> int:
    return (((rng.randint(0, a) | rng.randint(x, y)) + c) % (y - x + 1)) + x


class _Gen:
    """The loader's random values: ints from ``random()`` (``randint`` costs 4x more) and alphanumeric
    strings cut from one random pool. Generating W=1 took 6.3 s with ``randint`` and fresh strings."""

    def __init__(self, rng: random.Random, size: int = 1 << 16) -> None:
        self.rng = rng
        self.random = rng.random
        self.pool = "".join(rng.choices(ALNUM, k=size))

    def num(self, lo: int, hi: int) -> int:
        return lo + int(self.random() * (hi - lo + 1))

    def a(self, lo: int, hi: int) -> str:
        n = lo + int(self.random() * (hi - lo + 1))
        start = int(self.random() * (len(self.pool) - n))
        return self.pool[start : start + n]

    def pieces(self, count: int, size: int) -> list[str]:
        """``count`` random strings of ``size`` characters (cut from one slice)."""
        s = self.a(count * size, count * size)
        return [s[k : k + size] for k in range(0, count * size, size)]

    def data(self, lo: int, hi: int) -> str:
        """I_DATA / S_DATA: 10 % contain "ORIGINAL" at a random position."""
        s = self.a(lo, hi)
        if self.random() < 0.1:
            at = self.num(0, len(s) - 8)
            s = s[:at] + "ORIGINAL" + s[at + 8 :]
        return s

    def address(self) -> str:
        street, city = f"{self.a(10, 20)}|{self.a(10, 20)}", self.a(10, 20)
        return f"{street}|{city}|{self.a(2, 2)}|{self.num(0, 9999):04d}11111"


class Sizes:
    """The cardinalities of one TPC-C population."""

    def __init__(self, warehouses: int, scale: float) -> None:
        if warehouses < 1:
            raise ValueError(f"tpcc needs at least 1 warehouse, got {warehouses}")
        if not scale > 0:
            raise ValueError(f"tpcc scale must be > 0, got {scale}")
        self.warehouses = warehouses
        self.customers = max(1, round(CUSTOMERS * scale))  # per district; also the initial orders
        self.items = max(15, round(ITEMS * scale))  # 15: a NewOrder needs that many distinct items
        self.orders = self.customers
        self.undelivered = max(1, round(self.orders * UNDELIVERED))
        self.first_new = self.orders - self.undelivered + 1  # the oldest undelivered order
        self.names = min(1000, self.customers)  # last names 0 … names-1 all exist

    def rows(self) -> dict[str, int]:
        """Entities per operator (customers 1 … 1000 of a district use every last name 0 … 999)."""
        w, dc = self.warehouses, self.warehouses * DISTRICTS
        return {
            ITEM: self.items,
            WAREHOUSE: w,
            WAREHOUSE_YTD: w,
            DISTRICT: dc,
            DISTRICT_INFO: dc,
            DISTRICT_YTD: dc,
            STOCK: w * self.items,
            CUSTOMER: dc * self.customers,
            CUSTOMER_NAME: dc * self.names,
            HISTORY: dc * self.customers,
            ORDER: dc * (order_page(self.orders) + 1),
        }


def _names_of(customers: int, rng: random.Random) -> list[str]:
    """C_LAST of customers 1 … n: the first 1000 by number, the rest NURand(255, 0, 999)."""
    return [
        last_name(c - 1) if c <= 1000 else last_name(nurand(rng, 255, 0, 999, C_LAST_LOAD))
        for c in range(1, customers + 1)
    ]


def generate(sizes: Sizes, seed: int) -> Iterator[tuple[str, str, Any]]:
    """Every row of the initial population as (operator, key, value), deterministic by ``seed``."""
    g = _Gen(random.Random(seed))
    for i in range(1, sizes.items + 1):
        item = {"im_id": g.num(1, 10_000), "name": g.a(14, 24), "price": g.num(100, 10_000)}
        yield ITEM, str(i), {**item, "data": g.data(26, 50)}
    for w in range(1, sizes.warehouses + 1):
        yield from _warehouse_rows(sizes, w, _Gen(random.Random(seed * 100_003 + w)))


def _warehouse_rows(sizes: Sizes, w: int, g: _Gen) -> Iterator[tuple[str, str, Any]]:
    d_ytd = sizes.customers * INITIAL_PAYMENT
    warehouse = {"name": g.a(6, 10), "address": g.address(), "tax": g.num(0, 2000)}
    yield WAREHOUSE, str(w), warehouse
    yield WAREHOUSE_YTD, str(w), {"ytd": DISTRICTS * d_ytd}
    for i in range(1, sizes.items + 1):
        stock = {"quantity": g.num(10, 100), "ytd": 0, "order_cnt": 0, "remote_cnt": 0}
        dist = g.pieces(DISTRICTS, 24)
        yield STOCK, f"{w}:{i}", {**stock, "dist": dist, "data": g.data(26, 50)}
    for d in range(1, DISTRICTS + 1):
        district = {"name": g.a(6, 10), "address": g.address(), "tax": g.num(0, 2000)}
        yield DISTRICT, f"{w}:{d}", {"tax": district["tax"], "next_o_id": sizes.orders + 1}
        yield DISTRICT_INFO, f"{w}:{d}", {"name": district["name"], "address": district["address"]}
        yield DISTRICT_YTD, f"{w}:{d}", {"ytd": d_ytd}
        yield from _customer_rows(sizes, w, d, g)
        yield from _order_rows(sizes, w, d, g)


def _customer_rows(sizes: Sizes, w: int, d: int, g: _Gen) -> Iterator[tuple[str, str, Any]]:
    """Customers, their initial history rows and the district's last-name index."""
    by_name: defaultdict[str, list[tuple[str, int]]] = defaultdict(list)
    for c, last in enumerate(_names_of(sizes.customers, g.rng), start=1):
        first = g.a(8, 16)
        by_name[last].append((first, c))
        customer = {
            "first": first,
            "middle": "OE",
            "last": last,
            "address": g.address(),
            "phone": f"{g.num(0, 10**16 - 1):016d}",
            "since": LOAD_TS_MS,
            "credit": "BC" if g.random() < 0.1 else "GC",
            "credit_lim": 5_000_000,
            "discount": g.num(0, 5000),
            "balance": -INITIAL_PAYMENT,
            "ytd_payment": INITIAL_PAYMENT,
            "payment_cnt": 1,
            "delivery_cnt": 0,
            "data": g.a(300, 500),
        }
        yield CUSTOMER, f"{w}:{d}:{c}", customer
        history = {"c_w": w, "c_d": d, "c_id": c, "w": w, "d": d, "date": LOAD_TS_MS}
        yield HISTORY, f"{w}:{d}:{c}:1", {**history, "amount": INITIAL_PAYMENT, "data": g.a(12, 24)}
    for last, people in sorted(by_name.items()):
        yield CUSTOMER_NAME, f"{w}:{d}:{last}", [c for _first, c in sorted(people)]


def _order_rows(sizes: Sizes, w: int, d: int, g: _Gen) -> Iterator[tuple[str, str, Any]]:
    """Orders 1 … n, one per customer (a random permutation), the last ones undelivered (with a
    new-order row), in pages (:func:`~styx_benchmarks.tpcc.schema.order_page`)."""
    owners = list(range(1, sizes.customers + 1))
    g.rng.shuffle(owners)
    page: Row = {"orders": {}, "new": []}
    for o in range(1, sizes.orders + 1):
        delivered = o < sizes.first_new
        lines = [
            [g.num(1, sizes.items), w, 5, 0 if delivered else g.num(1, 999_999), dist_info]
            for dist_info in g.pieces(g.num(5, 15), 24)
        ]
        carrier = g.num(1, 10) if delivered else None
        order = {"c_id": owners[o - 1], "entry_d": LOAD_TS_MS, "carrier_id": carrier, "ol_cnt": len(lines)}
        page["orders"][str(o)] = {**order, "all_local": True, "lines": lines}
        if not delivered:
            page["new"].append(o)
        if o == sizes.orders or order_page(o + 1) != order_page(o):
            yield ORDER, order_key(w, d, o), page
            page = {"orders": {}, "new": []}
