"""The programming model: partitioning, Operator and Graph validation, load_graph, load_config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from zlib import crc32

import pytest

from styx_py import Context, Graph, Operator
from styx_py.core.config import Config, load_config
from styx_py.core.errors import ConfigError, GraphError
from styx_py.core.graph import load_graph
from styx_py.core.limits import MAX_PARTITIONS
from styx_py.core.partitioning import key_bytes, partition_of

ROOT = Path(__file__).resolve().parent.parent

# ---- partitioning -------------------------------------------------------------------------------

# Computed once (crc32 of the canonical bytes b"s"+utf8 / b"i"+decimal) and frozen here: a change of
# the hash or of the canonical bytes moves every key of a running cluster to another partition.
FROZEN = [
    ("k1", 8, 5),
    ("k1", 4096, 3405),
    ("alice", 8, 6),
    ("alice", 4096, 1430),
    ("", 8, 3),
    ("", 4096, 3851),
    ("ключ", 8, 5),
    ("ключ", 4096, 717),
    (0, 8, 5),
    (0, 4096, 701),
    (1, 8, 3),
    (1, 4096, 555),
    (-7, 8, 5),
    (-7, 4096, 1629),
    (2**40, 8, 5),
    (2**40, 4096, 1541),
    ("1", 8, 0),
    ("1", 4096, 2288),
]
SAMPLE_KEYS: list[str | int] = ["k1", "alice", "", "ключ", "1", 0, 1, -7, 2**40, "user:42", 123456789]


def canonical(key: str | int) -> bytes:
    """The documented canonical bytes: b"s" + UTF-8 for str, b"i" + decimal digits for int."""
    return b"s" + key.encode() if isinstance(key, str) else b"i" + str(key).encode()


@pytest.mark.parametrize(("key", "n", "expected"), FROZEN)
def test_partition_of_frozen_values(key: str | int, n: int, expected: int) -> None:
    assert partition_of(key, n) == expected
    assert crc32(canonical(key)) % n == expected


def test_partition_of_is_crc32_of_canonical_bytes() -> None:
    for key in SAMPLE_KEYS:
        assert key_bytes(key) == canonical(key)
        for n in (1, 2, 3, 7, 8, 100, MAX_PARTITIONS):
            p = partition_of(key, n)
            assert p == crc32(canonical(key)) % n
            assert 0 <= p < n


def test_partition_of_does_not_depend_on_hash_seed() -> None:
    here = {repr(k): [partition_of(k, n) for n in (3, 8, 4096)] for k in SAMPLE_KEYS}
    code = (
        "import json, sys\n"
        "from styx_py.core.partitioning import partition_of\n"
        f"keys = {SAMPLE_KEYS!r}\n"
        "json.dump({repr(k): [partition_of(k, n) for n in (3, 8, 4096)] for k in keys}, sys.stdout)\n"
    )
    # hash() of str differs between these seeds; partition_of must not.
    hashes = set()
    for seed in ("1", "987654"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code + "print(hash('k1'), file=sys.stderr)\n"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            cwd=ROOT,
            timeout=60,
        )
        assert json.loads(out.stdout) == here
        hashes.add(out.stderr.strip())
    assert len(hashes) == 2, "the two seeds did not change hash(); the check proves nothing"


def test_str_and_int_keys_differ() -> None:
    assert key_bytes("1") != key_bytes(1)
    differ = sum(partition_of(str(i), MAX_PARTITIONS) != partition_of(i, MAX_PARTITIONS) for i in range(100))
    assert differ >= 95


@pytest.mark.parametrize("key", [True, False, 1.0, 1.5, None, b"k1", ("a",), ["a"]])
def test_non_str_int_keys_are_rejected(key: object) -> None:
    with pytest.raises(TypeError, match="str or int"):
        partition_of(key, 8)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        key_bytes(key)  # type: ignore[arg-type]


# ---- Operator -----------------------------------------------------------------------------------


def test_operator_rejects_non_async_function() -> None:
    op = Operator("o")

    def sync_fn(ctx: Context) -> int:
        return 1

    with pytest.raises(GraphError, match="async def"):
        op.function(sync_fn)

    async def agen(ctx: Context):  # type: ignore[no-untyped-def]  # an async generator is not a coroutine function
        yield 1

    with pytest.raises(GraphError, match="async def"):
        op.function(agen)
    assert op.functions == {}


def test_operator_rejects_duplicate_function_names() -> None:
    op = Operator("o")

    @op.function
    async def f(ctx: Context) -> None:
        return None

    async def g(ctx: Context) -> None:
        return None

    with pytest.raises(GraphError, match="registered twice"):
        op.function(f)
    with pytest.raises(GraphError, match=r"o\.f"):
        op.function(name="f")(g)
    op.function(name="g2", read_only=True)(g)
    assert sorted(op.functions) == ["f", "g2"]
    assert op.read_only == {"g2"}


@pytest.mark.parametrize("partitions", [0, -1, MAX_PARTITIONS + 1, 5000, "4", True, 2.0, None])
def test_operator_rejects_bad_partition_counts(partitions: object) -> None:
    with pytest.raises(GraphError, match="partitions"):
        Operator("o", partitions=partitions)  # type: ignore[arg-type]


@pytest.mark.parametrize("partitions", [1, 4, MAX_PARTITIONS])
def test_operator_accepts_good_partition_counts(partitions: int) -> None:
    assert Operator("o", partitions=partitions).partitions == partitions


@pytest.mark.parametrize("name", ["", None, 3])
def test_operator_rejects_bad_names(name: object) -> None:
    with pytest.raises(GraphError):
        Operator(name)  # type: ignore[arg-type]


# ---- Graph --------------------------------------------------------------------------------------

# Module-level operators: functions refer to them by global name, as user modules do.
inside = Operator("inside", partitions=2)
outsider = Operator("outsider", partitions=2)
impostor = Operator("inside", partitions=2)  # same name as `inside`, but another object


@outsider.function
async def out_fn(ctx: Context) -> None:
    return None


@impostor.function
async def impostor_fn(ctx: Context) -> None:
    return None


@inside.function
async def calls_inside(ctx: Context) -> None:
    ctx.call_async(inside, "calls_inside", "k")


def make_op(name: str) -> Operator:
    op = Operator(name)

    async def fn(ctx: Context) -> None:
        return None

    op.function(fn)
    return op


def test_graph_accepts_valid_operators() -> None:
    g = Graph("ok", [inside, make_op("other")])
    assert sorted(g.operators) == ["inside", "other"]
    assert g.function("inside", "calls_inside") is calls_inside
    assert g.function("inside", "nothere") is None
    assert g.function("nothere", "calls_inside") is None
    assert g.n_partitions == 4


def test_graph_rejects_duplicate_operator_names() -> None:
    with pytest.raises(GraphError, match="duplicate operator name 'x'"):
        Graph("g", [make_op("x"), make_op("x")])


def test_graph_rejects_empty_graph() -> None:
    with pytest.raises(GraphError, match="no operators"):
        Graph("g", [])


def test_graph_rejects_operator_without_functions() -> None:
    with pytest.raises(GraphError, match="'bare' has no functions"):
        Graph("g", [make_op("a"), Operator("bare")])


def test_graph_rejects_non_operators_and_bad_names() -> None:
    with pytest.raises(GraphError):
        Graph("g", [make_op("a"), "b"])  # type: ignore[list-item]
    with pytest.raises(GraphError):
        Graph("", [make_op("a")])


def test_graph_rejects_reference_to_operator_outside_the_graph() -> None:
    caller = Operator("caller")

    @caller.function
    async def go(ctx: Context) -> None:
        ctx.call_async(outsider, "out_fn", "k")

    with pytest.raises(GraphError, match=r"caller\.go calls operator 'outsider'.*not part of graph 'g'"):
        Graph("g", [caller])
    # With the callee in the graph it is fine.
    assert Graph("g", [caller, outsider]).operators["outsider"] is outsider


def test_graph_rejects_same_named_impostor() -> None:
    caller = Operator("caller")

    @caller.function
    async def go(ctx: Context) -> None:
        ctx.call_async(impostor, "impostor_fn", "k")

    with pytest.raises(GraphError, match="'inside'"):
        Graph("g", [caller, inside])


INLINE_MODULE = """
from styx_py import Context, Graph, Operator

