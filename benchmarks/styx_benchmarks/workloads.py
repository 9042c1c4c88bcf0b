"""The registry of benchmark workloads by name: what ``styx bench``, the audit and the tests pick from.

Kept apart from :mod:`styx_benchmarks.workload` (the base class every workload module imports), so
the import graph stays acyclic: this module imports the workloads, nothing imports it back.
"""

from __future__ import annotations

from styx_benchmarks.deathstar import HotelReservation, MovieReview
from styx_benchmarks.reservations_bench import Reservations
from styx_benchmarks.tpcc import Tpcc
from styx_benchmarks.workload import Options, Workload
from styx_benchmarks.ycsbt import YcsbT

WORKLOADS: dict[str, type[Workload]] = {
    cls.name: cls for cls in (YcsbT, Tpcc, HotelReservation, MovieReview, Reservations)
}


def workload_names() -> list[str]:
    return sorted(WORKLOADS)


def make_workload(name: str, options: Options | None = None) -> Workload:
    cls = WORKLOADS.get(name)
    if cls is None:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    return cls(options)
