"""The admin API on the coordinator's port (``styx deploy``, ``styx status``, the SDK, the gateway)."""

from __future__ import annotations

from typing import Any

from styx_py.core.wire.codes import Msg


class DeployRequest(Msg, tag="deploy"):
    import_path: str


class StatusRequest(Msg, tag="status"):
    pass


class ScaleRequest(Msg, tag="scale"):
    """``styx scale``: run on ``workers`` workers. Fewer: the highest-named workers are drained (their
    partitions move, then they are told to stop). More: the cluster waits for that many to register
    (whoever starts processes — ``styx up``, a StatefulSet — starts them)."""

    workers: int


class DrainRequest(Msg, tag="drain"):
    """Move every partition off ``node_id`` and tell it to stop (it exits 0)."""

    node_id: str


class AdminReply(Msg, tag="admin"):
    ok: bool
    error: str
    body: dict[str, Any]