stranger = Operator("stranger")
home = Operator("home")


@stranger.function
async def s(ctx: Context) -> None:
    return None


@home.function
async def h(ctx: Context) -> None:
    await ctx.call(stranger, "s", ctx.key)


ok = Graph("ok", [home, stranger])
"""


def test_inline_module_reference_check() -> None:
    mod = types.ModuleType("styx_inline_graph_mod")
    exec(compile(INLINE_MODULE, "<inline>", "exec"), mod.__dict__)
    assert isinstance(mod.ok, Graph)
    with pytest.raises(GraphError, match=r"home\.h calls operator 'stranger'"):
        Graph("bad", [mod.home])


# ---- load_graph ---------------------------------------------------------------------------------


def test_load_graph_of_the_oracle_app() -> None:
    g = load_graph("tests.apps.oracle:app")
    assert g.name == "oracle"
    assert sorted(g.operators) == ["acct", "counter", "ledger"]


@pytest.mark.parametrize(
    ("path", "fragments"),
    [
        ("nocolon", ["package.module:graph", "'nocolon'"]),
        (":app", ["package.module:graph"]),
        ("tests.apps.oracle:", ["package.module:graph"]),
        ("missing.module:x", ["cannot import 'missing.module'", "No module named"]),
        ("tests.apps.oracle:nothere", ["tests.apps.oracle", "no attribute 'nothere'"]),
        ("tests.apps.oracle:acct", ["not a styx_py.Graph", "Operator"]),
    ],
)
def test_load_graph_errors_are_graph_errors(path: str, fragments: list[str]) -> None:
    with pytest.raises(GraphError) as info:
        load_graph(path)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_load_graph_propagates_validation_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "styx_bad_graph_mod.py").write_text(
        "from styx_py import Graph, Operator\nbare = Operator('bare')\napp = Graph('g', [bare])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(GraphError, match="'bare' has no functions"):
        load_graph("styx_bad_graph_mod:app")


@pytest.mark.parametrize("case", ["relative", "syntax", "runtime"])
def test_load_graph_wraps_every_import_failure(
    case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "styx_syntax_mod.py").write_text("def broken(:\n")
    (tmp_path / "styx_runtime_mod.py").write_text("raise RuntimeError('import-time failure')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = {"relative": ".oracle:app", "syntax": "styx_syntax_mod:app", "runtime": "styx_runtime_mod:app"}[
        case
    ]
    with pytest.raises(GraphError):
        load_graph(path)


# ---- load_config --------------------------------------------------------------------------------


def test_defaults_without_env() -> None:
    assert load_config({}, env={}) == Config()


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"epoch_size_max": 0}, "epoch_size_max"),
        ({"epoch_size_max": "many"}, "epoch_size_max"),
        ({"epoch_size_max": True}, "epoch_size_max"),
        ({"epoch_interval_ms": -1}, "epoch_interval_ms"),
        ({"heartbeat_interval_ms": 0}, "heartbeat_interval_ms"),
        ({"failure_timeout_ms": 100}, "failure_timeout_ms"),  # not above the heartbeat interval
        ({"max_pending_requests": 10}, "max_pending_requests"),  # below epoch_size_max
        ({"kafka_fetch_wait_ms": 1}, "kafka_fetch_wait_ms"),
        ({"call_graph_caching": "maybe"}, "call_graph_caching"),
        ({"ingress_topic": 5}, "ingress_topic"),
    ],
)
def test_bad_values_name_the_key(overrides: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(overrides, env={})


def test_env_vars_are_read() -> None:
    env = {
        "STYX_EPOCH_SIZE_MAX": "50",
        "STYX_EPOCH_INTERVAL_MS": "2.5",
        "STYX_CALL_GRAPH_CACHING": "false",
        "STYX_INGRESS_TOPIC": "my-in",
        "OTHER_EPOCH_SIZE_MAX": "7",
    }
    cfg = load_config(env=env)
    assert cfg.epoch_size_max == 50
    assert cfg.epoch_interval_ms == 2.5
    assert cfg.call_graph_caching is False
    assert cfg.ingress_topic == "my-in"


def test_os_environ_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STYX_HEARTBEAT_INTERVAL_MS", "150")
    assert load_config().heartbeat_interval_ms == 150
    monkeypatch.setenv("STYX_HEARTBEAT_INTERVAL_MS", "soon")
    with pytest.raises(ConfigError, match="heartbeat_interval_ms"):
        load_config()


def test_overrides_beat_env() -> None:
    cfg = load_config({"epoch_size_max": 9}, env={"STYX_EPOCH_SIZE_MAX": "50"})
    assert cfg.epoch_size_max == 9


def test_bad_env_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match="epoch_size_max"):
        load_config(env={"STYX_EPOCH_SIZE_MAX": "lots"})


def test_unknown_override_key_rejected() -> None:
    with pytest.raises(ConfigError, match="'epoch_sise_max'"):
        load_config({"epoch_sise_max": 5}, env={})


def test_config_is_frozen() -> None:
    cfg = load_config({}, env={})
    with pytest.raises(AttributeError):
        cfg.epoch_size_max = 5  # type: ignore[misc]
