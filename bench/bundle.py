"""Benchmark: the supervisor bundle's start-up under a clean Python, against the peer — the
installed supervisor (``python -m aegis_flow.supervisor``) in the development venv.

Measures (median of N runs each): the first start of a fresh bundle (it unpacks itself),
a warm start (already unpacked), and the installed supervisor, each up to argparse's ``--help``
(so: interpreter start, unpacking, importing the supervisor); plus build time and sizes.
Side effects: temporary files only. ``python bench/bundle.py [--runs 9]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aegis_flow.bundle.build import build


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--native-wheels", type=Path)
    a = ap.parse_args()
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(root / "clean")],
                       check=True)
        clean = str(root / "clean" / "bin" / "python")
        t0 = time.perf_counter()
        result = build(root / "s.pyz", native_wheels=a.native_wheels)
        build_s = time.perf_counter() - t0
        env = {"PATH": "/usr/bin:/bin"}
        cold, warm = [], []
        for i in range(a.runs):
            cache = root / f"cache{i}"
            e = {**env, "AEGIS_BUNDLE_CACHE": str(cache)}
            cold.append(timed([clean, "-I", str(result.path), "--help"], e))
            warm.append(timed([clean, "-I", str(result.path), "--help"], e))
        peer = [timed([sys.executable, "-m", "aegis_flow.supervisor", "--help"])
                for _ in range(a.runs)]
    med = statistics.median
    print(f"bundle: {result.size / 1024:.0f} KiB, native sets {list(result.native)}, "
          f"built in {build_s:.2f} s")
    print(f"{'start-up to --help':<44} {'median s':>9} {'vs peer':>8}")
    for name, xs in (("bundle, first start (unpacks), clean Python", cold),
                     ("bundle, warm start, clean Python", warm),
                     ("peer: installed supervisor, dev venv", peer)):
        print(f"{name:<44} {med(xs):>9.3f} {med(xs) / med(peer):>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
