"""Regenerate the stubs from ``proto/aegis.proto`` with grpcio-tools (a dev dependency).

Side effects: writes ``aegis_pb2.py``, ``aegis_pb2.pyi`` and ``aegis_pb2_grpc.py`` into ``out``
(default: this package's directory). ``python -m aegis_flow.rpc.generate [OUT]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PROTO = ROOT / "proto" / "aegis.proto"
HERE = Path(__file__).resolve().parent


def generate(out: Path, proto: Path = PROTO) -> list[Path]:
    """Run protoc; the package path ``aegis_flow/rpc`` is mapped onto ``proto/`` so the
    generated gRPC module imports ``aegis_flow.rpc.aegis_pb2``."""
    from grpc_tools import protoc

    tmp = out / "_gen"
    tmp.mkdir(parents=True, exist_ok=True)
    args = ["grpc_tools.protoc", f"-Iaegis_flow/rpc={proto.parent}", f"--python_out={tmp}",
            f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", f"aegis_flow/rpc/{proto.name}"]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    written = []
    for name in ("aegis_pb2.py", "aegis_pb2.pyi", "aegis_pb2_grpc.py"):
        target = out / name
        (tmp / "aegis_flow" / "rpc" / name).replace(target)
        written.append(target)
    for d in sorted(tmp.rglob("*"), reverse=True):
        d.rmdir() if d.is_dir() else d.unlink()
    tmp.rmdir()
    return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(f"wrote {path}")
