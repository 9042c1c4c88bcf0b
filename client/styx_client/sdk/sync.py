"""The blocking facade: :class:`SyncStyxClient` drives a :class:`StyxClient` on a private event loop
that runs in a daemon thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

from styx_client.sdk.client import Call, StyxClient
from styx_client.sdk.stats import ClientStats
from styx_py.core.wire import Key, Reply

__all__ = ["SyncStyxClient"]

_T = TypeVar("_T")


class _LoopThread:
    """A private event loop in a daemon thread, so synchronous code can drive the async client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="styx-client-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("SyncStyxClient cannot be used from its own event loop thread")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            # E.g. KeyboardInterrupt while waiting: do not leave the coroutine running behind our back.
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            self.run(_cancel_other_tasks())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        self.loop.close()


async def _cancel_other_tasks() -> None:
    """Cancel what libraries left running so the loop closes without 'Task was destroyed' noise."""
    current = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not current]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others)
    await asyncio.get_running_loop().shutdown_asyncgens()


class SyncStyxClient:
    """Blocking facade of :class:`StyxClient` for scripts, notebooks and threaded servers.

    The async client runs on a private event loop in a daemon thread; every method blocks the calling
    thread only. Safe to call from several threads at once. Do not call it from inside a running
    event loop: it would block that loop (use :class:`StyxClient` there).
    """

    def __init__(self, bootstrap: str, operators: Mapping[str, int], **kw: Any) -> None:
        """Start the client (same arguments as :class:`StyxClient`); returns once it is positioned."""
        self._runner = _LoopThread()
        self._client = StyxClient(bootstrap, operators, **kw)
        try:
            self._runner.run(self._client.start())
        except BaseException:
            self._runner.stop()
            raise

    @classmethod
    def connect(cls, coordinator: str | None = None, **kw: Any) -> SyncStyxClient:
        """Like :meth:`StyxClient.connect` (the same default address): learn the deployment from the
        coordinator, then start."""
        runner = _LoopThread()
        try:
            client = runner.run(StyxClient.connect(coordinator, **kw))
        except BaseException:
            runner.stop()
            raise
        self = cls.__new__(cls)
        self._runner = runner
        self._client = client
        return self

    @property
    def client(self) -> StyxClient:
        """The underlying async client (its methods must run on :attr:`loop`)."""
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._runner.loop

    @property
    def stats(self) -> ClientStats:
        return self._client.stats

    @property
    def pending_count(self) -> int:
        return self._client.pending_count

    @property
    def reply_partition(self) -> int:
        """The egress partition this client reads its replies from (see :class:`StyxClient`)."""
        return self._client.reply_partition

    def _run(self, awaitable: Awaitable[_T]) -> _T:
        async def wrapper() -> _T:
            return await awaitable

        return self._runner.run(wrapper())

    def submit(
        self,
        operator: str,
        key: Key,
        function: str,
        *args: Any,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        """Blocking :meth:`StyxClient.submit`."""
        return self._run(
            self._client.submit(operator, key, function, *args, request_id=request_id, timeout_s=timeout_s)
        )

    def call(
        self,
        operator: str,
        key: Key,
        function: str,
        *args: Any,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Blocking :meth:`StyxClient.call`."""
        return self._run(
            self._client.call(operator, key, function, *args, request_id=request_id, timeout_s=timeout_s)
        )

    def submit_many(self, calls: Iterable[Call], *, concurrency: int = 1000) -> list[Reply]:
        """Blocking :meth:`StyxClient.submit_many`."""
        return self._run(self._client.submit_many(calls, concurrency=concurrency))

    def read(self, operator: str, key: Key, *, as_of_epoch: int | None = None) -> tuple[int, Any]:
        """Blocking :meth:`StyxClient.read <styx_client.sdk.state.ClientState.read>`."""
        return self._run(self._client.read(operator, key, as_of_epoch=as_of_epoch))

    def scan(self, operator: str, **bounds: Any) -> tuple[int, list[tuple[Key, Any]]]:
        """Blocking :meth:`StyxClient.scan <styx_client.sdk.state.ClientState.scan>` (same keywords)."""
        return self._run(self._client.scan(operator, **bounds))

    def close(self) -> None:
        """Close the client and stop its loop thread; safe to call twice."""
        if self._runner.loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> SyncStyxClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
