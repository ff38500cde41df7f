"""The training image's ``train.py`` in rehearsals: this checkout's examples/train_ddp.py.

Before training it appends where it was told to rendezvous to ``/tmp/rendezvous.log`` (the
container's own /tmp), and after ``init_process_group`` returns, that it joined: the B2
rehearsal reads both.

``$FAULT=KIND:RANK:SECONDS`` makes rank RANK fail SECONDS after it joined (the scenarios of
tests/test_argo_scenarios.py): ``crash`` once per container (an in-place restart does not
crash again), ``crash-always`` every time, ``xid`` in the pod's first container only
(``$AEGIS_POD_RETRY`` 0), printing the driver's "GPU has fallen off the bus" line first, as
a node whose GPU is lost would. ``slow:RANK:MS`` makes every forward of rank RANK's model
MS milliseconds longer (a throttled node: a sleep inside the module's forward, where the
pre-warmed interpreter times forwards), in the pod's first container only: the pod Argo
recreates on another node after the eviction trains at full speed.
"""

import os
import runpy
import sys
import threading
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_ddp.py"


def note(text: str) -> None:
    with open("/tmp/rendezvous.log", "a") as f:
        f.write(f"{time.time():.3f} rank {os.environ.get('RANK')} {text}\n")


note(f"MASTER_ADDR={os.environ.get('MASTER_ADDR')} MASTER_PORT={os.environ.get('MASTER_PORT')}")
import torch.distributed as dist  # noqa: E402

_init = dist.init_process_group


def _fail(kind: str) -> None:
    if kind == "xid":
        print("NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.",
              file=sys.stderr, flush=True)
    else:
        print(f"rank {os.environ.get('RANK')}: injected crash", file=sys.stderr, flush=True)
    note(f"fault {kind}")
    os._exit(1)


def _slow(delay: float) -> None:
    """Every forward of the model (train_ddp's nn.Sequential, inside DDP's) sleeps ``delay``."""
    from torch import nn
    from torch.nn.modules.module import register_module_forward_pre_hook

    def throttled(module: nn.Module, _args: object) -> None:
        if isinstance(module, nn.Sequential):
            time.sleep(delay)

    register_module_forward_pre_hook(throttled)
    note(f"fault slow {delay * 1000:.0f} ms per forward")


def _arm() -> None:
    spec = os.environ.get("FAULT", "")
    if not spec:
        return
    kind, rank, seconds = spec.split(":")
    if os.environ.get("RANK") != rank:
        return
    if kind == "slow":
        if os.environ.get("AEGIS_POD_RETRY", "0") == "0":
            _slow(float(seconds) / 1000.0)
        return
    marker = Path("/tmp/fault-fired")
    if kind == "crash" and marker.exists():
        return
    if kind == "xid" and os.environ.get("AEGIS_POD_RETRY", "0") != "0":
        return
    marker.write_text(kind)
    timer = threading.Timer(float(seconds), _fail, args=(kind,))
    timer.daemon = True
    timer.start()


def _joined(*args, **kwargs):  # type: ignore[no-untyped-def]
    out = _init(*args, **kwargs)
    note("joined")
    _arm()
    return out


dist.init_process_group = _joined
sys.argv[0] = str(EXAMPLE)
runpy.run_path(str(EXAMPLE), run_name="__main__")
