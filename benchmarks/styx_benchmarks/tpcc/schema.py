"""TPC-C's tables as styx-py operators: names, partition counts and the shape of each row.

Data model (one entity per row of the tables NewOrder and Payment touch; keys are ``str``)::

    operator        key               value
    warehouse       "w"               {name, address, tax, ytd}
    district        "w:d"             {name, address, tax, ytd, next_o_id}
    customer        "w:d:c"           {first, middle, last, address, phone, since, credit, credit_lim,
                                       discount, balance, ytd_payment, payment_cnt, delivery_cnt, data}
    customer_name   "w:d:LAST"        [c_id, …] sorted by (C_FIRST, c_id): the last-name index
    history         "w:d:c:n"         {c_w, c_d, c_id, w, d, date, amount, data}: the customer's n-th payment
    item            "i"               {im_id, name, price, data}
    stock           "w:i"             {quantity, ytd, order_cnt, remote_cnt, dist: [10 strings of 24], data}
    order           "w:d:o"           {c_id, entry_d, carrier_id, ol_cnt, all_local,
                                       lines: [[i_id, supply_w, quantity, amount, dist_info], …]}
    new_order       "w:d:o"           o_id (the row's presence is what counts)

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
DISTRICT = "district"
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
    DISTRICT: 8,
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
