"""Kafka security settings: checked once (a half-given set is a named error, never a silent plain
connection), turned into aiokafka arguments in one place, and handed to every Kafka client of the
product: the workers' ingress and egress, the coordinator's topic admin and log reader, the SDK (and so
the gateway), the audit's planner and Spark tasks."""

from __future__ import annotations

import ast
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from styx_client.sdk.config import client_config
from styx_client.sdk.kafka import _consumer, _producer
from styx_client.sdk.kafka_transport import _Settings
from styx_py.audit.kafka_source import StyxKafkaSource
from styx_py.audit.kafka_source import _consumer as audit_consumer
from styx_py.audit.options import config_from
from styx_py.cli import build_parser
from styx_py.core.config import SETTINGS, load_config
from styx_py.core.errors import ConfigError
from styx_py.core.security import PLAINTEXT, KafkaSecurity
from styx_py.io.kafka_admin import TopicAdmin
from styx_py.io.tls import kafka_options
from styx_worker.egress import KafkaSink
from styx_worker.ingress import KafkaIngress
from tests.tls_certs import Authority

ROOT = Path(__file__).resolve().parents[1]
KAFKA_CLIENTS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority(tmp_path_factory.mktemp("kafka-ca"), "kafka-ca")


def sasl_ssl_env(ca: Authority) -> dict[str, str]:
    client = ca.issue("kafka-client")
    return {
        "STYX_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "STYX_KAFKA_SSL_CA_FILE": str(ca.cert),
        "STYX_KAFKA_SSL_CERT_FILE": str(client.cert),
        "STYX_KAFKA_SSL_KEY_FILE": str(client.key),
        "STYX_KAFKA_SASL_MECHANISM": "scram-sha-512",
        "STYX_KAFKA_SASL_USERNAME": "styx",
        "STYX_KAFKA_SASL_PASSWORD": "kafka-password-0123",
    }


def secured(client: Any) -> tuple[str, bool, str | None, str | None]:
    """What an aiokafka client was told: protocol, TLS context, SASL mechanism and user."""
    inner = getattr(client, "_client", None) or client.client
    return (
        inner._security_protocol,
        isinstance(inner._ssl_context, ssl.SSLContext),
        inner._sasl_mechanism,
        inner._sasl_plain_username,
    )


EXPECTED = ("SASL_SSL", True, "SCRAM-SHA-512", "styx")


def test_half_given_kafka_security_is_a_named_error() -> None:
    cases = {
        "kafka_security_protocol (STYX_KAFKA_SECURITY_PROTOCOL)": {"STYX_KAFKA_SECURITY_PROTOCOL": "TLS"},
        "kafka_ssl_ca_file (STYX_KAFKA_SSL_CA_FILE): is set but the security protocol is PLAINTEXT": {
            "STYX_KAFKA_SSL_CA_FILE": "/ca.pem"
        },
        "kafka_ssl_key_file (STYX_KAFKA_SSL_KEY_FILE)": {
            "STYX_KAFKA_SECURITY_PROTOCOL": "SSL",
            "STYX_KAFKA_SSL_CERT_FILE": "/c.pem",
        },
        "kafka_sasl_mechanism (STYX_KAFKA_SASL_MECHANISM)": {"STYX_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"},
        "kafka_sasl_password (STYX_KAFKA_SASL_PASSWORD): is required with SASL_PLAINTEXT": {
            "STYX_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "STYX_KAFKA_SASL_MECHANISM": "PLAIN",
            "STYX_KAFKA_SASL_USERNAME": "u",
        },
        "kafka_sasl_username (STYX_KAFKA_SASL_USERNAME): is set but the security protocol is SSL": {
            "STYX_KAFKA_SECURITY_PROTOCOL": "SSL",
            "STYX_KAFKA_SASL_USERNAME": "u",
        },
    }
    for message, env in cases.items():
        with pytest.raises(ConfigError) as bad:
            load_config(env=env)
        assert message in str(bad.value), (env, str(bad.value))
        with pytest.raises(ConfigError):
            KafkaSecurity.from_env(env)  # the same check for clients without a Config
    assert load_config(env={}).kafka_security() == PLAINTEXT == KafkaSecurity.from_env({})
    assert kafka_options(PLAINTEXT) == {"security_protocol": "PLAINTEXT"}


