"""TPC-C's tables as styx-py operators: names, partition counts and the shape of each row.

Data model (one entity per row of the tables NewOrder and Payment touch, orders in pages; keys are
``str``)::

    operator        key               value
    warehouse       "w"               {tax, name, address}: the read-only columns of the warehouse row
    warehouse_ytd   "w"               {ytd}: the column Payment writes
    district        "w:d"             {tax, next_o_id}: NewOrder's columns of the district row
    district_info   "w:d"             {name, address}: its read-only columns
    district_ytd    "w:d"             {ytd}: the column Payment writes
    customer        "w:d:c"           {first, middle, last, address, phone, since, credit, credit_lim,
                                       discount, balance, ytd_payment, payment_cnt, delivery_cnt, data}
    customer_name   "w:d:LAST"        [c_id, …] sorted by (C_FIRST, c_id): the last-name index
    history         "w:d:c:n"         {c_w, c_d, c_id, w, d, date, amount, data}: the customer's n-th payment
    item            "i"               {im_id, name, price, data}
    stock           "w:i"             {quantity, ytd, order_cnt, remote_cnt, dist: [10 strings of 24], data}
    order           "w:d:p"           {orders: {"o": {c_id, entry_d, carrier_id, ol_cnt, all_local,
                                                  lines: [[i_id, supply_w, quantity, amount, dist_info], …]},
                                             …},
                                       new: [o, …]}: page p of the district's orders, o from
                                       p·ORDER_PAGE + 1 on, and the NEW-ORDER rows of those orders

The warehouse and district rows are split by column (vertical partitioning, which the TPC-C spec
allows, clause 1.6): the columns NewOrder writes (D_NEXT_O_ID) and Payment writes (W_YTD; D_YTD) each
apart, the read-only columns (W_TAX, W_NAME, D_NAME and the addresses) in parts that both read and
neither writes. So a Payment and a NewOrder of one district never conflict on its row: NewOrders
collide with NewOrders of their district (D_NEXT_O_ID). Payment adds to D_YTD and (with an
asynchronous call) to W_YTD without reading them (``Context.add``): adds of one epoch commute, so the
Payments of a warehouse do not collide there either, and commit without locks unless they meet on a
customer.

The ORDER rows of a district are stored in pages of :data:`ORDER_PAGE` consecutive order ids, one
entity per page, with the NEW-ORDER rows of those orders (a clustered layout: a row is still found by
its primary key, order ``o`` in page ``(o - 1) // ORDER_PAGE``, and deleting a NEW-ORDER row leaves its
order in place). The page gives an inserted order the next id of its range, the same D_NEXT_O_ID gave
the NewOrder that inserts it (both advance once per committed NewOrder, in commit order), so what a
NewOrder sends does not depend on the id it took: only the page's key does, and it is the same for all
but every ORDER_PAGE-th order. The NewOrders of a district that collide on D_NEXT_O_ID in an epoch then
re-run in the fallback one after another with the calls their optimistic run made, and commit there.
With one entity per order each would reach another order entity than its optimistic run did, or send
another order id, and be moved to the next epoch, where one runs per district. Only the NewOrder that
opens a new page, and those behind it in its epoch, are moved.

Order lines live inside their order (they are only ever written with it). History rows are keyed by
the customer's payment count, so the rows of a customer are enumerable (``1 … C_PAYMENT_CNT``)
without a scan. Money is integer cents; tax and discount are integer basis points (1/10 000), so sums
are exact.
"""

from __future__ import annotations

from typing import Any

from styx_py.core.partitioning import Key

Row = dict[str, Any]

# Operator names: functions call each other by name, so every graph build_app makes can share them.
WAREHOUSE = "warehouse"
WAREHOUSE_YTD = "warehouse_ytd"
DISTRICT = "district"
DISTRICT_INFO = "district_info"
DISTRICT_YTD = "district_ytd"
CUSTOMER = "customer"
CUSTOMER_NAME = "customer_name"
HISTORY = "history"
ITEM = "item"
STOCK = "stock"
ORDER = "order"

# Partitions per operator: the big, evenly accessed tables get 8; the small or read-mostly ones 4.
PARTITIONS: dict[str, int] = {
    WAREHOUSE: 4,
    WAREHOUSE_YTD: 4,
    DISTRICT: 8,
    DISTRICT_INFO: 4,
    DISTRICT_YTD: 8,
    CUSTOMER: 8,
    CUSTOMER_NAME: 4,
    HISTORY: 8,
    ITEM: 4,
    STOCK: 8,
    ORDER: 8,
}

DISTRICTS = 10  # per warehouse
ORDER_PAGE = 16  # orders per order entity (consecutive order ids of one district)


def order_page(o_id: int) -> int:
    """The page holding order ``o_id`` (and its new-order row)."""
    return (o_id - 1) // ORDER_PAGE


def order_key(w: int, d: int, o_id: int) -> str:
    """The key of the order entity (page) holding order ``o_id`` of district ``w:d``."""
    return f"{w}:{d}:{order_page(o_id)}"


def key_ints(key: Key) -> list[int]:
    """The integers of a key such as ``"w:d:c"`` (ValueError when a part is not one)."""
    return [int(p) for p in str(key).split(":")]
