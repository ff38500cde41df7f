"""In-memory fakes shared by the master's runtime tests: a NATS connection that records what is
published, and a store that fails on demand. Pure Python, no I/O."""

from __future__ import annotations

from collections.abc import Mapping

from aegis_flow.master.store import MemoryStore


class FakeNats:
    """Stands in for a connected nats-py client: ``publish`` records (subject, bytes)."""

    is_connected = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, data))

    async def flush(self, timeout: float = 1.0) -> None:
        """The server answers the PING unless the test made it unreachable."""
        if not self.is_connected:
            raise TimeoutError("nats: flush timeout")


class FlakyStore(MemoryStore):
    """A MemoryStore whose saves raise while ``down`` (a NATS timeout, a full disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.lands = False  # a failing save is stored anyway (a paused server, resumed)
        self.failed = 0

    async def save(self, raw: bytes, revision: int,
                   workers: Mapping[int, bytes] | None = None) -> int:
        if self.down:
            self.failed += 1
            if self.lands and revision == self.revision:
                await super().save(raw, revision, workers)
            raise TimeoutError("nats: timeout")
        return await super().save(raw, revision, workers)
