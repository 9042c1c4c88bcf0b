"""``HOST:PORT`` addresses, as operators type them and the cluster passes them around (pure).

Every address a process is given (a coordinator's, a worker's, a broker's bootstrap) is split here, so a
malformed one fails at once with one line that names what it is and the form expected, never with a
``ValueError`` from deep inside a connection attempt.
"""

from __future__ import annotations

from styx_py.core.errors import ConfigError

__all__ = ["host_port"]


def host_port(address: str, what: str = "address") -> tuple[str, int]:
    """``address`` as ``(host, port)``: ``HOST:PORT``, ``[IPV6]:PORT`` or ``:PORT`` (loopback); raises
    :class:`~styx_py.core.errors.ConfigError` naming ``what`` otherwise."""
    host, sep, port = address.strip().rpartition(":")
    bare_ipv6 = ":" in host and not (host.startswith("[") and host.endswith("]"))
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or bare_ipv6:
        raise ConfigError(f"{what} {address!r} is not HOST:PORT (for example 127.0.0.1:6000)")
    return host.strip("[]") or "127.0.0.1", int(port)
