"""Fold a healthy rank's collateral traceback into one line.

When one rank dies, its peers' collectives fail too, and each peer prints a long traceback
that ends in a gloo or NCCL network error ("Connection reset by peer ... GLHF!"). That text
is true but misleading: the rank that printed it is healthy, and a reader hunting for the
fault reads it first. :class:`TracebackFolder` holds a traceback back until its exception line
arrives; when that line is a peer failure it prints one line instead, otherwise the whole
block as it was. The supervisor still keeps every line in the rank's tail (what the log
classifier reads); only what is printed is folded, and ``AEGIS_FOLD_TRACEBACKS=0`` prints
them all.

Pure: no I/O. Lines go in without their newline (torch's ``[rankN]:`` prefixes allowed).
"""

from __future__ import annotations

import re

_TORCH_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
_START = "Traceback (most recent call last):"
# A collective failed because a peer went away (gloo, NCCL, the c10d store).
_PEER_GONE = re.compile(
    r"Connection (?:reset|closed) by peer|Broken pipe|remote (?:worker|process)"
    r"|NCCL communicator was aborted|Socket Timeout|DistNetworkError")
_SOURCE = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h):\d+\]\s*")  # gloo's "[.../pair.cc:537] "
_BOILERPLATE = re.compile(r"\.?\s*This is typically caused by.*$")
MAX_HELD = 400  # lines: a traceback longer than this is printed as it is


def _bare(line: str) -> str:
    return _TORCH_PREFIX.sub("", line, count=1)


def peer_failure(exception_line: str) -> str | None:
    """The short form of an exception line that says a peer went away, else None."""
    text = _bare(exception_line).strip()
    if not _PEER_GONE.search(text):
        return None
    kind, sep, message = text.partition(": ")
    message = _BOILERPLATE.sub("", _SOURCE.sub("", message)).strip()
    return f"{kind}: {message}" if sep else text


class TracebackFolder:
    """Feed lines with :meth:`feed`; print what it returns; :meth:`flush` at the end."""

    def __init__(self) -> None:
        self._held: list[str] = []

    def feed(self, line: str) -> list[str]:
        bare = _bare(line)
        if not self._held:
            return [line] if bare.strip() != _START else self._hold(line)
        if bare.startswith((" ", "\t")) or not bare.strip():
            return self._hold(line)  # a frame, its source line, a caret line
        block, self._held = [*self._held, line], []
        short = peer_failure(line)
        if short is None:
            return block
        return [f"this rank stopped because a peer failed ({short}); its {len(block)}-line "
                "traceback is folded (AEGIS_FOLD_TRACEBACKS=0 prints it)"]

    def _hold(self, line: str) -> list[str]:
        self._held.append(line)
        if len(self._held) > MAX_HELD:
            return self.flush()
        return []

    def flush(self) -> list[str]:
        held, self._held = self._held, []
        return held
