"""Loopback names: what a gateway without authentication binds to and answers for."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also bracketed, or IPv4-mapped) and `localhost` (`*.localhost`)."""
    name = host.strip().strip("[]").lower().removesuffix(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def host_header_is_loopback(value: str) -> bool:
    """Whether an HTTP `Host` header (`name`, `name:port`, `[v6]:port`) names loopback."""
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not _is_port(rest)):
            return False
    else:
        name, colon, port = value.rpartition(":")
        if not colon:
            name = value
        elif not port.isascii() or not port.isdigit():
            return False
        if ":" in name:  # an unbracketed IPv6 address is not a valid Host
            return False
    return bool(name) and is_loopback(name)


def _is_port(rest: str) -> bool:
    return rest.startswith(":") and rest[1:].isascii() and rest[1:].isdigit()
