"""Real fault injection for tests and the demo: ``crash:rank=1:after=5s``, ``exit:rank=0:code=3``.

``crash`` SIGKILLs the rank's training process ``after`` seconds into its run; ``die`` SIGKILLs the
rank's *supervisor* when it receives ``order=NAME`` (once per job: a marker file in the work dir
remembers it), which makes the worker Lost and replaced; ``checkfail`` makes the rank's checks
for ``order=bootcheck|troubleshoot`` fail once with ``fault=hardware|container``; ``exit`` makes the
training process itself call ``os._exit(code)`` after that delay (a ``sitecustomize`` put on the
child's PYTHONPATH starts the timer, so it works for any Python command). ``epoch=N`` selects the
run epoch (AEGIS_RESTART_COUNT) it applies to (default 0, the first run); ``epoch=all`` applies to
every epoch. Every injection that fires leaves a marker file in the work dir
(:func:`fired_marker`), so ``aegis-flow run`` can warn about one that never did. Side effects:
``kill_later`` sends a signal and writes that marker; ``fires`` creates it; ``prepare_env`` only
builds a dict.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from typing import Protocol

_SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")


class _Killable(Protocol):
    @property
    def running(self) -> bool: ...

    def signal_group(self, sig: int) -> None: ...


class InjectionError(ValueError):
    pass


def fired_marker(work_dir: str, index: int) -> str:
    """The file that says the ``index``-th ``--inject`` fired (also its once-only guard)."""
    return os.path.join(os.path.abspath(work_dir), f".aegis-inject-{index}.fired")


def _touch(path: str) -> None:
    try:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    except OSError:
        pass  # a marker is a courtesy: never fail a fault for it


def _seconds(text: str) -> float:
    value = text[:-1] if text.endswith("s") else text
    try:
        seconds = float(value)
    except ValueError:
        raise InjectionError(f"after={text!r} is not a duration like 5s or 0.5") from None
    if seconds < 0:
        raise InjectionError(f"after={text!r} must not be negative")
    return seconds


@dataclass(frozen=True)
class Injection:
    kind: str  # crash | exit
    rank: int
    after: float = 0.0
    code: int = 1
    epoch: int | None = 0  # None: every epoch
    order: str = "run"  # die/checkfail: the order it applies to
    fault: str = "hardware"  # checkfail: the diagnosis reported

    @classmethod
    def parse(cls, spec: str) -> Injection:
        """Parse ``KIND:key=value:...``; raises InjectionError naming the bad part."""
        kind, _, rest = spec.partition(":")
        if kind not in ("crash", "exit", "die", "checkfail"):
            raise InjectionError(f"{spec!r}: the kind must be 'crash', 'exit', 'die' or "
                                 f"'checkfail', not {kind!r}")
        fields: dict[str, str] = {}
        for part in filter(None, rest.split(":")):
            key, eq, value = part.partition("=")
            if not eq or key not in ("rank", "after", "code", "epoch", "order", "fault"):
                raise InjectionError(f"{spec!r}: unknown part {part!r} (expected rank=N, "
                                     "after=5s, code=N, epoch=N|all, order=NAME, fault=F)")
            fields[key] = value
        if "rank" not in fields:
            raise InjectionError(f"{spec!r}: rank=N is required")
        try:
            rank = int(fields["rank"])
            code = int(fields.get("code", "1"))
            # die/checkfail fire once per job, at the first matching order: any epoch unless
            # one is named (a troubleshoot order never belongs to epoch 0)
            default = "all" if kind in ("die", "checkfail") else "0"
            raw_epoch = fields.get("epoch", default)
            epoch = None if raw_epoch == "all" else int(raw_epoch)
        except ValueError:
            raise InjectionError(f"{spec!r}: rank, code and epoch must be whole numbers") from None
        if rank < 0 or not 0 <= code <= 255:
            raise InjectionError(f"{spec!r}: rank must be >= 0 and code within 0..255")
        fault = fields.get("fault", "hardware")
        if fault not in ("hardware", "container", "transient", "slow"):
            raise InjectionError(f"{spec!r}: fault must be hardware, container, transient or "
                                 "slow")
        order = fields.get("order", "troubleshoot" if kind == "checkfail" else "run")
        return cls(kind, rank, _seconds(fields.get("after", "0")), code, epoch, order, fault)

    def describe_unfired(self) -> str:
        """Why an injection may never have fired, for the end-of-run warning."""
        if self.kind in ("crash", "exit"):
            runs = "any run" if self.epoch is None else f"run {self.epoch}"
            return (f"rank {self.rank}'s command never ran {self.after:g} s in {runs} "
                    "(it ended or was stopped sooner, or the rank does not exist)")
        return f"rank {self.rank} never got a {self.order} order"

    def applies(self, rank: int, epoch: int) -> bool:
        return self.rank == rank and (self.epoch is None or self.epoch == epoch)

    def fires(self, kind: str, rank: int, epoch: int, order: str, work_dir: str,
              index: int) -> bool:
        """For ``die``/``checkfail``: True, once per job, when this order triggers it."""
        if self.kind != kind or order != self.order or not self.applies(rank, epoch):
            return False
        try:
            os.close(os.open(fired_marker(work_dir, index), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def prepare_env(self, env: dict[str, str], marker: str = "") -> dict[str, str]:
        """The command's environment for an ``exit`` fault (the process exits by itself and
        creates ``marker`` first)."""
        if self.kind != "exit":
            return env
        env = dict(env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_SITE_DIR, env.get("PYTHONPATH")]))
        env["AEGIS_INJECT_EXIT"] = f"{self.code}:{self.after}"
        if marker:
            env["AEGIS_INJECT_MARKER"] = marker
        return env

    async def kill_later(self, child: _Killable, marker: str = "") -> None:
        if self.kind != "crash":
            return
        await asyncio.sleep(self.after)
        if child.running:
            child.signal_group(signal.SIGKILL)
            if marker:
                _touch(marker)
            import sys
            import time

            sys.stderr.write(f"[aegis-flow inject] AEGIS_KILLED rank {self.rank} "
                             f"at {time.time():.6f}\n")
            sys.stderr.flush()
