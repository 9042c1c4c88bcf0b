"""The graph versions a worker runs: loaded by import path, prepared for a code update, kept for replay.

Function code reaches a worker by import path, never over the network. The view lists every committed
version; the newest is loaded when a view comes, a new one when a code update prepares it
(:class:`~styx_py.core.wire.PrepareGraph`, whose verdict goes back to the coordinator), and older ones
when a recovery replays epochs that ran them (each epoch replays with its own code). Loaded graphs go
into the epoch machine's ``graphs`` (version -> graph).
"""

from __future__ import annotations

import logging

from styx_py.core.errors import GraphError
from styx_py.core.graph import Graph, GraphVersion, load_graph
from styx_py.core.wire import ClusterView, GraphPrepared, PrepareGraph, SeqLogEntry

__all__ = ["CodeVersions"]

log = logging.getLogger("styx.worker")


class CodeVersions:
    __slots__ = ("graphs", "node_id", "paths")

    def __init__(self, node_id: str, graphs: dict[int, Graph]) -> None:
        self.node_id = node_id
        self.graphs = graphs  # the epoch machine's: version -> graph
        self.paths: dict[int, str] = {}  # version -> import path, of those loaded

    def load(self, version: int, import_path: str) -> None:
        """Load graph ``version`` unless it is loaded already (raises GraphError)."""
        if self.paths.get(version) == import_path:
            return
        self.graphs[version] = load_graph(import_path)
        self.paths[version] = import_path

    def newest(self) -> Graph | None:
        """The newest graph loaded here (None before the first deploy)."""
        return self.graphs[max(self.graphs)] if self.graphs else None

    def follow(self, view: ClusterView) -> None:
        """The newest version ``view`` lists (older ones are loaded by a recovery that replays them)."""
        versions = listed(view)
        if versions:
            self.load(versions[-1].number, versions[-1].import_path)

    def prepare(self, msg: PrepareGraph) -> GraphPrepared:
        """A code update's first phase: load the new version here (this worker's Python path may differ
        from the coordinator's) and say what it declares; it runs only once committed."""
        try:
            self.load(msg.version, msg.import_path)
        except GraphError as exc:
            log.error("%s: cannot prepare graph version %d: %s", self.node_id, msg.version, exc)
            return GraphPrepared(self.node_id, msg.version, False, str(exc), [])
        return GraphPrepared(self.node_id, msg.version, True, "", self.graphs[msg.version].specs())

    def for_replay(self, replay: dict[int, SeqLogEntry], versions: list[GraphVersion]) -> None:
        """Every graph version the epochs to replay ran with, as their log entries say; the import paths
        come from the view's list of ``versions``."""
        paths = {v.number: v.import_path for v in versions}
        for epoch, version in sorted({(e.epoch, e.version or 1) for e in replay.values()}):
            path = paths.get(version)
            if path is None:
                raise GraphError(
                    f"epoch {epoch} ran graph version {version}, which the cluster does not list"
                )
            try:
                self.load(version, path)
            except GraphError as exc:
                raise GraphError(
                    f"replaying epoch {epoch} needs graph version {version} ({path}): {exc}"
                ) from exc


def listed(view: ClusterView) -> list[GraphVersion]:
    """Every committed graph version a view names (a view of one version may name only its path)."""
    return view.versions or ([GraphVersion(1, view.graph_path, 0)] if view.graph_path is not None else [])
