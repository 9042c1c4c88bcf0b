"""The deployments' security, checked offline: no secret value is committed (the validator rejects a
Secret or a generator literal in the manifests, and any placeholder value with a clear word; the
processes refuse placeholders too), the Kubernetes secrets are generated and git-ignored, every styx
process mounts the TLS files its settings name, and the NetworkPolicies let the components talk to
each other, clients reach the gateway, and nothing else in (evaluated with the NetworkPolicy rules)."""

from __future__ import annotations

import base64
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from styx_client.gateway import GatewayConfig
from styx_py.core.config import load_config
from styx_py.core.errors import ConfigError
from styx_py.core.security import is_placeholder
from tests.test_deploy import (
    K8S,
    ROOT,
    _containers,
    _interpolate,
    compose_raw,
    env_of,
    generated_secrets,
    k8s,
    k8s_docs,
    styx_services,
)

# What deploy/k8s/secret.yaml shipped before the secrets were generated: it applied as it was.
PLACEHOLDER_SECRET = """
apiVersion: v1
kind: Secret
metadata:
  name: styx-secrets
type: Opaque
stringData:
  STYX_S3_ACCESS_KEY: "change-me"
  STYX_S3_SECRET_KEY: "change-me"
  STYX_GATEWAY_TOKEN: "change-me"
  STYX_CLUSTER_SECRET: "change-me-to-a-long-random-secret"
"""


def kustomization() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return doc


# ---- the validator ----------------------------------------------------------------------------------------


