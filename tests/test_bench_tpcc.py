"""TPC-C (NewOrder + Payment): the consistency check, the mix, the loader, and whole runs.

* ``check_state`` on hand-made states: the initial population and hand-applied transactions pass;
  each violated condition is reported with the warehouse/district/customer and both numbers.
* ``next_op``: the mix's shares, distinct items, remote warehouses, reproducible by seed.
* The whole app in the in-process simulated cluster: load, a few hundred transactions, the check on
  the full state snapshot (which holds entities the check does not need) and serial equivalence.
* On real services (Tansu + coordinator + 2 worker processes): load, run, ``check()`` is clean and
  NewOrders with an invalid item aborted; the same against ``tests.apps.tpcc_broken`` (NewOrder
  forgets the new-order row, Payment forgets W_YTD) and ``check()`` reports both bugs.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import msgspec
import pytest

from styx_benchmarks.tpcc import (
    DISTRICTS,
    LOAD_CHUNK,
    ORDER_PAGE,
    PARTITIONS,
    Sizes,
    Tpcc,
    bulk_batches,
    generate,
    last_name,
    order_key,
)
from styx_benchmarks.workload import Op, Options
from styx_benchmarks.workloads import make_workload
from styx_client import StyxClient
from styx_py.core.limits import MAX_REQUEST_BYTES
from styx_py.core.partitioning import Key, partition_of
from styx_py.stack.local import LocalStack
from styx_py.testing.cluster import SimCluster, check_against_serial
from tests.service_fixtures import ClusterFactory

TINY = 0.001  # 3 customers (and orders) per district, 1 undelivered, 100 items
StateMap = dict[tuple[str, Key], Any]


def population(warehouses: int = 1, scale: float = TINY, seed: int = 1) -> StateMap:
    return {(op, key): value for op, key, value in generate(Sizes(warehouses, scale), seed)}


def tpcc(warehouses: int = 1, scale: float = TINY, **extra: Any) -> Tpcc:
    return Tpcc(Options(warehouses=warehouses, scale=scale, extra=extra))


# ---- check_state on hand-made states --------------------------------------------------------------


def test_initial_population_is_consistent() -> None:
    for warehouses, scale in ((1, TINY), (2, 0.01)):
        state = population(warehouses, scale)
        assert tpcc(warehouses, scale).check_state(state) == []
    sizes = Sizes(1, TINY)
    assert (sizes.customers, sizes.orders, sizes.undelivered, sizes.items) == (3, 3, 1, 100)
    assert Counter(op for op, _ in population()) == sizes.rows()


def test_full_scale_cardinalities() -> None:
    rows = Sizes(10, 1.0).rows()
    assert rows == {
        "item": 100_000,
        "warehouse": 10,
        "warehouse_ytd": 10,
        "district": 100,
        "district_info": 100,
        "district_ytd": 100,
        "stock": 1_000_000,
        "customer": 300_000,
        "customer_name": 100_000,
        "history": 300_000,
        "order": 100 * 188,  # 3 000 orders per district, 16 to a page
    }


def test_check_ignores_other_entities_and_absent_rows() -> None:
    state: StateMap = population()
    state[("account", "acct1")] = 7  # another app's entity in the same snapshot
    state[("bulk", 3)] = {"x": 1}
    state[("order", "1:1:99")] = None  # a read of an absent row
    assert tpcc().check_state(state) == []


def new_order_by_hand(state: StateMap, w: int, d: int, c: int, amounts: list[int]) -> int:
    """What a committed NewOrder writes: D_NEXT_O_ID, the order with its lines, the new-order row."""
    district = state[("district", f"{w}:{d}")]
    o = district["next_o_id"]
    district["next_o_id"] += 1
    lines = [[i + 1, w, 1, amount, "x" * 24] for i, amount in enumerate(amounts)]
    order = {"c_id": c, "entry_d": 0, "carrier_id": None, "ol_cnt": len(lines), "all_local": True}
    page = state.setdefault(("order", order_key(w, d, o)), {"orders": {}, "new": []})
    page["orders"][str(o)] = {**order, "lines": lines}
    page["new"].append(o)
    return int(o)


def order_of(state: StateMap, w: int, d: int, o: int) -> Any:
    """Order ``o`` of district ``w:d``, from its page."""
    return state[("order", order_key(w, d, o))]["orders"][str(o)]


def drop_new_order(state: StateMap, w: int, d: int, o: int) -> None:
    state[("order", order_key(w, d, o))]["new"].remove(o)


def payment_by_hand(state: StateMap, w: int, d: int, c: tuple[int, int, int], amount: int) -> None:
    """What a committed Payment writes: W_YTD, D_YTD, the customer, a history row."""
    state[("warehouse_ytd", str(w))]["ytd"] += amount
    state[("district_ytd", f"{w}:{d}")]["ytd"] += amount
    key = "{}:{}:{}".format(*c)
    customer = state[("customer", key)]
    customer["balance"] -= amount
    customer["ytd_payment"] += amount
    customer["payment_cnt"] += 1
    history = {
        "c_w": c[0],
        "c_d": c[1],
        "c_id": c[2],
        "w": w,
        "d": d,
        "date": 0,
        "amount": amount,
        "data": "",
    }
    state[("history", f"{key}:{customer['payment_cnt']}")] = history


@pytest.fixture
def run_state() -> StateMap:
    """Two warehouses after a few NewOrders and Payments (one of them remote), all applied by hand."""
    state = population(2)
    new_order_by_hand(state, 1, 1, 2, [500, 700])
    new_order_by_hand(state, 1, 1, 3, [100])
    new_order_by_hand(state, 2, 5, 1, [900, 1, 2])
    payment_by_hand(state, 1, 1, (1, 1, 2), 1234)
    payment_by_hand(state, 1, 2, (2, 7, 3), 5000)  # paid at warehouse 1 by a customer of warehouse 2
    payment_by_hand(state, 2, 10, (2, 10, 1), 99)
    return state


def test_hand_applied_transactions_stay_consistent(run_state: StateMap) -> None:
    assert tpcc(2).check_state(run_state) == []


def test_warehouse_ytd_not_updated(run_state: StateMap) -> None:
    run_state[("warehouse_ytd", "1")]["ytd"] -= 1234  # a Payment that forgot W_YTD
    d_ytd = sum(run_state[("district_ytd", f"1:{d}")]["ytd"] for d in range(1, DISTRICTS + 1))
    w_ytd = d_ytd - 1234
    assert tpcc(2).check_state(run_state) == [
        f"condition 1: warehouse 1: W_YTD = {w_ytd} but its districts' D_YTD sum to {d_ytd} "
        "(cents, difference -1234)",
        f"condition 8: warehouse 1: W_YTD = {w_ytd} but the sum of H_AMOUNT of the payments made there "
        f"= {d_ytd} (cents, difference -1234)",
    ]


def test_district_ytd_not_updated(run_state: StateMap) -> None:
    run_state[("district_ytd", "2:10")]["ytd"] -= 99  # a Payment that forgot D_YTD
    errors = tpcc(2).check_state(run_state)
    assert len(errors) == 2
    assert errors[0].startswith("condition 1: warehouse 2: W_YTD = ")
    assert errors[0].endswith("(cents, difference +99)")
    paid = 3 * 1000 + 99
    assert errors[1] == (
        f"condition 9: district 2:10: D_YTD = {paid - 99} but the sum of H_AMOUNT of the payments made "
        f"there = {paid} (cents, difference -99)"
    )


def test_next_order_id_without_order(run_state: StateMap) -> None:
    run_state[("district", "2:5")]["next_o_id"] += 1  # an order id taken but no order written
    assert tpcc(2).check_state(run_state) == [
        "condition 2: district 2:5: D_NEXT_O_ID - 1 = 5 but max(O_ID) = 4",
        "condition 2: district 2:5: D_NEXT_O_ID - 1 = 5 but max(NO_O_ID) = 4",
    ]


def test_new_order_row_missing(run_state: StateMap) -> None:
    drop_new_order(run_state, 1, 1, 5)  # the newest order's row: its max moves
    drop_new_order(run_state, 2, 5, 3)  # the oldest undelivered order's row: no gap, only condition 5
    assert tpcc(2).check_state(run_state) == [
        "condition 2: district 1:1: D_NEXT_O_ID - 1 = 5 but max(NO_O_ID) = 4",
        "condition 5: district 1:1: 1 orders with a null O_CARRIER_ID have no new-order row (O_ID 5)",
        "condition 5: district 2:5: 1 orders with a null O_CARRIER_ID have no new-order row (O_ID 3)",
    ]


def test_gap_in_new_order_rows(run_state: StateMap) -> None:
    drop_new_order(run_state, 1, 1, 4)  # rows 3 and 5 remain
    assert tpcc(2).check_state(run_state) == [
        "condition 3: district 1:1: max(NO_O_ID) - min(NO_O_ID) + 1 = 5 - 3 + 1 = 3 but there are "
        "2 new-order rows (missing NO_O_ID 4)",
        "condition 5: district 1:1: 1 orders with a null O_CARRIER_ID have no new-order row (O_ID 4)",
    ]


def test_stray_new_order_row(run_state: StateMap) -> None:
    run_state[("order", order_key(1, 3, 1))]["new"].insert(0, 1)  # order 1 of district 1:3 is delivered
    assert tpcc(2).check_state(run_state) == [
        "condition 3: district 1:3: max(NO_O_ID) - min(NO_O_ID) + 1 = 3 - 1 + 1 = 3 but there are "
        "2 new-order rows (missing NO_O_ID 2)",
        "condition 5: district 1:3: 1 new-order rows have no order or a delivered one (NO_O_ID 1)",
    ]


def test_order_line_count_mismatch(run_state: StateMap) -> None:
    order = order_of(run_state, 2, 5, 4)
    order["lines"].pop()  # three lines announced, two written
    ol_cnt = sum(order_of(run_state, 2, 5, o)["ol_cnt"] for o in range(1, 5))
    assert tpcc(2).check_state(run_state) == [
        f"condition 4: district 2:5: sum of O_OL_CNT = {ol_cnt} but there are {ol_cnt - 1} order-line rows "
        "(orders whose O_OL_CNT differs from their lines: 4)",
    ]


def test_customer_payment_inconsistencies(run_state: StateMap) -> None:
    run_state[("customer", "2:7:3")]["balance"] += 5000  # the balance was not charged
    del run_state[("history", "1:1:2:2")]  # a lost history row: also W_YTD/D_YTD vs history
    errors = tpcc(2).check_state(run_state)
    assert (
        "condition 10: customer 2:7:3: C_BALANCE = -1000 but delivered OL_AMOUNT - paid H_AMOUNT = "
        "0 - 6000 = -6000 (cents)" in errors
    )
    assert (
        "condition 10: customer 1:1:2: C_BALANCE = -2234 but delivered OL_AMOUNT - paid H_AMOUNT = "
        "0 - 1000 = -1000 (cents)" in errors
    )
    assert (
        "customer payments: customer 1:1:2: C_YTD_PAYMENT = 2234 but its history amounts sum to 1000 (cents)"
        in errors
    )
    assert "customer payments: customer 1:1:2: C_PAYMENT_CNT = 2 but it has 1 history rows" in errors
    assert any(
        e.startswith("condition 8: warehouse 1: ") and e.endswith("(cents, difference +1234)") for e in errors
    )
    assert any(
        e.startswith("condition 9: district 1:1: ") and e.endswith("(cents, difference +1234)")
        for e in errors
    )
    assert len(errors) == 6, errors


def test_delivered_amounts_count_in_the_balance() -> None:
    state = population()
    order = order_of(state, 1, 4, 1)  # delivered (O_CARRIER_ID set) at load, with zero amounts
    assert order["carrier_id"] is not None
    order["lines"][0][3] = 250
    c = order["c_id"]
    assert tpcc().check_state(state) == [
        f"condition 10: customer 1:4:{c}: C_BALANCE = -1000 but delivered OL_AMOUNT - paid H_AMOUNT = "
        "250 - 1000 = -750 (cents)"
    ]


def test_missing_rows_are_named() -> None:
    state = population(2)
    del state[("warehouse", "2")]
    del state[("warehouse_ytd", "2")]
    del state[("district", "1:7")]
    del state[("district_ytd", "1:8")]
    del state[("customer", "1:3:2")]
    errors = tpcc(2).check_state(state)
    assert "missing: warehouse 2 is missing" in errors
    assert "missing: warehouse_ytd 2 (W_YTD) is missing" in errors
    assert "missing: district 1:7 is missing" in errors
    assert "missing: district_ytd 1:8 is missing" in errors
    assert "missing: customer 1:3:2 is missing" in errors
    # Without district_ytd 1:8 warehouse 1's districts sum to less; without the customer its history
    # is stray.
    assert any(e.startswith("condition 1: warehouse 1:") for e in errors)
    assert any(e.startswith("condition 1: warehouse 1:") for e in errors)


def test_malformed_keys_are_reported() -> None:
    state: StateMap = population()
    state[("order", "1:1")] = {"c_id": 1}
    state[("district", "x:y")] = {}
    assert tpcc().check_state(state) == [
        "keys: order key '1:1' is not 3 integers joined by ':'",
        "keys: district key 'x:y' is not 2 integers joined by ':'",
    ]


def test_a_row_in_another_page_than_its_order_id_is_reported(run_state: StateMap) -> None:
    """A page holds the orders of its own id range only: a row filed under another page could never
    be found by its primary key."""
    page = order_key(1, 1, ORDER_PAGE + 1)  # page 1 of district 1:1; orders 1 … 5 are in page 0
    run_state[("order", page)] = {"orders": {"5": order_of(run_state, 1, 1, 5)}, "new": [5]}
    errors = tpcc(2).check_state(run_state)
    assert errors[:2] == [
        "keys: order 1:1:1 holds order 5, which belongs to page 0",
        "keys: order 1:1:1 holds new-order row 5, of page 0",
    ]


def test_many_violations_are_capped_per_condition() -> None:
    state = population(1, 0.01)
    for c in range(1, 31):
        state[("customer", f"1:1:{c}")]["payment_cnt"] += 1
    errors = tpcc(1, 0.01).check_state(state)
    assert len(errors) == 21
    assert errors[-1] == "customer payments: … and 10 more violations"


# ---- the mix ------------------------------------------------------------------------------------------


def draw(workload: Tpcc, n: int, seed: int = 1) -> list[Op]:
    rng = random.Random(seed)
    return [workload.next_op(rng) for _ in range(n)]


def test_mix_shares_and_shapes() -> None:
    w = tpcc(4, 0.01)
    ops = draw(w, 20_000)
    new_orders = [op for op in ops if op.label == "new_order"]
    payments = [op for op in ops if op.label == "payment"]
    assert len(new_orders) + len(payments) == len(ops)
    assert 0.48 < len(new_orders) / len(ops) < 0.52
    for op in ops:
        assert op.operator == ("district" if op.label == "new_order" else "district_ytd")
        wh, d = map(int, str(op.key).split(":"))
        assert 1 <= wh <= 4 and 1 <= d <= DISTRICTS
    invalid = lines = remote_lines = 0
    for op in new_orders:
        c_id, order_lines = op.args
        assert 1 <= c_id <= w.sizes.customers
        assert 5 <= len(order_lines) <= 15
        items = [i for i, _sw, _q in order_lines]
        assert len(set(items)) == len(items), "items of one order are distinct"
        assert all(1 <= i <= w.sizes.items for i in items[:-1])
        invalid += items[-1] == w.sizes.items + 1
        for _i, sw, qty in order_lines:
            assert 1 <= qty <= 10 and 1 <= sw <= 4
            lines += 1
            remote_lines += sw != int(str(op.key).split(":")[0])
    assert 0.005 < invalid / len(new_orders) < 0.015
    assert 0.005 < remote_lines / lines < 0.015
    by_name = remote = 0
    names = {last_name(n) for n in range(w.sizes.names)}
    for op in payments:
        c_w, c_d, c_id, c_last, amount = op.args
        assert 100 <= amount <= 500_000 and 1 <= c_d <= DISTRICTS
        assert (c_id is None) != (c_last is None)
        if c_id is None:
            by_name += 1
            assert c_last in names
        remote += c_w != int(str(op.key).split(":")[0])
    assert 0.57 < by_name / len(payments) < 0.63
    assert 0.13 < remote / len(payments) < 0.17


def test_mix_single_warehouse_is_all_local_and_reproducible() -> None:
    w = tpcc(1, 0.01)
    ops = draw(w, 2000, seed=9)
    assert ops == draw(w, 2000, seed=9)
    for op in ops:
        if op.label == "new_order":
            assert {sw for _i, sw, _q in op.args[1]} == {1}
        else:
            assert op.args[0] == 1 and op.key == f"1:{op.args[1]}"
    only_new_orders = tpcc(1, 0.01, new_order_share=1.0)
    assert {op.label for op in draw(only_new_orders, 200)} == {"new_order"}
    with pytest.raises(ValueError, match="new_order_share"):
        tpcc(new_order_share=2)


def test_registry_and_options_validation() -> None:
    assert isinstance(make_workload("tpcc", Options(scale=TINY)), Tpcc)
    with pytest.raises(ValueError, match="warehouse"):
        Tpcc(Options(warehouses=0))
    with pytest.raises(ValueError, match="scale"):
        Tpcc(Options(scale=0))


# ---- the loader -------------------------------------------------------------------------------------


def test_bulk_batches_are_partition_local_and_bounded() -> None:
    rows = list(generate(Sizes(1, 0.02), 3))
    ops = list(bulk_batches(rows))
    seen: list[tuple[str, str]] = []
    for op in ops:
        assert op.function == "bulk_put" and 1 <= len(op.args[0]) <= LOAD_CHUNK
        root = partition_of(op.key, PARTITIONS[op.operator])
        for key, _value in op.args[0]:
            assert partition_of(key, PARTITIONS[op.operator]) == root, "a put would leave the worker"
            seen.append((op.operator, key))
        assert len(msgspec.msgpack.encode(list(op.args))) < MAX_REQUEST_BYTES // 2
    assert sorted(seen) == sorted((op, key) for op, key, _v in rows)
    assert rows == list(generate(Sizes(1, 0.02), 3)), "the population is a function of the seed"


# ---- the whole app in the simulated cluster ---------------------------------------------------------


async def test_simulated_run_is_consistent_and_serializable() -> None:
    workload = tpcc(2, 0.01)
    async with SimCluster("styx_benchmarks.tpcc:app", workers=2, seed=4) as cluster:
        for op in workload.load_ops():
            cluster.submit(op.operator, op.function, op.key, *op.args)
        await cluster.wait()
        assert workload.check_state(cluster.state()) == []
        rng = random.Random(2)
        ops = [workload.next_op(rng) for _ in range(200)]
        for op in ops:
            cluster.submit(op.operator, op.function, op.key, *op.args)
        replies = await cluster.wait()
        statuses = Counter(r.status for r in replies)
        invalid = sum(op.label == "new_order" and op.args[1][-1][0] > workload.sizes.items for op in ops)
        assert statuses["aborted"] == invalid > 0
        assert statuses["failed"] == 0
        assert workload.check_state(cluster.state()) == []  # the full snapshot, bulk roots and all
        await check_against_serial(cluster)


async def test_new_orders_of_one_district_in_one_epoch_all_commit_in_the_fallback() -> None:
    """They all take D_NEXT_O_ID, so they collide; their orders go to one page, so each re-runs in the
    fallback with the calls its optimistic run made and commits there, one after another (none is
    moved to the next epoch). The one that opens the next page is moved."""
    workload = tpcc(1, 0.01)  # 30 orders per district: order 31 is the 15th of page 1
    rng = random.Random(3)
    ops: list[Op] = []
    while len(ops) < 3 * ORDER_PAGE + 3:  # orders 31 … 81: page 1 ends at 32, page 2 starts at 33
        op = workload._new_order(rng, 1, 1)
        if op.args[1][-1][0] <= workload.sizes.items:  # a valid item in every line
            ops.append(op)
    async with SimCluster("styx_benchmarks.tpcc:app", workers=2, seed=4) as cluster:
        for load in workload.load_ops():
            cluster.submit(load.operator, load.function, load.key, *load.args)
        await cluster.wait()
        before = sum(w.totals.rescheduled for w in cluster.workers)
        fallback = sum(w.totals.fallback for w in cluster.workers)
        for op in ops[:2]:
            cluster.submit(op.operator, op.function, op.key, *op.args)
        replies = (await cluster.wait())[-2:]
        assert [r.value["o_id"] for r in replies] == [31, 32]
        assert sum(w.totals.fallback for w in cluster.workers) > fallback, "they did not collide"
        assert sum(w.totals.rescheduled for w in cluster.workers) == before
        fallback = sum(w.totals.fallback for w in cluster.workers)
        for op in ops[2 : 2 + ORDER_PAGE]:  # orders 33 … 48, all of page 2
            cluster.submit(op.operator, op.function, op.key, *op.args)
        replies = (await cluster.wait())[-ORDER_PAGE:]
        assert sorted(r.value["o_id"] for r in replies) == list(range(33, 33 + ORDER_PAGE))
        assert {r.status for r in replies} == {"committed"}
        assert sum(w.totals.fallback for w in cluster.workers) > fallback
        assert sum(w.totals.rescheduled for w in cluster.workers) == before
        # Orders 49 … 81: pages 3 and 4 and the first of page 5. The 16 that take page 3's ids in the
        # fallback commit there; the one that would open page 4 reaches another page than its
        # optimistic run did and is moved, and so is every one behind it in the epoch (its id is
        # still free). Moved, they commit in later epochs. (With one entity per order, all but the
        # first of the 33 would be moved.)
        for op in ops[2 + ORDER_PAGE :]:
            cluster.submit(op.operator, op.function, op.key, *op.args)
        replies = (await cluster.wait())[-(2 * ORDER_PAGE + 1) :]
        assert sorted(r.value["o_id"] for r in replies) == list(range(49, 49 + 2 * ORDER_PAGE + 1))
        assert {r.status for r in replies} == {"committed"}
        moved = sum(w.totals.rescheduled for w in cluster.workers) - before
        assert 1 <= moved <= ORDER_PAGE + 1
        assert workload.check_state(cluster.state()) == []
        await check_against_serial(cluster)


# ---- real services ----------------------------------------------------------------------------------


@pytest.fixture
def stack(local_cluster: ClusterFactory) -> LocalStack:
    return local_cluster(app="styx_benchmarks.tpcc:app")


@pytest.fixture
def broken_stack(local_cluster: ClusterFactory) -> LocalStack:
    return local_cluster(app="tests.apps.tpcc_broken:app")


MAX_SENDS = 200  # a refused op's sends; each refusal is answered in an epoch, behind the queue


async def load_and_run(
    stack: LocalStack, workload: Tpcc, n: int, seed: int
) -> tuple[list[Op], list[Any], list[str]]:
    """Load, run ``n`` ops of the mix concurrently, then check; (ops, replies, check messages).

    100 in flight at once queue behind a few districts: admission refuses new ones behind a district
    whose queue is past its bound (nothing ran), and a refused op is sent again as a new request, as
    a client that gets 429 does."""
    messages: list[str] = []
    connecting = StyxClient.connect(stack.coordinator, timeout_s=60, shed_when_refused=False)
    async with await connecting as client:
        await workload.load(client, progress=messages.append)
        assert messages and messages[-1].startswith("tpcc: loaded W=2 scale=0.01")
        rng = random.Random(seed)
        ops = [workload.next_op(rng) for _ in range(n)]
        window = asyncio.Semaphore(100)

        async def submit(op: Op) -> Any:
            async with window:
                for _ in range(MAX_SENDS):
                    reply = await client.submit(op.operator, op.key, op.function, *op.args)
                    if reply.status != "refused":
                        return reply
                raise AssertionError(f"{op} refused {MAX_SENDS} times")

        replies = await asyncio.gather(*(submit(op) for op in ops))
        return ops, list(replies), await workload.check(client)


@pytest.mark.services
async def test_run_on_real_services_is_consistent(stack: LocalStack) -> None:
    workload = tpcc(2, 0.01)
    ops, replies, errors = await load_and_run(stack, workload, 400, seed=5)
    assert errors == []
    invalid = [op.label == "new_order" and op.args[1][-1][0] > workload.sizes.items for op in ops]
    assert sum(invalid) > 0, "the seed should draw some invalid items"
    for op, reply, bad in zip(ops, replies, invalid, strict=True):
        if bad:
            assert reply.status == "aborted", reply
            assert reply.error == f"item number {workload.sizes.items + 1} is not valid"
        else:
            assert reply.status == "committed", (op, reply)


@pytest.mark.services
async def test_broken_app_on_real_services_is_caught(broken_stack: LocalStack) -> None:
    workload = tpcc(2, 0.01)
    ops, replies, errors = await load_and_run(broken_stack, workload, 200, seed=6)
    committed = [op for op, reply in zip(ops, replies, strict=True) if reply.status == "committed"]
    paid_at = {int(str(op.key).split(":")[0]) for op in committed if op.label == "payment"}
    ordered_at = {str(op.key) for op in committed if op.label == "new_order"}
    assert paid_at and ordered_at
    for w in paid_at:  # Payment forgot W_YTD
        assert any(e.startswith(f"condition 1: warehouse {w}: W_YTD = ") for e in errors), errors
        assert any(e.startswith(f"condition 8: warehouse {w}: W_YTD = ") for e in errors), errors
    for key in ordered_at:  # NewOrder forgot the new-order row: max(NO_O_ID) stays at the initial 30
        assert any(
            e.startswith(f"condition 2: district {key}: D_NEXT_O_ID - 1 = ")
            and e.endswith("max(NO_O_ID) = 30")
            for e in errors
        ), errors
        assert any(e.startswith(f"condition 5: district {key}: ") for e in errors), errors
    assert not any(
        e.startswith(("condition 3", "condition 4", "condition 9", "condition 10")) for e in errors
    )