def test_the_password_is_never_shown(ca: Authority) -> None:
    env = sasl_ssl_env(ca)
    with pytest.raises(ConfigError) as bad:
        load_config(env={**env, "STYX_KAFKA_SECURITY_PROTOCOL": "SSL"})
    assert "kafka-password-0123" not in str(bad.value) and "kafka_sasl_mechanism" in str(bad.value)
    (password,) = [s for s in SETTINGS if s.name == "kafka_sasl_password"]
    assert password.meta.secret  # never printed: the docs table shows no default, `styx env` hides it


async def test_options_reach_every_kind_of_aiokafka_client(ca: Authority) -> None:
    security = KafkaSecurity.from_env(sasl_ssl_env(ca))
    options = kafka_options(security)
    assert options["ssl_context"].verify_mode is ssl.CERT_REQUIRED
    assert options["ssl_context"].check_hostname  # the broker's name is checked against its certificate
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", **options)
    assert secured(consumer) == EXPECTED
    admin = TopicAdmin("127.0.0.1:1", security=security)
    assert kafka_options(admin.security).keys() == options.keys()
    with pytest.raises(ConfigError, match="STYX_KAFKA_SSL_"):
        kafka_options(KafkaSecurity("SSL", ssl_ca_file="/nowhere/ca.pem"))


async def test_the_cluster_and_its_clients_take_them_from_the_environment(
    ca: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = sasl_ssl_env(ca)
    config = load_config(env=env)
    ingress, sink = KafkaIngress("127.0.0.1:1", config), KafkaSink("127.0.0.1:1", config)
    assert secured(ingress.consumer) == secured(sink.producer) == EXPECTED
    for name, value in env.items():  # the SDK (and the gateway through it) and the audit read these
        monkeypatch.setenv(name, value)
    settings = _Settings(client_config("127.0.0.1:1"), {"account": 4})
    assert secured(_producer(settings, "c1")) == secured(_consumer(settings, "c1")) == EXPECTED
    args = build_parser().parse_args(["audit", "--kafka", "127.0.0.1:1", "--out", "/tmp/unused"])
    audit = config_from(args)
    assert audit.kafka_security == config.kafka_security()
    # The audit's Spark tasks get them as data-source options.
    options = audit.kafka_security.as_options()
    assert KafkaSecurity.from_options({"bootstrap": "x", **options}) == audit.kafka_security
    assert secured(audit_consumer("127.0.0.1:1", KafkaSecurity.from_options(options))) == EXPECTED
    assert StyxKafkaSource.name() == "styx_kafka"


def _kafka_constructions(path: Path) -> list[tuple[int, bool]]:
    """(line, passes ``**kafka_options(...)``) of each aiokafka client built in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in KAFKA_CLIENTS:
            spread = [k.value for k in node.keywords if k.arg is None]
            found.append(
                (
                    node.lineno,
                    any(
                        isinstance(v, ast.Call) and getattr(v.func, "id", "") == "kafka_options"
                        for v in spread
                    ),
                )
            )
    return found


def test_every_kafka_client_of_the_product_is_built_with_the_security_options() -> None:
    packages = ["styx_py", "worker", "coordinator", "client"]
    built = {
        f"{path.relative_to(ROOT)}:{line}": ok
        for package in packages
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, ok in _kafka_constructions(path)
    }
    assert len(built) >= 8, built  # workers (2), coordinator (3), SDK (2), audit (1)
    assert [where for where, ok in built.items() if not ok] == []
