"""Version 2 of the simulation's reservation app (tests/apps/effects_app.py), for code updates under
pending external calls and timers: the same operators and service, deployed as another graph."""

from __future__ import annotations

from styx_benchmarks.reservations import seat, user
from styx_py import Graph
from tests.apps.effects_app import payments

app = Graph("reservations_sim_v2", [seat, user], services={"payments": payments})
