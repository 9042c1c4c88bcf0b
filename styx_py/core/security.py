"""What secures the connections beyond the cluster secret, as checked values (no file is opened here):

- :class:`TlsFiles`: mutual TLS on the internal ports (coordinator, workers, and the admin clients,
  SDK and gateway that dial them): this process's certificate and key, and the CA both sides verify the
  other's certificate against. The contexts are built in :mod:`styx_py.io.tls`.
- :class:`KafkaSecurity`: how every Kafka client (SDK, gateway, workers, coordinator, audit) reaches
  the broker: ``PLAINTEXT`` (the default), ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``, with a CA, a
  client certificate and SASL credentials. The aiokafka arguments are built in :mod:`styx_py.io.tls`.

Both come from the configuration (:meth:`styx_py.core.config.Config.internal_tls`,
:meth:`~styx_py.core.config.Config.kafka_security`) or, in client processes that have no configuration,
from the same ``STYX_*`` environment variables (:func:`tls_from_env`, :meth:`KafkaSecurity.from_env`).
A half-given set (a certificate without its key, SASL without a password, a CA with ``PLAINTEXT``)
is a :class:`~styx_py.core.errors.ConfigError` naming the variable, never a silent plain connection.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from styx_py.core.errors import ConfigError

__all__ = [
    "KAFKA_PROTOCOLS",
    "PLAINTEXT",
    "SASL_MECHANISMS",
    "KafkaSecurity",
    "TlsFiles",
    "is_placeholder",
    "tls_files",
    "tls_from_env",
]

KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of one process's TLS identity on the internal ports, and the cluster's CA."""

    cert_file: str
    key_file: str
    ca_file: str
    server_name: str = ""  # a name every node's certificate carries, checked by dialers ("": not checked)


def tls_files(cert_file: str, key_file: str, ca_file: str, server_name: str = "") -> TlsFiles | None:
    """The TLS files when all three are given, None when none is (plain TCP); else a ConfigError."""
    given = {"STYX_TLS_CERT_FILE": cert_file, "STYX_TLS_KEY_FILE": key_file, "STYX_TLS_CA_FILE": ca_file}
    if not any(given.values()):
        if server_name:
            raise ConfigError("STYX_TLS_SERVER_NAME is set but TLS is not (STYX_TLS_CERT_FILE, …)")
        return None
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise ConfigError(
            f"TLS on the internal ports needs a certificate, its key and the CA: {', '.join(missing)} "
            "not set (set all three, or none for plain TCP)"
        )
    return TlsFiles(cert_file, key_file, ca_file, server_name)


def tls_from_env(env: Mapping[str, str] | None = None) -> TlsFiles | None:
    """A client's TLS files from ``STYX_TLS_*`` (read when it connects, as the cluster secret is)."""
    env = os.environ if env is None else env
    return tls_files(
        env.get("STYX_TLS_CERT_FILE", ""),
        env.get("STYX_TLS_KEY_FILE", ""),
        env.get("STYX_TLS_CA_FILE", ""),
        env.get("STYX_TLS_SERVER_NAME", ""),
    )


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """How a Kafka client authenticates and encrypts; field ``f`` is setting ``kafka_<f>``
    (``STYX_KAFKA_<F>``)."""

    security_protocol: str = "PLAINTEXT"
    ssl_ca_file: str = ""  # empty with SSL: the system's CAs
    ssl_cert_file: str = ""  # client certificate (with ssl_key_file), for brokers that require one
    ssl_key_file: str = ""
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = ""

    def __post_init__(self) -> None:
        protocol = self.security_protocol.upper()
        object.__setattr__(self, "security_protocol", protocol)
        object.__setattr__(self, "sasl_mechanism", self.sasl_mechanism.upper())
        if protocol not in KAFKA_PROTOCOLS:
            raise self._error(
                "security_protocol", f"{protocol!r}: must be one of {', '.join(KAFKA_PROTOCOLS)}"
            )
        if not self.uses_ssl:
            for name in ("ssl_ca_file", "ssl_cert_file", "ssl_key_file"):
                if getattr(self, name):
                    raise self._error(name, f"is set but the security protocol is {protocol} (no TLS)")
        if bool(self.ssl_cert_file) != bool(self.ssl_key_file):
            raise self._error(
                "ssl_cert_file" if not self.ssl_cert_file else "ssl_key_file",
                "a client certificate needs both its certificate and its key file",
            )
        if self.uses_sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise self._error(
                    "sasl_mechanism",
                    f"{self.sasl_mechanism!r}: {protocol} needs one of {', '.join(SASL_MECHANISMS)}",
                )
            for name in ("sasl_username", "sasl_password"):
                if not getattr(self, name):
                    raise self._error(name, f"is required with {protocol}")
        else:
            for name in ("sasl_mechanism", "sasl_username", "sasl_password"):
                if getattr(self, name):
                    raise self._error(name, f"is set but the security protocol is {protocol} (no SASL)")

    @staticmethod
    def _error(name: str, why: str) -> ConfigError:
        return ConfigError(f"invalid value for kafka_{name} (STYX_KAFKA_{name.upper()}): {why}")

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KafkaSecurity:
        """From ``STYX_KAFKA_*`` (clients that have no :class:`~styx_py.core.config.Config`)."""
        env = os.environ if env is None else env
        given = {f.name: env.get(f"STYX_KAFKA_{f.name.upper()}", "") for f in fields(cls)}
        return cls(**{name: value for name, value in given.items() if value})

    # The audit hands these to its Spark tasks as data-source options (strings; Spark redacts values
    # whose key names a password in its UI and logs).
    def as_options(self) -> dict[str, str]:
        return {f"kafka.{name}": value for name, value in asdict(self).items() if value}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSecurity:
        names = {f.name for f in fields(cls)}
        return cls(**{k[6:]: v for k, v in options.items() if k.startswith("kafka.") and k[6:] in names})


PLAINTEXT = KafkaSecurity()  # the default: no TLS, no SASL


# Values that stand for a secret someone was meant to fill in: in a manifest or the environment, they
# would let anyone who read the example in. Matched case-insensitively, anywhere in the value.
_PLACEHOLDER = re.compile(
    r"change[-_ ]?me|replace[-_ ]?me|placeholder|fill[-_ ]?me|your[-_ ]?(secret|password|token|key)"
    r"|^(password|secret|token|example|xxx+|\.\.\.|…)$|<[^>]*>|\$\{[^}]*\}",
    re.IGNORECASE,
)


def is_placeholder(value: str) -> bool:
    """Whether ``value`` (a secret) is a known placeholder (``change-me``, ``<token>``, …), never a
    real secret: the processes and the gateway refuse to start with one, and the deploy checks reject
    manifests that carry one."""
    return bool(value) and bool(_PLACEHOLDER.search(value))
