"""TPC-C's consistency conditions, checked on a state map (:func:`check_state`).

The spec's numbering; those that NewOrder and Payment can affect:

1. W_YTD = Σ D_YTD of the warehouse's districts;
2. D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID) per district;
3. max(NO_O_ID) - min(NO_O_ID) + 1 = the number of new-order rows per district;
4. Σ O_OL_CNT = the number of order-line rows per district (and per order);
5. O_CARRIER_ID is null exactly for the orders that have a new-order row;
8. W_YTD = Σ H_AMOUNT of the payments made at the warehouse;
9. D_YTD = Σ H_AMOUNT of the payments made at the district;
10. C_BALANCE = Σ OL_AMOUNT of the customer's delivered orders - Σ H_AMOUNT of the customer's payments
    (there is no Delivery here, so only the initially delivered orders count), and also
    C_YTD_PAYMENT = Σ H_AMOUNT and C_PAYMENT_CNT = the number of the customer's history rows.

The check is a plain function of ``{(operator, key): value}``: it ignores the entities of other tables
(a full snapshot holds them) and reads each row's identity from its key (an order's and a new-order
row's from its page's key and its order id, which must be of that page's range). W_YTD and D_YTD are in the
rows' Payment parts (``warehouse_ytd``, ``district_ytd``), D_NEXT_O_ID in the district's NewOrder part.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from styx_benchmarks.tpcc.population import Sizes
from styx_benchmarks.tpcc.schema import (
    CUSTOMER,
    DISTRICT,
    DISTRICT_YTD,
    DISTRICTS,
    HISTORY,
    ORDER,
    WAREHOUSE,
    WAREHOUSE_YTD,
    Row,
    key_ints,
    order_page,
)
from styx_benchmarks.workload import State

MAX_MESSAGES_PER_CONDITION = 20


class _Report:
    """Violations by condition, at most :data:`MAX_MESSAGES_PER_CONDITION` spelled out for each."""

    def __init__(self) -> None:
        self.by_condition: dict[str, list[str]] = defaultdict(list)

    def add(self, condition: str, message: str) -> None:
        self.by_condition[condition].append(f"{condition}: {message}")

    def messages(self) -> list[str]:
        out: list[str] = []
        for condition, messages in self.by_condition.items():
            out += messages[:MAX_MESSAGES_PER_CONDITION]
            if len(messages) > MAX_MESSAGES_PER_CONDITION:
                out.append(f"{condition}: … and {len(messages) - MAX_MESSAGES_PER_CONDITION} more violations")
        return out


def _ids(values: Iterable[int], limit: int = 5) -> str:
    ordered = sorted(values)
    shown = ", ".join(map(str, ordered[:limit]))
    return shown + (", …" if len(ordered) > limit else "")


class _Tables:
    """The rows of a state map that the check needs, parsed from their keys."""

    def __init__(self, state: State, report: _Report) -> None:
        self.warehouses: dict[int, Row] = {}
        self.warehouse_ytd: dict[int, Row] = {}
        self.districts: dict[tuple[int, int], Row] = {}
        self.district_ytd: dict[tuple[int, int], Row] = {}
        self.customers: dict[tuple[int, int, int], Row] = {}
        self.orders: defaultdict[tuple[int, int], dict[int, Row]] = defaultdict(dict)
        self.new_orders: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
        self.history: list[Row] = []
        arity = {
            WAREHOUSE: 1,
            WAREHOUSE_YTD: 1,
            DISTRICT: 2,
            DISTRICT_YTD: 2,
            CUSTOMER: 3,
            ORDER: 3,
            HISTORY: 4,
        }
        for (op, key), value in state.items():
            n = arity.get(op)
            if n is None or value is None:
                continue  # another table, or an absent row
            try:
                ids = key_ints(key)
            except ValueError:
                ids = []
            if len(ids) != n:
                report.add("keys", f"{op} key {key!r} is not {n} integers joined by ':'")
                continue
            if op == WAREHOUSE:
                self.warehouses[ids[0]] = value
            elif op == WAREHOUSE_YTD:
                self.warehouse_ytd[ids[0]] = value
            elif op == DISTRICT:
                self.districts[(ids[0], ids[1])] = value
            elif op == DISTRICT_YTD:
                self.district_ytd[(ids[0], ids[1])] = value
            elif op == CUSTOMER:
                self.customers[(ids[0], ids[1], ids[2])] = value
            elif op == ORDER:
                self._order_page(ids, value, report)
            else:
                self.history.append(value)

    def _order_page(self, ids: list[int], page: Any, report: _Report) -> None:
        """An order page's orders and new-order rows; one outside the page's id range is reported."""
        w, d, p = ids
        for o_key, order in page["orders"].items():
            o = int(o_key)
            if order_page(o) != p:
                report.add(
                    "keys", f"order {w}:{d}:{p} holds order {o}, which belongs to page {order_page(o)}"
                )
            self.orders[(w, d)][o] = order
        for o in page["new"]:
            if order_page(o) != p:
                report.add("keys", f"order {w}:{d}:{p} holds new-order row {o}, of page {order_page(o)}")
            self.new_orders[(w, d)].add(o)


def check_state(sizes: Sizes, state: State) -> list[str]:
    """Every violated consistency condition of ``state`` (see the module docstring), at most
    :data:`MAX_MESSAGES_PER_CONDITION` spelled out per condition."""
    report = _Report()
    t = _Tables(state, report)
    paid_at_w: defaultdict[int, int] = defaultdict(int)
    paid_at_d: defaultdict[tuple[int, int], int] = defaultdict(int)
    paid_by: defaultdict[tuple[int, int, int], list[int]] = defaultdict(list)
    for h in t.history:
        paid_at_w[h["w"]] += h["amount"]
        paid_at_d[(h["w"], h["d"])] += h["amount"]
        paid_by[(h["c_w"], h["c_d"], h["c_id"])].append(h["amount"])
    delivered: defaultdict[tuple[int, int, int], int] = defaultdict(int)
    for (w, d), orders in t.orders.items():
        for order in orders.values():
            if order["carrier_id"] is not None:
                delivered[(w, d, order["c_id"])] += sum(line[3] for line in order["lines"])

    for w in range(1, sizes.warehouses + 1):
        _check_warehouse(report, t, w, paid_at_w[w])
        for d in range(1, DISTRICTS + 1):
            _check_district(report, t, w, d, paid_at_d[(w, d)])
    for w in range(1, sizes.warehouses + 1):
        for d in range(1, DISTRICTS + 1):
            for c in range(1, sizes.customers + 1):
                _check_customer(report, t, (w, d, c), paid_by[(w, d, c)], delivered[(w, d, c)])
    return report.messages()


def _check_warehouse(report: _Report, t: _Tables, w: int, paid: int) -> None:
    if w not in t.warehouses:
        report.add("missing", f"warehouse {w} is missing")
    warehouse = t.warehouse_ytd.get(w)
    if warehouse is None:
        report.add("missing", f"warehouse_ytd {w} (W_YTD) is missing")
        return
    d_ytd = sum(t.district_ytd[(w, d)]["ytd"] for d in range(1, DISTRICTS + 1) if (w, d) in t.district_ytd)
    if warehouse["ytd"] != d_ytd:
        report.add(
            "condition 1",
            f"warehouse {w}: W_YTD = {warehouse['ytd']} but its districts' D_YTD sum to {d_ytd} "
            f"(cents, difference {warehouse['ytd'] - d_ytd:+d})",
        )
    if warehouse["ytd"] != paid:
        report.add(
            "condition 8",
            f"warehouse {w}: W_YTD = {warehouse['ytd']} but the sum of H_AMOUNT of the payments made "
            f"there = {paid} (cents, difference {warehouse['ytd'] - paid:+d})",
        )


def _check_district(report: _Report, t: _Tables, w: int, d: int, paid: int) -> None:
    district, payment_part = t.districts.get((w, d)), t.district_ytd.get((w, d))
    if district is None or payment_part is None:
        part = "district" if district is None else "district_ytd"
        report.add("missing", f"{part} {w}:{d} is missing")
        return
    name = f"district {w}:{d}"
    orders = t.orders.get((w, d), {})
    new_orders = t.new_orders.get((w, d), set())
    last = district["next_o_id"] - 1
    max_o = max(orders, default=0)
    max_no = max(new_orders, default=0)
    if max_o != last:
        report.add("condition 2", f"{name}: D_NEXT_O_ID - 1 = {last} but max(O_ID) = {max_o}")
    if max_no != last:
        report.add("condition 2", f"{name}: D_NEXT_O_ID - 1 = {last} but max(NO_O_ID) = {max_no}")
    if new_orders:
        span = max_no - min(new_orders) + 1
        if span != len(new_orders):
            missing = set(range(min(new_orders), max_no + 1)) - new_orders
            report.add(
                "condition 3",
                f"{name}: max(NO_O_ID) - min(NO_O_ID) + 1 = {max_no} - {min(new_orders)} + 1 = {span} "
                f"but there are {len(new_orders)} new-order rows (missing NO_O_ID {_ids(missing)})",
            )
    ol_cnt = sum(o["ol_cnt"] for o in orders.values())
    ol_rows = sum(len(o["lines"]) for o in orders.values())
    if ol_cnt != ol_rows:
        wrong = [o for o, order in orders.items() if order["ol_cnt"] != len(order["lines"])]
        report.add(
            "condition 4",
            f"{name}: sum of O_OL_CNT = {ol_cnt} but there are {ol_rows} order-line rows "
            f"(orders whose O_OL_CNT differs from their lines: {_ids(wrong)})",
        )
    undelivered = {o for o, order in orders.items() if order["carrier_id"] is None}
    if undelivered - new_orders:
        lost = undelivered - new_orders
        report.add(
            "condition 5",
            f"{name}: {len(lost)} orders with a null O_CARRIER_ID have no new-order row (O_ID {_ids(lost)})",
        )
    if new_orders - undelivered:
        stray = new_orders - undelivered
        report.add(
            "condition 5",
            f"{name}: {len(stray)} new-order rows have no order or a delivered one (NO_O_ID {_ids(stray)})",
        )
    if payment_part["ytd"] != paid:
        report.add(
            "condition 9",
            f"{name}: D_YTD = {payment_part['ytd']} but the sum of H_AMOUNT of the payments made there = "
            f"{paid} "
            f"(cents, difference {payment_part['ytd'] - paid:+d})",
        )


def _check_customer(
    report: _Report, t: _Tables, c_key: tuple[int, int, int], paid: list[int], delivered: int
) -> None:
    customer = t.customers.get(c_key)
    name = "customer {}:{}:{}".format(*c_key)
    if customer is None:
        report.add("missing", f"{name} is missing")
        return
    total = sum(paid)
    if customer["balance"] != delivered - total:
        report.add(
            "condition 10",
            f"{name}: C_BALANCE = {customer['balance']} but delivered OL_AMOUNT - paid H_AMOUNT = "
            f"{delivered} - {total} = {delivered - total} (cents)",
        )
    if customer["ytd_payment"] != total:
        report.add(
            "customer payments",
            f"{name}: C_YTD_PAYMENT = {customer['ytd_payment']} but its history amounts sum to {total} "
            "(cents)",
        )
    if customer["payment_cnt"] != len(paid):
        report.add(
            "customer payments",
            f"{name}: C_PAYMENT_CNT = {customer['payment_cnt']} but it has {len(paid)} history rows",
        )