def secret_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Why ``docs`` (manifests and kustomizations) must not be applied as they are: a secret value
    written in them (a placeholder named as such), or a generator reading a file that git tracks."""
    problems = []

    def check(where: str, key: str, value: str) -> None:
        if is_placeholder(value):
            problems.append(f"{where}: {key} is a placeholder ({value!r}): generate it (make-secrets.sh)")
        else:
            problems.append(f"{where}: {key} is a secret written in the manifests: generate it instead")

    for doc in docs:
        name = f"{doc.get('kind')} {doc.get('metadata', {}).get('name', '')}".strip()
        if doc.get("kind") == "Secret":
            for key, value in (doc.get("stringData") or {}).items():
                check(name, key, str(value))
            for key, value in (doc.get("data") or {}).items():
                check(name, key, base64.b64decode(value).decode(errors="replace"))
        for generator in doc.get("secretGenerator") or []:
            where = f"secretGenerator {generator['name']}"
            for literal in generator.get("literals") or []:
                key, _, value = literal.partition("=")
                check(where, key, value)
            sources = [
                *(generator.get("envs") or []),
                *(f.rpartition("=")[2] for f in generator.get("files") or []),
            ]
            for source in sources:
                path = K8S / source
                tracked = subprocess.run(
                    ["git", "ls-files", "--error-unmatch", str(path)],
                    cwd=ROOT,
                    capture_output=True,
                    check=False,
                )
                ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT, check=False)
                if tracked.returncode == 0 or ignored.returncode != 0:
                    problems.append(f"{where}: {source} would be committed: it must stay git-ignored")
    return problems


def test_the_validator_rejects_the_placeholder_secret() -> None:
    problems = secret_problems([yaml.safe_load(PLACEHOLDER_SECRET)])
    assert len(problems) == 4 and all("is a placeholder" in p for p in problems), problems
    assert "STYX_CLUSTER_SECRET is a placeholder ('change-me-to-a-long-random-secret')" in problems[3]
    literal = {"secretGenerator": [{"name": "s", "literals": ["STYX_GATEWAY_TOKEN=<your-token>"]}]}
    (problem,) = secret_problems([literal])
    assert problem.startswith("secretGenerator s: STYX_GATEWAY_TOKEN is a placeholder ('<your-token>')")
    real = base64.b64encode(b"3f9a8b7c6d5e4f3a2b1c").decode()
    (written,) = secret_problems([{"kind": "Secret", "metadata": {"name": "x"}, "data": {"K": real}}])
    assert "written in the manifests" in written


def test_the_manifests_carry_no_secret_and_generate_them() -> None:
    assert secret_problems([*k8s_docs(), kustomization()]) == []
    assert not [d for d in k8s_docs() if d["kind"] == "Secret"]
    generators = {g["name"]: g for g in kustomization()["secretGenerator"]}
    assert set(generators) == {"styx-secrets", "styx-tls"}
    secrets = generated_secrets()
    assert not [k for k, v in secrets.items() if is_placeholder(v)]
    assert len(secrets["STYX_CLUSTER_SECRET"]) >= 32 and len(secrets["STYX_GATEWAY_TOKEN"]) >= 32


def test_the_processes_refuse_placeholder_secrets() -> None:
    for name, value in yaml.safe_load(PLACEHOLDER_SECRET)["stringData"].items():
        with pytest.raises(ConfigError, match=f"{name}\\): \\(hidden\\): a placeholder") as bad:
            load_config(env={name: value})
        assert value not in str(bad.value)
    with pytest.raises(ConfigError, match="placeholder"):
        GatewayConfig("127.0.0.1:6000", host="0.0.0.0", token="change-me-change-me-change-me")


# ---- TLS files --------------------------------------------------------------------------------------------


def test_every_styx_process_mounts_the_tls_files_its_settings_name() -> None:
    config = k8s("ConfigMap", "styx-config")["data"]
    files = {config[f"STYX_TLS_{k}_FILE"] for k in ("CERT", "KEY", "CA")}
    (directory,) = {str(PurePosixPath(f).parent) for f in files}
    generated = {f.partition("=")[0] for g in kustomization()["secretGenerator"] for f in g.get("files", [])}
    assert {PurePosixPath(f).name for f in files} == generated
    assert config["STYX_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL" and config["STYX_S3_SECURE"] == "true"
    assert "STYX_KAFKA_SASL_PASSWORD" in generated_secrets()
    load_config(env={**config, **generated_secrets()})  # the settings hang together
    pods = [d for d in k8s_docs() if d["kind"] in ("Deployment", "StatefulSet")]
    assert len(pods) == 3
    for doc in pods:
        spec = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        (container,) = _containers(doc)
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
        secret = volumes[mount["name"]]["secret"]
        assert secret["secretName"] == "styx-tls" and mount["readOnly"]
        assert secret["defaultMode"] & 0o007 == 0 and spec["securityContext"]["fsGroup"] == 10001


def test_make_certs_makes_a_ca_and_a_certificate_it_signed(tmp_path: Path) -> None:
    subprocess.run(
        ["sh", str(ROOT / "deploy" / "make-certs.sh"), str(tmp_path)], check=True, capture_output=True
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]  # no CA key left
    verify = ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt")]
    assert subprocess.run(verify, capture_output=True, text=True, check=True).stdout.strip().endswith("OK")
    text = subprocess.run(
        ["openssl", "x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "DNS:" + k8s("ConfigMap", "styx-config")["data"]["STYX_TLS_SERVER_NAME"] in text


# ---- NetworkPolicy ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    labels: dict[str, str]
    namespace: str = "styx"
    namespace_labels: dict[str, str] = field(default_factory=dict)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not (selector.get("matchLabels") or {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def ingress_allowed(policies: list[dict[str, Any]], src: Pod, dst: Pod, port: str) -> bool:
    """Whether ``src`` may open a connection to ``dst``'s named ``port`` (policies of the styx namespace)."""
    selecting = [
        p
        for p in policies
        if "Ingress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], dst.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            if rule.get("ports") and port not in [p["port"] for p in rule["ports"]]:
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                if "ipBlock" in peer:
                    continue  # addresses outside the cluster: no pod here is one
                namespaces = peer.get("namespaceSelector")
                in_namespace = (
                    src.namespace == dst.namespace
                    if namespaces is None
                    else _selects(namespaces, src.namespace_labels)
                )
                pods = peer.get("podSelector")
                if in_namespace and (pods is None or _selects(pods, src.labels)):
                    return True
    return False


def role(name: str) -> Pod:
    return Pod({"app.kubernetes.io/name": f"styx-{name}"})


COORDINATOR, WORKER, GATEWAY = role("coordinator"), role("worker"), role("gateway")
CLIENT = Pod({"styx-py/client": "true"})
STRANGER = Pod({"app": "something-else"})
ELSEWHERE = Pod({"styx-py/client": "true"}, namespace="other", namespace_labels={"name": "other"})
PROMETHEUS = Pod({"app.kubernetes.io/name": "prometheus"}, "monitoring", {"name": "monitoring"})


@pytest.mark.parametrize(
    ("src", "dst", "port", "allowed"),
    [
        (WORKER, COORDINATOR, "cluster", True),
        (GATEWAY, COORDINATOR, "cluster", True),
        (CLIENT, COORDINATOR, "cluster", True),
        (STRANGER, COORDINATOR, "cluster", False),
        (ELSEWHERE, COORDINATOR, "cluster", False),
        (PROMETHEUS, COORDINATOR, "cluster", False),
        (WORKER, WORKER, "peer", True),
        (COORDINATOR, WORKER, "peer", True),
        (GATEWAY, WORKER, "peer", True),
        (CLIENT, WORKER, "peer", True),
        (STRANGER, WORKER, "peer", False),
        (ELSEWHERE, WORKER, "peer", False),
        (STRANGER, GATEWAY, "http", True),
        (ELSEWHERE, GATEWAY, "http", True),
        (PROMETHEUS, COORDINATOR, "metrics", True),
        (PROMETHEUS, WORKER, "metrics", True),
        (STRANGER, WORKER, "metrics", False),
        (WORKER, GATEWAY, "metrics", False),
        (STRANGER, STRANGER, "http", False),  # every other pod of the namespace: denied by default
    ],
)
def test_network_policies_let_only_the_components_talk(src: Pod, dst: Pod, port: str, allowed: bool) -> None:
    policies = [d for d in k8s_docs() if d["kind"] == "NetworkPolicy"]
    assert ingress_allowed(policies, src, dst, port) is allowed


def test_every_port_a_policy_names_is_a_container_port() -> None:
    pods = [d for d in k8s_docs() if d["kind"] in ("Deployment", "StatefulSet")]
    for policy in (d for d in k8s_docs() if d["kind"] == "NetworkPolicy"):
        targets = [
            d
            for d in pods
            if _selects(policy["spec"]["podSelector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        assert targets, f"NetworkPolicy {policy['metadata']['name']} selects no pod"
        names = {p["name"] for d in targets for c in _containers(d) for p in c["ports"]}
        for rule in policy["spec"].get("ingress") or []:
            for port in rule.get("ports") or []:
                assert port["port"] in names, f"{policy['metadata']['name']}: no port {port['port']}"


def test_compose_processes_mount_the_certificates_tls_init_makes() -> None:
    compose = _interpolate(compose_raw())
    services = compose["services"]
    init = services["tls-init"]
    assert init["entrypoint"] == ["sh", "/make-certs.sh"] and init["restart"] == "no"
    (script,) = [v for v in init["volumes"] if v.endswith(":/make-certs.sh:ro")]
    assert (ROOT / script.split(":")[0]).is_file()
    (out,) = init["command"]
    (written,) = [v.split(":")[0] for v in init["volumes"] if v.split(":")[1] == out]
    assert services["coordinator"]["depends_on"]["tls-init"]["condition"] == "service_completed_successfully"
    for name, service in styx_services(compose).items():
        env = env_of(service)
        files = {env[f"STYX_TLS_{k}_FILE"] for k in ("CERT", "KEY", "CA")}
        assert {str(PurePosixPath(f).parent) for f in files} == {out}, name
        assert {PurePosixPath(f).name for f in files} == {"ca.crt", "tls.crt", "tls.key"}
        assert f"{written}:{out}:ro" in service["volumes"], name
        assert env["STYX_TLS_SERVER_NAME"] == env_of(init)["SERVER_NAME"], name
