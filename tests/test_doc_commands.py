"""Every shell command in README.md and docs/*.md is checked against the code as written.

The commands are read from the docs' ``sh`` blocks (and the ``$ `` lines of ``console`` blocks), with
continuation lines joined and comments dropped. Each is checked by what it is, and a command of a kind
this module does not know fails the test (so a new kind of command gets a check, or a stated reason
why it cannot run here):

* ``styx …``: the CLI's parser accepts it (every subcommand, flag and choice exists);
* ``curl …``: the gateway has a route for its method and path;
* ``make …``: the Makefile has the target;
* ``python -m M …``: module ``M`` exists and ``--help`` works; pytest's paths, node ids and markers
  exist; ``python -c``: the code compiles and its imports resolve;
* ``spark-submit … SCRIPT ARGS``: the script exists and the audit's parser accepts the arguments;
* ``.venv/bin/TOOL``: the tool is installed next to this interpreter;
* not run here, with the reason: ``docker`` (no Docker on the CI machine; the compose file and the
  service it names are checked), and shell plumbing (``eval``, ``export``, ``set``, variables, the
  ``.env`` loop).

Some also run for real, as written: README's quickstart and HTTP examples in order in
``tests/test_readme.py``, docs/http-api.md's ``$GW`` examples in ``tests/test_console.py``, ``styx
audit --master spark://…`` in ``tests/test_audit_spark.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from styx_client.gateway import Gateway, GatewayConfig
from styx_py.audit.options import add_arguments
from styx_py.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV_BIN = Path(sys.executable).parent
SHELL_PLUMBING = re.compile(r"^(eval |export |set |for |echo |[A-Z_]+=\S*$|\.\s)")
PLACEHOLDER = "…"


def doc_commands() -> list[tuple[str, str]]:
    """``(doc, command)`` for every command line of every doc."""
    out: list[tuple[str, str]] = []
    for doc in DOCS:
        for lang, block in re.findall(r"```(sh|console)\n(.*?)```", doc.read_text(), re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                text = line.strip()
                if lang == "console":
                    if not text.startswith("$ "):
                        continue  # output
                    text = text[2:]
                if not text or text.startswith("#"):
                    continue
                command = re.split(r"\s{2,}#|\s#\s", text, maxsplit=1)[0].strip()
                out.append((str(doc.relative_to(ROOT)), command))
    return out


COMMANDS = doc_commands()


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # VAR=value prefixes
        argv.pop(0)
    return argv


# Shell variables the docs' styx commands use, with the value the docs set (docs/http-api.md: GW=…): the
# parser sees a value, never the variable's name (address options are checked as addresses).
DOC_VARIABLES = {"$GW": "http://127.0.0.1:8080"}


def check_styx(argv: list[str]) -> None:
    argv = [DOC_VARIABLES.get(arg, arg) for arg in argv]
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        raise AssertionError(f"styx's parser refuses {shlex.join(argv)!r} (exit {exc.code})") from exc


def _gateway_routes() -> list[tuple[set[str], re.Pattern[str]]]:
    app = Gateway(GatewayConfig("127.0.0.1:9", port=0)).app
    return [
        (set(getattr(r, "methods", None) or {"GET"}), r.path_regex)
        for r in app.routes
        if hasattr(r, "path_regex")
    ]


ROUTES = _gateway_routes()


def check_curl(argv: list[str]) -> None:
    urls = [a for a in argv[1:] if "/v1/" in a or a.startswith(("http", "$GW", "127."))]
    assert len(urls) == 1, f"one URL expected in {argv}"
    path = "/" + re.sub(r"^(\$GW|https?://[^/]+|127\.0\.0\.1:\d+)/?", "", urls[0]).split("?")[0]
    method = "POST" if {"--json", "-d", "--data"} & set(argv) else "GET"
    assert any(method in methods and regex.match(path) for methods, regex in ROUTES), (
        f"the gateway has no route {method} {path}"
    )


def check_make(argv: list[str]) -> None:
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    for target in (a for a in argv[1:] if "=" not in a):
        assert target in targets, f"no make target {target!r}"


def check_pytest(args: list[str]) -> None:
    markers = set(re.findall(r'^\s*"(\w+)[:"]', (ROOT / "pyproject.toml").read_text(), re.M))
    for i, arg in enumerate(args):
        if arg == "-m":
            for word in re.findall(r"\w+", args[i + 1]):
                assert word in markers | {"not", "and", "or"}, f"no pytest marker {word!r}"
        elif arg.startswith("tests/"):
            file, _, test = arg.partition("::")
            assert (ROOT / file).exists(), f"no {file}"
            name = re.sub(r"\[.*\]$", "", test)
            assert not name or f"def {name}(" in (ROOT / file).read_text(), f"no test {test} in {file}"


def check_python(argv: list[str]) -> None:
    if argv[1] == "-c":
        tree = ast.parse(argv[2])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert importlib.util.find_spec(node.module) is not None, f"no module {node.module}"
        return
    assert argv[1] == "-m", argv
    module = argv[2]
    if module == "pytest":
        check_pytest(argv[3:])
        return
    assert importlib.util.find_spec(module) is not None, f"no module {module}"
    if module.startswith("tests."):
        return  # a test helper with positional arguments (its own tests run it)
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"python -m {module} --help: {done.stderr[-500:]}"


def check_spark_submit(argv: list[str]) -> None:
    script = next(a for a in argv if a.endswith(".py"))
    assert (ROOT / script).exists(), f"no {script}"
    args = argv[argv.index(script) + 1 :]
    if PLACEHOLDER in args or not args:
        return  # "the same arguments as styx audit": checked there
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.parse_args(args)


def check_docker(argv: list[str]) -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    if argv[1:3] == ["compose", "exec"]:
        assert re.search(rf"^  {argv[3]}:", compose, re.M), f"no service {argv[3]} in docker-compose.yml"
        check_styx(argv[4:])
    elif argv[1] == "build":
        assert (ROOT / "Dockerfile").exists()


def check(command: str) -> str:
    """Check ``command``; returns its kind."""
    if SHELL_PLUMBING.match(command):
        return "shell"
    argv = _argv(command)
    tool = argv[0]
    if tool == "styx":
        check_styx(argv)
    elif tool == "curl":
        check_curl(argv)
    elif tool == "make":
        check_make(argv)
    elif tool in ("python", ".venv/bin/python"):
        check_python(argv)
    elif tool == "spark-submit":
        check_spark_submit(argv)
    elif tool == "docker":
        check_docker(argv)
    elif tool.startswith(".venv/bin/"):
        assert (VENV_BIN / Path(tool).name).exists(), f"{tool} is not installed"
    else:
        raise AssertionError(f"a command of an unknown kind: {command!r}; give it a check here")
    return tool


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_the_command_is_what_the_code_accepts(doc: str, command: str) -> None:
    check(command)


def test_the_docs_have_commands_of_every_checked_kind() -> None:
    kinds = {
        check(command) for _, command in COMMANDS if not command.startswith(("python", ".venv/bin/python"))
    }
    assert {"styx", "curl", "make", "spark-submit", "docker", "shell"} <= kinds, kinds
    assert len(COMMANDS) >= 60, len(COMMANDS)  # the extraction found the blocks


def test_the_checks_catch_what_they_are_for() -> None:
    for wrong in (
        "styx invocations list --state aborted",
        "styx audit --masterr spark://x:7077 --out a/",
        "curl -s $GW/v1/invocation/x",
        "curl -s --json '{}' $GW/v1/state/account/alice",
        "make screenshot",
        "python -m styx_benchmarks.nothing",
        ".venv/bin/python -m pytest -q -m 'not servicez'",
        "kubectl apply -f deploy/",
    ):
        with pytest.raises(AssertionError):
            check(wrong)
