"""Throwaway certificate authorities and certificates for the TLS tests, made with the ``openssl`` command
(EC P-256, valid for a day). Every certificate issued names the cluster (:data:`SERVER_NAME`) and
127.0.0.1."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_NAME = "styx-cluster.test"
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


@dataclass(frozen=True)
class Identity:
    cert: Path
    key: Path
    ca: Path  # the CA this identity trusts

    def env(self, server_name: str = SERVER_NAME) -> dict[str, str]:
        """The ``STYX_TLS_*`` variables of a process with this identity."""
        return {
            "STYX_TLS_CERT_FILE": str(self.cert),
            "STYX_TLS_KEY_FILE": str(self.key),
            "STYX_TLS_CA_FILE": str(self.ca),
            "STYX_TLS_SERVER_NAME": server_name,
        }


class Authority:
    """A CA in ``directory``; :meth:`issue` signs a certificate for ``SERVER_NAME``."""

    def __init__(self, directory: Path, name: str) -> None:
        if shutil.which("openssl") is None:
            pytest.skip("the TLS tests make their certificates with the openssl command, which is missing")
        self.dir = directory
        self.name = name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert, self.key = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        _openssl(
            "req", "-x509", *_EC, "-days", "1", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", self.key, "-out", self.cert, cwd=self.dir,
        )  # fmt: skip

    def issue(self, who: str, server_name: str = SERVER_NAME) -> Identity:
        cert, key, csr = (self.dir / f"{who}.{ext}" for ext in ("pem", "key", "csr"))
        ext = self.dir / f"{who}.ext"
        ext.write_text(
            f"subjectAltName=DNS:{server_name},IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n"
        )
        _openssl("req", *_EC, "-subj", f"/CN={who}", "-keyout", key, "-out", csr, cwd=self.dir)
        _openssl(
            "x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key, "-CAcreateserial",
            "-days", "1", "-extfile", ext, "-out", cert, cwd=self.dir,
        )  # fmt: skip
        return Identity(cert, key, self.cert)
