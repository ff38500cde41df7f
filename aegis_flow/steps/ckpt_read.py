"""The two questions the checkpoint integrity gate must ask torch, and nothing else.

Side effects: reading checkpoint files. torch is imported inside each function, when it is
called (the layering rule of ``aegis_flow.steps``: standard library at import time), so that
``aegis_flow.supervisor.integrity`` can import this module and the supervisor's own process stays
free of torch until a checkpoint is actually read.
"""

from __future__ import annotations

import pickle
from pathlib import Path

WEIGHTS_ONLY_REFUSAL = "Weights only load failed"


def load_file(path: Path) -> None:
    """Load a ``torch.save`` file the safe way (``weights_only=True``, on the CPU); raise if not.

    The whole file is read and its tensors are materialised in memory: a multi-gigabyte
    checkpoint costs that much memory for the moment of the check. Nothing is unpickled beyond
    what ``weights_only`` allows (tensors, containers, numbers, strings): a damaged or hostile file
    cannot run code here.
    """
    import torch

    torch.load(path, map_location="cpu", weights_only=True)


def is_weights_only_refusal(exc: BaseException) -> bool:
    """Whether ``torch.load(weights_only=True)`` refused an object it does not allow-list.

    Such a file was parsed up to that object; it is not evidence of damage, only of a checkpoint
    that holds something besides tensors (a custom class, a numpy scalar).
    """
    return isinstance(exc, pickle.UnpicklingError) and WEIGHTS_ONLY_REFUSAL in str(exc)


def dcp_extents(directory: Path) -> dict[str, int]:
    """A torch.distributed.checkpoint directory's storage files and the bytes each must hold.

    Reads ``.metadata`` (raises when it is missing or cannot be parsed) and returns, for every
    ``relative_path`` its ``storage_data`` names, the end of the furthest item stored in it
    (``offset + length``): a shorter file has been cut.
    """
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    metadata = FileSystemReader(str(directory)).read_metadata()
    extents: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = int(info.offset) + int(info.length)
        extents[info.relative_path] = max(end, extents.get(info.relative_path, 0))
    return extents
