"""Finding nondeterminism in user functions before it breaks a replay (best effort, from their source).

Recovery replays logged epochs and must get exactly what the original run got; a function that
draws from the global ``random``, reads the clock, makes a uuid or hashes a string with the
per-process salted ``hash()`` gives other values on replay, and the cluster then stops (a replay
divergence is terminal). :func:`nondeterminism_warnings` reads each function's source at deploy time
and names the lines that call such things, with the deterministic replacement. It cannot see
everything (a helper in another module, a value passed in); the replay check stays the safety net.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Iterator
from typing import Any

from styx_py.core.graph import Graph

__all__ = ["nondeterminism_warnings"]

# Module -> (attributes that are not reproducible, or None for every attribute; the replacement).
_MODULES: dict[str, tuple[frozenset[str] | None, str]] = {
    "random": (None, "ctx.random()"),
    "secrets": (None, "ctx.random() or ctx.uuid()"),
    "uuid": (frozenset({"uuid1", "uuid4"}), "ctx.uuid()"),
    "time": (
        frozenset({"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "localtime", "ctime"}),
        "ctx.now()",
    ),
    "os": (frozenset({"urandom", "getrandom", "getpid"}), "ctx.random()"),
    "datetime": (frozenset({"now", "utcnow", "today"}), "ctx.now()"),
}
_BUILTINS = {"hash": "a stable hash (hashlib, zlib.crc32): hash() of a str is salted per process"}


def nondeterminism_warnings(graph: Graph) -> list[str]:
    """One line per suspicious call: ``file:line: operator.function calls X(): ... use Y``."""
    out: list[str] = []
    for op in graph.operators.values():
        for name, fn in sorted(op.functions.items()):
            for lineno, call, advice in _suspicious_calls(fn):
                where = f"{inspect.getsourcefile(fn) or '?'}:{lineno}"
                out.append(
                    f"{where}: {op.name}.{name} calls {call}(), which a replay does not reproduce; {advice}"
                )
    return out


def _suspicious_calls(fn: Any) -> Iterator[tuple[int, str, str]]:
    try:
        lines, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return  # no source to read (a builtin, a lambda in a REPL): nothing to say
    env: dict[str, Any] = getattr(fn, "__globals__", {})
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found = _classify(node.func, env)
            if found is not None:
                yield node.lineno + first - 1, *found


def _classify(func: ast.expr, env: dict[str, Any]) -> tuple[str, str] | None:
    chain = _dotted(func)
    if chain is None:
        return None
    head, *rest = chain
    if not rest:
        if head in _BUILTINS and head not in env:
            return head, f"use {_BUILTINS[head]}"
        target = env.get(head)  # ``from random import random``
        module = getattr(target, "__module__", None) if callable(target) else None
        if module is not None and not isinstance(target, type):
            return _check(module.split(".")[0], getattr(target, "__name__", head), head)
        return None
    root = env.get(head)
    module_name = root.__name__ if isinstance(root, types.ModuleType) else None
    if module_name is None and isinstance(root, type):  # ``from datetime import datetime``
        module_name = root.__module__
    if module_name is None:
        return None
    return _check(module_name.split(".")[0], rest[-1], ".".join(chain))


def _check(module: str, attribute: str, shown: str) -> tuple[str, str] | None:
    rule = _MODULES.get(module)
    if rule is None:
        return None
    names, replacement = rule
    if names is not None and attribute not in names:
        return None
    return shown, f"use {replacement}"


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything that is not a plain dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]
