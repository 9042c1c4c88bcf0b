"""TPC-C's tables as styx-py operators: names, partition counts and the shape of each row.

Data model (one entity per row of the tables NewOrder and Payment touch; keys are ``str``)::

    operator        key               value
    warehouse       "w"               {tax, name, address}: the read-only columns of the warehouse row
    warehouse_ytd   "w"               {ytd}: the column Payment writes
    district        "w:d"             {tax, next_o_id}: NewOrder's columns of the district row
    district_ytd    "w:d"             {name, address, ytd}: Payment's columns of it
    customer        "w:d:c"           {first, middle, last, address, phone, since, credit, credit_lim,
                                       discount, balance, ytd_payment, payment_cnt, delivery_cnt, data}
    customer_name   "w:d:LAST"        [c_id, …] sorted by (C_FIRST, c_id): the last-name index
    history         "w:d:c:n"         {c_w, c_d, c_id, w, d, date, amount, data}: the customer's n-th payment
    item            "i"               {im_id, name, price, data}
    stock           "w:i"             {quantity, ytd, order_cnt, remote_cnt, dist: [10 strings of 24], data}
    order           "w:d:o"           {c_id, entry_d, carrier_id, ol_cnt, all_local,
                                       lines: [[i_id, supply_w, quantity, amount, dist_info], …]}
    new_order       "w:d:o"           o_id (the row's presence is what counts)

The warehouse and district rows are split by column (vertical partitioning, which the TPC-C spec
allows, clause 1.6): the columns NewOrder writes (D_NEXT_O_ID) and Payment writes (W_YTD; D_YTD) each
apart, the warehouse's read-only columns (W_TAX, W_NAME and the address) in one part that both read
and neither writes. So a Payment and a NewOrder of one district never conflict on its row: NewOrders
collide with NewOrders of their district (D_NEXT_O_ID), Payments with Payments of their warehouse
(W_YTD). Payment adds to W_YTD with an asynchronous call it does not wait for (it reads W_NAME from the
read-only part, which readers share in the fallback): there the Payments of a warehouse take W_YTD one
after another, and the rest of each Payment runs while it waits for it.

Order lines live inside their order (they are only ever written with it), which keeps the entity count
at one per order instead of ten. History rows are keyed by the customer's payment count, so the rows of
a customer are enumerable (``1 … C_PAYMENT_CNT``) without a scan. Money is integer cents; tax and
discount are integer basis points (1/10 000), so sums are exact.
"""

from __future__ import annotations

from typing import Any

from styx_py.core.partitioning import Key

Row = dict[str, Any]

# Operator names: functions call each other by name, so every graph build_app makes can share them.
WAREHOUSE = "warehouse"
WAREHOUSE_YTD = "warehouse_ytd"
DISTRICT = "district"
DISTRICT_YTD = "district_ytd"
CUSTOMER = "customer"
CUSTOMER_NAME = "customer_name"
HISTORY = "history"
ITEM = "item"
STOCK = "stock"
ORDER = "order"
NEW_ORDER = "new_order"

# Partitions per operator: the big, evenly accessed tables get 8; the small or read-mostly ones 4.
PARTITIONS: dict[str, int] = {
    WAREHOUSE: 4,
    WAREHOUSE_YTD: 4,
    DISTRICT: 8,
    DISTRICT_YTD: 8,
    CUSTOMER: 8,
    CUSTOMER_NAME: 4,
    HISTORY: 8,
    ITEM: 4,
    STOCK: 8,
    ORDER: 8,
    NEW_ORDER: 8,
}

DISTRICTS = 10  # per warehouse


def key_ints(key: Key) -> list[int]:
    """The integers of a key such as ``"w:d:c"`` (ValueError when a part is not one)."""
    return [int(p) for p in str(key).split(":")]
