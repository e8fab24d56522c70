"""Loopback: the one place a free local port is picked, and the loopback interface named.

Pure ``socket``: imported on the parent side (the weight-transfer path picks the trainer's
port) and in the engine's processes alike.
"""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct ports free on loopback now.

    Every socket is held until all ``n`` ports are picked, so the kernel never hands out the
    same one twice; all are closed before returning. Another process can still take a port
    before the caller binds it: a picked port is a likely-free one, never a reservation.
    """
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One port free on loopback now (see ``free_ports``)."""
    return free_ports(1)[0]


def interface() -> str:
    """Name of the loopback interface (``lo`` on Linux)."""
    for _, name in socket.if_nameindex():
        if name == "lo" or name.startswith("lo"):
            return name
    return "lo"
