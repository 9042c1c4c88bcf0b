"""Consistent state reads in the simulation: a :data:`~styx_py.io.stateread.ReadSource` on the network.

:func:`sim_reads` registers an admin client on the in-memory network and sends each
:class:`~styx_py.core.wire.ReadState` to the coordinator as ``styx state`` or the SDK does over TCP, one
at a time, so the read path (coordinator fan-out, the workers' windows, the merge) runs under the
simulation's virtual time and seeded message order.
"""

from __future__ import annotations

import asyncio
from collections import deque

from styx_py.core.wire import COORDINATOR, AdminReply, Message, ReadState
from styx_py.io.stateread import ReadSource
from styx_py.testing.memory import MemoryNetwork

__all__ = ["sim_reads"]


def sim_reads(network: MemoryNetwork, name: str = "admin-reads") -> ReadSource:
    """A read source that talks to the simulated coordinator as the admin client ``name``."""
    waiting: deque[asyncio.Future[AdminReply]] = deque()
    lock = asyncio.Lock()

    def on_message(src: str, msg: Message) -> None:
        assert isinstance(msg, AdminReply), msg
        if waiting:
            waiting.popleft().set_result(msg)

    network.register(name, on_message, inbox="admin")

    async def send(msg: ReadState) -> AdminReply:
        async with lock:  # one read at a time: each answer belongs to the oldest one waiting
            fut: asyncio.Future[AdminReply] = asyncio.get_running_loop().create_future()
            waiting.append(fut)
            network.send(name, COORDINATOR, msg)
            return await fut

    return send
