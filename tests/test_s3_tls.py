"""S3 over HTTPS: a real SeaweedFS serving S3 only over TLS (a throwaway CA), reached by the snapshot
store of the processes and by the audit with the CA bundle of ``STYX_S3_CA_FILE``, and refused by a
client that does not trust that CA."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from styx_py.audit.options import S3Options
from styx_py.core.config import load_config
from styx_py.core.errors import BackendError, ConfigError
from styx_py.io.s3 import blob_store_from
from styx_py.stack.seaweed import SeaweedS3
from tests.tls_certs import Authority


def test_a_ca_file_without_https_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"s3_ca_file \(STYX_S3_CA_FILE\).*s3_secure is not"):
        load_config(env={"STYX_S3_CA_FILE": "/ca.pem"})


@pytest.mark.services
def test_snapshots_reach_s3_over_https_with_the_ca_bundle(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca", "s3-ca")
    server = ca.issue("seaweedfs")
    with SeaweedS3(tmp_path / "s3", buckets=["snaps"], tls=(server.cert, server.key, ca.cert)) as s3:
        cfg = s3.config
        assert cfg.secure and cfg.url.startswith("https://")
        env = {
            "STYX_S3_ENDPOINT": cfg.endpoint,
            "STYX_S3_ACCESS_KEY": cfg.access_key,
            "STYX_S3_SECRET_KEY": cfg.secret_key,
            "STYX_S3_SECURE": "true",
            "STYX_SNAPSHOT_BUCKET": "snaps",
        }
        store = blob_store_from(load_config(env={**env, "STYX_S3_CA_FILE": str(ca.cert)}))
        assert store is not None
        asyncio.run(store.put("snapshots/1", b"state"))
        assert asyncio.run(store.get("snapshots/1")) == b"state"
        untrusting = blob_store_from(load_config(env=env))  # the system's CAs: not this one
        assert untrusting is not None
        with pytest.raises(BackendError, match="CERTIFICATE_VERIFY_FAILED"):
            asyncio.run(untrusting.get("snapshots/1"))
        audit = S3Options(
            cfg.endpoint, cfg.access_key, cfg.secret_key, "snaps", secure=True, ca_file=str(ca.cert)
        )
        assert S3Options.parse(audit.as_options()) == audit  # what the audit's Spark tasks get
        assert audit.client().get_object("snaps", "snapshots/1").read() == b"state"
