"""``HOST:PORT`` addresses, as operators type them and the cluster passes them around (pure).

Every address a process is given (a coordinator's, a worker's, a broker's bootstrap) is split here, so a
malformed one fails at once with one line that names what it is and the form expected, never with a
``ValueError`` from deep inside a connection attempt. The ``*_option`` functions are the same checks as
``argparse`` types: the ``styx`` command refuses a bad address option before it does anything.
"""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Callable

from styx_py.core.errors import ConfigError

__all__ = ["bootstrap", "bootstrap_option", "host_port", "host_port_option", "url_option"]

_EXAMPLE = "for example 127.0.0.1:6000"


def host_port(address: str, what: str = "address") -> tuple[str, int]:
    """``address`` as ``(host, port)``: ``HOST:PORT``, ``[IPV6]:PORT`` or ``:PORT`` (loopback); raises
    :class:`~styx_py.core.errors.ConfigError` naming ``what`` otherwise."""
    host, sep, port = address.strip().rpartition(":")
    bare_ipv6 = ":" in host and not (host.startswith("[") and host.endswith("]"))
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or bare_ipv6:
        raise ConfigError(f"{what} {address!r} is not HOST:PORT ({_EXAMPLE})".lstrip())
    return host.strip("[]") or "127.0.0.1", int(port)


def bootstrap(servers: str, what: str = "Kafka bootstrap") -> list[tuple[str, int]]:
    """A Kafka bootstrap list, ``HOST:PORT[,HOST:PORT…]``, as ``(host, port)`` pairs; a host without a
    port is refused (Kafka clients would guess 9092), as is an empty entry."""
    try:
        return [host_port(entry, "") for entry in servers.split(",")]
    except ConfigError:
        raise ConfigError(
            f"{what} {servers!r} is not HOST:PORT[,HOST:PORT…] (for example 127.0.0.1:9092)".lstrip()
        ) from None


def _checked(check: Callable[[str, str], object], text: str) -> str:
    """``text`` once ``check`` accepts it; its ConfigError as argparse's one-line error."""
    try:
        check(text, "")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def host_port_option(text: str) -> str:
    """``argparse`` type of a ``HOST:PORT`` option: the text, checked by :func:`host_port`."""
    return _checked(host_port, text)


def bootstrap_option(text: str) -> str:
    """``argparse`` type of a Kafka bootstrap option (:func:`bootstrap`)."""
    return _checked(bootstrap, text)


def url_option(text: str) -> str:
    """``argparse`` type of an HTTP URL option (a gateway's): ``http(s)://HOST[:PORT][/PATH]``."""
    try:
        parts = urllib.parse.urlsplit(text)
        good = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number, or out of range
        good = False
    if not good:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// or https:// URL (for example http://127.0.0.1:8080)"
        )
    return text
