"""Completed checkpoints as the supervisor sees them in a directory, with no code change.

The common forms are recognised by what their writer leaves when the save is complete:
``torch.save`` to a temporary name then ``os.replace`` to the final one (a final name matching
the pattern appears only complete), and a torch.distributed.checkpoint directory (complete
once its ``.metadata`` file is written, which DCP does last). Names come from ``--checkpoint-
pattern`` (a glob; ``integrity.candidates`` orders them by the number in the name).

Side effects: :func:`newest_complete` lists a directory and stats its entries. :class:`Watch`
is pure (what was already reported).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from aegis_flow.supervisor.integrity import candidates, checkpoint_number

DCP_METADATA = ".metadata"


def newest_complete(directory: str | os.PathLike[str], pattern: str) -> tuple[int, Path] | None:
    """The newest complete checkpoint with a step number in its name, or None (none yet, or
    the directory cannot be read: a watcher must never stop training)."""
    try:
        found = candidates(directory, pattern)
    except OSError:
        return None
    for path in found:
        number = checkpoint_number(path.name)
        if number is None:
            continue
        try:
            if path.is_dir():
                if not (path / DCP_METADATA).is_file():
                    continue  # a DCP save still being written
            elif path.stat().st_size == 0:
                continue
        except OSError:
            continue
        return number, path
    return None


@dataclass(frozen=True)
class Watch:
    """The last checkpoint step reported; a new one is reported once. Pure."""

    reported: int = -1

    def news(self, found: tuple[int, Path] | None) -> tuple[Watch, tuple[int, Path] | None]:
        """(the watch after ``found``, ``found`` if it is newer than anything reported)."""
        if found is None or found[0] <= self.reported:
            return self, None
        return replace(self, reported=found[0]), found
