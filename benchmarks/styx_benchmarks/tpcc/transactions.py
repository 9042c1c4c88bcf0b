"""TPC-C NewOrder and Payment as styx-py functions, and the graph (:func:`build_app`, :data:`app`).

NewOrder is rooted at the district entity ``w:d`` (:func:`new_order`), Payment at the district's
Payment columns, ``district_ytd`` ``w:d`` (:func:`payment`; the rows are split by column,
:mod:`~styx_benchmarks.tpcc.schema`):

* **NewOrder** takes ``D_NEXT_O_ID`` and increments it, then fans out in parallel (``asyncio.gather`` of
  ``ctx.call``) to the warehouse (W_TAX), the customer (discount, credit) and one ``stock.order_line``
  per order line (5-15, distinct items), which reads the item — an unused item id raises ``Abort``
  there, two calls deep, and rolls back the whole transaction — and updates the stock row. The root
  then inserts the order (with its lines and its new-order row) into its page with ``call_async``.
  1 % of NewOrders carry an unused item id; a line is supplied by a remote warehouse with probability
  1 % (W > 1).
* **Payment** adds the amount to D_YTD and (``call_async``) to W_YTD through ``warehouse_ytd.pay``,
  both without reading them (``ctx.add``), reads W_NAME (``warehouse.name``) and D_NAME
  (``district_info.name``) and, in parallel with them for 60 % of payments, resolves the customer by
  last name through the ``customer_name`` index (the middle customer by C_FIRST, position ⌈n/2⌉, as
  the spec says); ``customer.pay`` updates balance, YTD payment, payment count (and C_DATA for bad
  credit) and inserts the history row. 15 % of payments are for a customer of a remote warehouse
  (W > 1).

Contention is TPC-C's own: every NewOrder of a district writes its D_NEXT_O_ID, so with W=1 the
NewOrders of an epoch conflict and commit in the fallback phase; more warehouses spread them out.
Every Payment of a warehouse adds to its W_YTD (and its district's D_YTD), but adds of one epoch
commute: Payments collide only when they meet on a customer. A Payment and a NewOrder do not
conflict on the warehouse or district row: each touches only its own columns.

Every operator also has the loader's and the reader's functions (:data:`COMMON`): ``put``, ``get``,
``bulk_put`` and ``get_many``. The rows are described in :mod:`~styx_benchmarks.tpcc.schema`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from styx_benchmarks.graphs import FunctionTable, Overrides, build_graph
from styx_benchmarks.tpcc.schema import (
    CUSTOMER,
    CUSTOMER_NAME,
    DISTRICT,
    DISTRICT_INFO,
    DISTRICT_YTD,
    HISTORY,
    ITEM,
    ORDER,
    ORDER_PAGE,
    PARTITIONS,
    STOCK,
    WAREHOUSE,
    WAREHOUSE_YTD,
    Row,
    key_ints,
    order_key,
    order_page,
)
from styx_py import Abort, Context, Graph
from styx_py.core.partitioning import Key


async def put(ctx: Context, value: Any) -> None:
    """Write this entity (the loader's per-row function)."""
    await ctx.put(value)


async def get(ctx: Context) -> Any:
    """This entity's value, or None (read-only)."""
    return await ctx.get()


async def bulk_put(ctx: Context, rows: list[list[Any]]) -> int:
    """Load ``[[key, value], …]`` of this operator in one transaction: one ``put`` call per row."""
    for key, value in rows:
        ctx.call_async(ctx.operator, "put", key, value)
    return len(rows)


async def get_many(ctx: Context, keys: list[str]) -> list[Any]:
    """Read many entities of this operator in one transaction (``None`` for absent ones).

    Each synchronous call halves the caller's ack share and shares travel as 64-bit integers, so one
    invocation must make far fewer than 64 of them: callers pass at most ``batches.READ_CHUNK`` keys.
    """
    return list(await asyncio.gather(*(ctx.call(ctx.operator, "get", key) for key in keys)))


# NewOrder ------------------------------------------------------------------------------------------


async def new_order(ctx: Context, c_id: int, lines: list[list[int]]) -> Row:
    """TPC-C NewOrder on district ``w:d`` for customer ``c_id``; ``lines`` are ``[i_id, supply_w, qty]``."""
    w, d = key_ints(ctx.key)
    district = await ctx.get()
    if district is None:
        raise Abort(f"no district {ctx.key}")
    o_id = district["next_o_id"]
    district["next_o_id"] = o_id + 1
    await ctx.put(district)
    w_tax, customer, *supplied = await asyncio.gather(
        ctx.call(WAREHOUSE, "tax", str(w)),
        ctx.call(CUSTOMER, "for_order", f"{w}:{d}:{c_id}"),
        *(ctx.call(STOCK, "order_line", f"{sw}:{i}", i, qty, d, sw != w) for i, sw, qty in lines),
    )
    discount, _last, credit = customer
    rows: list[list[Any]] = []
    amounts = 0
    for (i, sw, qty), (price, _name, dist_info, _brand) in zip(lines, supplied, strict=True):
        amount = qty * price
        amounts += amount
        rows.append([i, sw, qty, amount, dist_info])
    order = {
        "c_id": c_id,
        "entry_d": int(ctx.now() * 1000),
        "carrier_id": None,
        "ol_cnt": len(lines),
        "all_local": all(sw == w for _i, sw, _q in lines),
        "lines": rows,
    }
    ctx.call_async(ORDER, "insert", order_key(w, d, o_id), order)  # the page numbers it o_id
    total = amounts * (10_000 - discount) * (10_000 + w_tax + district["tax"]) // 100_000_000
    return {"o_id": o_id, "ol_cnt": len(lines), "total": total, "credit": credit}


async def _warehouse(ctx: Context) -> Row:
    """The warehouse's read-only part; a missing warehouse aborts."""
    row = await ctx.get()
    if row is None:
        raise Abort(f"no warehouse {ctx.key}")
    return row  # type: ignore[no-any-return]


async def warehouse_tax(ctx: Context) -> int:
    return int((await _warehouse(ctx))["tax"])


async def warehouse_name(ctx: Context) -> str:
    return str((await _warehouse(ctx))["name"])


async def customer_for_order(ctx: Context) -> list[Any]:
    """[C_DISCOUNT, C_LAST, C_CREDIT] (read-only)."""
    row = await ctx.get()
    if row is None:
        raise Abort(f"no customer {ctx.key}")
    return [row["discount"], row["last"], row["credit"]]


async def item_info(ctx: Context) -> list[Any]:
    """[I_PRICE, I_NAME, I_DATA]; an unused item id aborts the transaction (the spec's 1 % rollback)."""
    row = await ctx.get()
    if row is None:
        raise Abort(f"item number {ctx.key} is not valid")
    return [row["price"], row["name"], row["data"]]


async def stock_order_line(ctx: Context, i_id: int, qty: int, d_id: int, remote: bool) -> list[Any]:
    """One order line: read the item, take ``qty`` from this stock row; [price, name, dist_info, brand]."""
    price, name, i_data = await ctx.call(ITEM, "info", str(i_id))
    row = await ctx.get()
    if row is None:
        raise Abort(f"no stock row {ctx.key}")
    q = row["quantity"]
    row["quantity"] = q - qty if q >= qty + 10 else q - qty + 91
    row["ytd"] += qty
    row["order_cnt"] += 1
    if remote:
        row["remote_cnt"] += 1
    await ctx.put(row)
    brand = "B" if "ORIGINAL" in i_data and "ORIGINAL" in row["data"] else "G"
    return [price, name, row["dist"][d_id - 1], brand]


async def insert(ctx: Context, value: Any) -> None:
    """Insert a row Payment creates (history); the entity must not exist yet."""
    if await ctx.get() is not None:
        raise Abort(f"{ctx.operator} {ctx.key} already exists")
    await ctx.put(value)


def next_order_id(key: Key, page: Row) -> int:
    """The id the next order inserted into order page ``key`` (value ``page``) gets."""
    return key_ints(key)[2] * ORDER_PAGE + 1 + len(page["orders"])


async def order_insert(ctx: Context, order: Row) -> None:
    """Insert ``order`` into this page as the next order id of its range, with its new-order row.

    That id is the D_NEXT_O_ID its NewOrder took: both advance once per committed NewOrder, in commit
    order (a full page aborts: D_NEXT_O_ID pointed past it)."""
    page = await ctx.get() or {"orders": {}, "new": []}
    o_id = next_order_id(ctx.key, page)
    if order_page(o_id) != key_ints(ctx.key)[2]:
        raise Abort(f"order page {ctx.key} is full")
    page["orders"][str(o_id)] = order
    page["new"].append(o_id)
    await ctx.put(page)


# Payment -------------------------------------------------------------------------------------------


async def payment(ctx: Context, c_w: int, c_d: int, c_id: int | None, c_last: str | None, amount: int) -> Row:
    """TPC-C Payment of ``amount`` cents at district ``w:d`` (its Payment columns, ``district_ytd``) by
    customer ``c_w:c_d:c_id`` (or, with ``c_id=None``, the customer found by last name ``c_last``)."""
    w, d = key_ints(ctx.key)
    await ctx.add(amount, "ytd")  # D_YTD, without reading it
    ctx.call_async(WAREHOUSE_YTD, "pay", str(w), amount)
    names = (ctx.call(WAREHOUSE, "name", str(w)), ctx.call(DISTRICT_INFO, "name", ctx.key))
    if c_id is None:
        w_name, d_name, c_id = await asyncio.gather(
            *names, ctx.call(CUSTOMER_NAME, "middle", f"{c_w}:{c_d}:{c_last}")
        )
    else:
        w_name, d_name = await asyncio.gather(*names)
    h_data = f"{w_name}    {d_name}"
    balance = await ctx.call(CUSTOMER, "pay", f"{c_w}:{c_d}:{c_id}", w, d, amount, h_data)
    return {"c_id": c_id, "balance": balance}


async def warehouse_pay(ctx: Context, amount: int) -> None:
    """W_YTD += amount, without reading it."""
    await ctx.add(amount, "ytd")


async def district_name(ctx: Context) -> str:
    """D_NAME (read-only); a missing district aborts."""
    row = await ctx.get()
    if row is None:
        raise Abort(f"no district {ctx.key}")
    return str(row["name"])


async def customer_name_middle(ctx: Context) -> int:
    """The customer at position ⌈n/2⌉ of the ``n`` with this last name, sorted by C_FIRST."""
    ids = await ctx.get()
    if not ids:
        raise Abort(f"no customer with last name {ctx.key}")
    return int(ids[(len(ids) - 1) // 2])


async def customer_pay(ctx: Context, w: int, d: int, amount: int, h_data: str) -> int:
    """The customer's side of a Payment made at district ``w:d``; inserts the history row."""
    row = await ctx.get()
    if row is None:
        raise Abort(f"no customer {ctx.key}")
    c_w, c_d, c_id = key_ints(ctx.key)
    row["balance"] -= amount
    row["ytd_payment"] += amount
    row["payment_cnt"] += 1
    if row["credit"] == "BC":
        row["data"] = f"{c_id} {c_d} {c_w} {d} {w} {amount}|{row['data']}"[:500]
    await ctx.put(row)
    history = {
        "c_w": c_w,
        "c_d": c_d,
        "c_id": c_id,
        "w": w,
        "d": d,
        "date": int(ctx.now() * 1000),
        "amount": amount,
        "data": h_data,
    }
    ctx.call_async(HISTORY, "insert", f"{ctx.key}:{row['payment_cnt']}", history)
    return int(row["balance"])


# Per operator: function name -> (function, read-only); every operator also has the COMMON ones.
FUNCTIONS: dict[str, FunctionTable] = {
    WAREHOUSE: {"tax": (warehouse_tax, True), "name": (warehouse_name, True)},
    WAREHOUSE_YTD: {"pay": (warehouse_pay, False)},
    DISTRICT: {"new_order": (new_order, False)},
    DISTRICT_INFO: {"name": (district_name, True)},
    DISTRICT_YTD: {"payment": (payment, False)},
    CUSTOMER: {"for_order": (customer_for_order, True), "pay": (customer_pay, False)},
    CUSTOMER_NAME: {"middle": (customer_name_middle, True)},
    HISTORY: {"insert": (insert, False)},
    ITEM: {"info": (item_info, True)},
    STOCK: {"order_line": (stock_order_line, False)},
    ORDER: {"insert": (order_insert, False)},
}
COMMON: FunctionTable = {
    "put": (put, False),
    "get": (get, True),
    "bulk_put": (bulk_put, False),
    "get_many": (get_many, True),
}


def build_app(name: str = "tpcc", overrides: Overrides | None = None) -> Graph:
    """The TPC-C graph; ``overrides`` replaces functions by (operator, function) (fault injection in tests).

    Functions name their targets by string, so one set of functions serves every graph built here.
    """
    tables = ((op, partitions, {**COMMON, **FUNCTIONS[op]}) for op, partitions in PARTITIONS.items())
    return build_graph(name, tables, overrides)


app = build_app()
