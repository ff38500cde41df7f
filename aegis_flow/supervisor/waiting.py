"""A bounded wait that never swallows the caller's cancellation.

``asyncio.wait_for`` on Python <= 3.11 returns the inner result, or raises the inner exception,
when the awaited operation finishes at the same moment the waiting task is cancelled. A caller
that catches that exception (``except OSError`` around a refused connect) or simply gets the
result then carries on although it was cancelled. ``wait_or_cancel`` always raises
``CancelledError`` when the caller was cancelled.

Side effects: none beyond the awaited operation, which it cancels on timeout or cancellation.
Standard library only (the supervisor runs inside the user's image).
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
