"""DeathStar's two SFaaS workloads (Gan et al., 2019, as ported to stateful functions by Beldi and Styx).

Both follow the Styx paper, §8 and Table 1: "Deathstar Movie — 2k keys, 9-10 function calls, 0%
transactions; Deathstar Travel — 2k keys, 3 function calls, 0.5% transactions", both uniform.

* Hotel / travel reservation (``deathstar-hotel``, app ``styx_benchmarks.deathstar:hotel_app``):
  the app in :mod:`~styx_benchmarks.deathstar.hotel`, the workload (population, mix, invariant
  check) :class:`HotelReservation` in :mod:`~styx_benchmarks.deathstar.hotel_workload`. Its geo index
  is grid cells by default; ``Options.extra["geo"] = "range"`` (``styx bench deathstar-hotel --geo
  range``) runs the app ``styx_benchmarks.deathstar:hotel_range_app`` instead
  (:mod:`~styx_benchmarks.deathstar.hotel_range`: the index as range reads over sorted keys).
* Movie review (``deathstar-movie``, app ``styx_benchmarks.deathstar:movie_app``): the app in
  :mod:`~styx_benchmarks.deathstar.movie`, the workload :class:`MovieReview` in
  :mod:`~styx_benchmarks.deathstar.movie_workload`.
* :mod:`~styx_benchmarks.deathstar.common`: partitions, the bulk loader's functions, the mix.

The apps are built from tables of functions (:func:`build_hotel_app`, :func:`build_movie_app`), which
the tests use to build deliberately broken variants (``tests/apps/deathstar_broken.py``).
"""

from styx_benchmarks.deathstar.hotel import (
    CELL_COLS,
    CELL_DEG,
    CELL_ROWS,
    LAT_MAX,
    LAT_MIN,
    LON_MAX,
    LON_MIN,
    SEARCH_RADIUS_KM,
    build_hotel_app,
    cell_key,
    distance_km,
    hotel_app,
)
from styx_benchmarks.deathstar.hotel_range import (
    build_hotel_range_app,
    geo_key,
    hotel_range_app,
    search_ranges,
)
from styx_benchmarks.deathstar.hotel_workload import GEO_APPS, HOTEL_MIX, HotelReservation
from styx_benchmarks.deathstar.movie import build_movie_app, movie_app
from styx_benchmarks.deathstar.movie_workload import MovieReview

__all__ = [
    "CELL_COLS",
    "CELL_DEG",
    "CELL_ROWS",
    "GEO_APPS",
    "HOTEL_MIX",
    "LAT_MAX",
    "LAT_MIN",
    "LON_MAX",
    "LON_MIN",
    "SEARCH_RADIUS_KM",
    "HotelReservation",
    "MovieReview",
    "build_hotel_app",
    "build_hotel_range_app",
    "build_movie_app",
    "cell_key",
    "distance_km",
    "geo_key",
    "hotel_app",
    "hotel_range_app",
    "movie_app",
    "search_ranges",
]
