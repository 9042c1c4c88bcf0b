"""TPC-C NewOrder + Payment as styx-py function call graphs, with a bulk loader and the consistency check.

The app deploys as ``styx_benchmarks.tpcc:app``; the workload is :class:`Tpcc` (``styx bench tpcc``).
One module per concern, each importing only those above it in this list:

* :mod:`~styx_benchmarks.tpcc.schema`: the tables as operators (names, partitions, row shapes);
* :mod:`~styx_benchmarks.tpcc.transactions`: NewOrder, Payment and the loader's functions, and
  :func:`build_app` (which tests use to build deliberately broken variants, see ``tests/apps``);
* :mod:`~styx_benchmarks.tpcc.population`: cardinalities (:class:`Sizes`), NURand, the row generators;
* :mod:`~styx_benchmarks.tpcc.batches`: rows grouped into ``bulk_put`` / ``get_many`` transactions;
* :mod:`~styx_benchmarks.tpcc.check`: the spec's consistency conditions on a state map;
* :mod:`~styx_benchmarks.tpcc.workload`: :class:`Tpcc`, the mix, the loader and the state reader.
"""

from styx_benchmarks.tpcc.batches import LOAD_CHUNK, READ_CHUNK, bulk_batches, read_batches
from styx_benchmarks.tpcc.check import check_state
from styx_benchmarks.tpcc.population import Sizes, generate, last_name, nurand
from styx_benchmarks.tpcc.schema import DISTRICTS, ORDER_PAGE, PARTITIONS, order_key, order_page
from styx_benchmarks.tpcc.transactions import app, build_app
from styx_benchmarks.tpcc.workload import Tpcc

__all__ = [
    "DISTRICTS",
    "LOAD_CHUNK",
    "ORDER_PAGE",
    "PARTITIONS",
    "READ_CHUNK",
    "Sizes",
    "Tpcc",
    "app",
    "build_app",
    "bulk_batches",
    "check_state",
    "generate",
    "last_name",
    "nurand",
    "order_key",
    "order_page",
    "read_batches",
]
