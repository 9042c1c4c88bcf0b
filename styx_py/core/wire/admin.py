"""The admin API on the coordinator's port (``styx deploy``, ``styx status``, the SDK, the gateway)."""

from __future__ import annotations

from typing import Any

from styx_py.core.wire.codes import Msg


class DeployRequest(Msg, tag="deploy"):
    import_path: str


class StatusRequest(Msg, tag="status"):
    pass


class AdminReply(Msg, tag="admin"):
    ok: bool
    error: str
    body: dict[str, Any]
