"""Ports on 127.0.0.1 for the local services: free ones, and the stable ones ``styx up`` asks for."""

from __future__ import annotations

import random
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from styx_py.stack.errors import ServiceError

__all__ = ["DEFAULT_PORTS", "GRPC_OFFSET", "StackPorts", "can_bind", "free_port", "preferred_port"]


@dataclass(frozen=True, slots=True)
class StackPorts:
    """Ports a local stack asks for (0: any free one). A port that is taken falls back to a free one.

    ``metrics`` is the coordinator's Prometheus port; worker ``wN`` asks for ``metrics + N``."""

    coordinator: int = 0
    gateway: int = 0
    kafka: int = 0
    s3: int = 0  # SeaweedFS also needs s3 + 10000 (its gRPC port)
    metrics: int = 0


# `styx up`: the coordinator and gateway ports of the README and the Kubernetes/Compose files, Kafka's
# and SeaweedFS's usual ports, the metrics port of the Compose/Kubernetes files.
DEFAULT_PORTS = StackPorts(coordinator=6000, gateway=8080, kafka=9092, s3=8333, metrics=9400)

# gRPC ports of SeaweedFS are always HTTP port + 10000.
GRPC_OFFSET = 10000

_port_lock = threading.Lock()
# Ports handed out by this process recently. Binding-then-closing a probe socket does not
# reserve a port, so without this two services started back to back could be given the
# same port before either has bound it.
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports.

    We pick listening ports *below* it so that an outgoing connection made between picking
    a port and the service binding it cannot take the port.
    """
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def can_bind(port: int, *, reuse_addr: bool = False) -> bool:
    """Whether 127.0.0.1:port can be bound now.

    ``reuse_addr`` mirrors what Go and Rust servers do (SO_REUSEADDR): a port held only by
    TIME_WAIT connections of a previous run counts as free, one with a listener does not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse_addr:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, also_plus_10000: bool = False) -> int:
    """Return a TCP port on 127.0.0.1 that is free now (and not handed out before).

    With ``also_plus_10000`` the port P+10000 is free too: SeaweedFS listens for gRPC on
    HTTP port + 10000. Ports come from below the kernel's ephemeral range (so client
    sockets cannot grab them in the meantime); if that range is unusual we fall back to
    letting the kernel choose.
    """
    eph_low, _ = _ephemeral_range()
    offset = GRPC_OFFSET if also_plus_10000 else 0
    low = 15000
    high = eph_low - 1 - offset
    with _port_lock:
        if high - low > 1000:
            for _ in range(500):
                port = random.randint(low, high)
                wanted = (port, port + offset) if offset else (port,)
                if any(p in _handed_out for p in wanted):
                    continue
                if all(can_bind(p) for p in wanted):
                    _handed_out.update(wanted)
                    return port
        for _ in range(500):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            wanted = (port, port + offset) if offset else (port,)
            if max(wanted) > 65535 or any(p in _handed_out for p in wanted):
                continue
            if all(can_bind(p) for p in wanted):
                _handed_out.update(wanted)
                return port
    raise ServiceError("could not find a free TCP port on 127.0.0.1")


def preferred_port(port: int | None, *, also_plus_10000: bool = False) -> tuple[int, bool]:
    """``port`` when it (and P+10000 with ``also_plus_10000``) can be bound now, else a free one.

    Returns ``(port, fell_back)``. ``None`` or 0 asks for a free port (not a fallback). The check
    uses SO_REUSEADDR like the servers themselves: a port held only by TIME_WAIT connections of a
    previous run is still the stable one, a port with a listener is taken.
    """
    if not port:
        return free_port(also_plus_10000=also_plus_10000), False
    wanted = (port, port + GRPC_OFFSET) if also_plus_10000 else (port,)
    with _port_lock:
        if not any(p in _handed_out for p in wanted) and all(can_bind(p, reuse_addr=True) for p in wanted):
            _handed_out.update(wanted)
            return port, False
    return free_port(also_plus_10000=also_plus_10000), True
