"""A bounded wait that never swallows the caller's cancellation.

``asyncio.wait_for`` on Python <= 3.11 returns the inner result, or raises the inner exception,
when the awaited operation finishes at the same moment the waiting task is cancelled. A caller
that catches that exception (``except OSError`` around a refused connect) or simply gets the
result then carries on although it was cancelled. ``wait_or_cancel`` always raises
``CancelledError`` when the caller was cancelled.

``close_within`` drains and closes a nats-py connection within a bound that holds when the
server does not answer (``wait_for(nc.drain(), 2)`` took 12 s then: see its docstring).

Side effects: none beyond the awaited operation, which it cancels on timeout or cancellation
(``close_within``: the connection it is given is closed). Standard library only (the supervisor
runs inside the user's image; the connection is duck-typed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_or_cancel(aw: Awaitable[T], timeout: float | None) -> T:
    """Await ``aw`` for at most ``timeout`` seconds (None: no limit).

    Returns its result or raises its exception. On timeout, ``aw`` is cancelled, awaited, and
    ``asyncio.TimeoutError`` is raised. When the caller is cancelled, ``aw`` is cancelled and
    ``CancelledError`` is raised, even if ``aw`` had just finished (its outcome is dropped).
    """
    inner = asyncio.ensure_future(aw)
    inner.add_done_callback(_retrieve)
    try:
        done, _ = await asyncio.wait({inner}, timeout=timeout)
    except asyncio.CancelledError:
        inner.cancel()
        raise
    if not done:
        inner.cancel()
        await asyncio.wait({inner})  # nothing of it runs on after we return (bpo-32751)
        if inner.cancelled():
            raise asyncio.TimeoutError
    return inner.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a dropped outcome's exception as seen (no 'never retrieved' warning)."""
    if not task.cancelled():
        task.exception()


async def close_within(nc: Any, timeout: float) -> None:
    """Drain the nats-py connection ``nc`` and close it, all within about ``timeout`` seconds.

    nats-py's ``drain`` swallows a cancellation and then flushes for up to 10 s more (its
    default flush timeout) before it closes, so ``wait_for(nc.drain(), 2)`` took 12 s whenever
    the server did not answer (a master's or a worker's exit, each time). Here: a server that
    does not answer a flush within half the time is not drained at all; a drain still running
    at the deadline is cancelled until it stops (each cancellation ends one of its waits); then
    the connection is closed, which waits on no answer from the server. Never raises."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        await wait_or_cancel(nc.flush(timeout=max(0.1, timeout / 2)), timeout)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - no answer, closed, reconnecting: nothing to drain
        pass
    else:
        drain = asyncio.ensure_future(nc.drain())
        drain.add_done_callback(_retrieve)
        done, _ = await asyncio.wait({drain}, timeout=max(0.0, deadline - loop.time()))
        while not done:
            drain.cancel()
            done, _ = await asyncio.wait({drain}, timeout=0.1)
    if not nc.is_closed:
        close = asyncio.ensure_future(nc.close())
        close.add_done_callback(_retrieve)
        done, _ = await asyncio.wait({close}, timeout=max(0.5, deadline - loop.time()))
        if not done:
            close.cancel()
