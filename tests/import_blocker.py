"""Run Python code in a subprocess where some installed packages cannot be imported: what an install
without them (a plain ``pip install styx-py``, the image) would see.

A finder first on ``sys.meta_path`` refuses the blocked top-level modules; everything else imports as
usual. Modules the interpreter loaded at start-up (``.pth`` hooks) are not affected.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent

BLOCKER = """
import sys as _sys

class _Blocker:
    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"blocked by the test: {name}", name=name)
        return None

_sys.meta_path.insert(0, _Blocker(BLOCKED))
"""


def closure(requirements: list[str]) -> set[str]:
    """The installed distributions ``requirements`` pull in (no extras), by canonical name."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        todo += [Requirement(r) for r in importlib.metadata.requires(name) or []]
    return seen


def blocked_modules(allowed: set[str]) -> list[str]:
    """Top-level modules of installed distributions outside ``allowed`` (canonical names); a module
    shared with an allowed distribution stays importable."""
    blocked = []
    for module, dists in importlib.metadata.packages_distributions().items():
        if module.isidentifier() and not any(canonicalize_name(d) in allowed for d in dists):
            blocked.append(module)
    return sorted(blocked)


def run_blocked(blocked: list[str], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args…`` with ``blocked`` refused; ``sys.argv[1:]`` is ``args``."""
    source = f"BLOCKED = {json.dumps(blocked)}\n{BLOCKER}\n{code}"
    return subprocess.run(
        [sys.executable, "-c", source, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
