"""The training image's ``train.py`` in rehearsals: this checkout's examples/train_ddp.py.

Before training it appends where it was told to rendezvous to ``/tmp/rendezvous.log`` (the
container's own /tmp), and after ``init_process_group`` returns, that it joined: the B2
rehearsal reads both.
"""

import os
import runpy
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_ddp.py"


def note(text: str) -> None:
    with open("/tmp/rendezvous.log", "a") as f:
        f.write(f"{time.time():.3f} rank {os.environ.get('RANK')} {text}\n")


note(f"MASTER_ADDR={os.environ.get('MASTER_ADDR')} MASTER_PORT={os.environ.get('MASTER_PORT')}")
import torch.distributed as dist  # noqa: E402

_init = dist.init_process_group


def _joined(*args, **kwargs):  # type: ignore[no-untyped-def]
    out = _init(*args, **kwargs)
    note("joined")
    return out


dist.init_process_group = _joined
sys.argv[0] = str(EXAMPLE)
runpy.run_path(str(EXAMPLE), run_name="__main__")
