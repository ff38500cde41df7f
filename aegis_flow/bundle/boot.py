"""The supervisor bundle's entry point: copied into the ``.pyz`` as its ``__main__.py``.

Standard library only, and it runs before anything of ours can be imported. Side effects: on
first start it extracts the archive's ``payload/``, ``deps/`` and the ``native/`` trees of
the one matching set next to the bundle (or under ``$AEGIS_BUNDLE_CACHE`` / the temp dir)
— into a temporary directory renamed into place, so concurrent starts never see half a tree —
then puts them on ``sys.path``, appends ``payload/`` (our ``aegis_flow`` only, never nats or
native code) to ``PYTHONPATH`` for the processes the supervisor starts, and runs the
supervisor (``check …`` runs ``aegis-flow check …`` instead). ``--bundle-info`` prints
what this interpreter can use, as JSON, and exits.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import zipfile
from typing import Any

PROG = "aegis-supervisor"


def _archive() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    if not zipfile.is_zipfile(here):
        raise SystemExit(f"{PROG}: run the bundle as 'python3 FILE.pyz', not this file")
    return here


def _glibc() -> tuple[int, int] | None:
    name, version = platform.libc_ver()
    if name != "glibc" or not version:
        return None
    major, _, minor = version.partition(".")
    try:
        return (int(major), int(minor.split(".")[0] or 0))
    except ValueError:
        return None


def _python_tag() -> str:
    return f"cp{sys.version_info[0]}{sys.version_info[1]}"


def choose_native(sets: list[dict[str, Any]], *, python_tag: str, machine: str,
                  glibc: tuple[int, int] | None) -> str | None:
    """The name of the first native set this interpreter can load, or None (pure)."""
    for item in sets:
        if item["python"] != python_tag or item["machine"] != machine:
            continue
        if glibc is None or tuple(item["glibc"]) > glibc:
            continue
        return str(item["name"])
    return None


def _base_dir(archive: str, digest: str) -> str:
    candidates = []
    if os.environ.get("AEGIS_BUNDLE_CACHE"):
        candidates.append(os.environ["AEGIS_BUNDLE_CACHE"])
    candidates.append(os.path.join(os.path.dirname(archive), ".aegis-supervisor"))
    candidates.append(os.path.join(tempfile.gettempdir(), f"aegis-supervisor-{os.getuid()}"))
    for base in candidates:
        try:
            os.makedirs(base, exist_ok=True)
        except OSError:
            continue
        if os.access(base, os.W_OK | os.X_OK):
            return os.path.join(base, digest)
    raise SystemExit(f"{PROG}: no writable directory to unpack into (tried "
                     f"{', '.join(candidates)}); set AEGIS_BUNDLE_CACHE")


def _extract(archive: str, target: str, prefixes: tuple[str, ...]) -> None:
    """Unpack the members under ``prefixes`` into ``target`` (atomically, once)."""
    if os.path.isdir(target):
        return
    parent = os.path.dirname(target)
    tmp = tempfile.mkdtemp(prefix=".unpack-", dir=parent)
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if info.filename.startswith(prefixes):
                    zf.extract(info, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isdir(target):  # not a concurrent start that won the race
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def setup() -> tuple[dict[str, Any], str, str | None]:
    """Unpack and wire the paths; return (manifest, root, chosen native set or None)."""
    archive = _archive()
    with zipfile.ZipFile(archive) as zf:
        manifest: dict[str, Any] = json.loads(zf.read("manifest.json"))
    native = choose_native(manifest["native"], python_tag=_python_tag(),
                           machine=platform.machine(), glibc=_glibc())
    root = _base_dir(archive, manifest["digest"])
    os.makedirs(root, exist_ok=True)
    common = os.path.join(root, "common")
    _extract(archive, common, ("payload/", "deps/"))
    paths = [os.path.join(common, "payload"), os.path.join(common, "deps")]
    if native:  # its trees: PyNaCl's (shared by every CPython) and this CPython's cffi
        entry = next(e for e in manifest["native"] if e["name"] == native)
        for d in entry["dirs"]:
            _extract(archive, os.path.join(root, d), (f"native/{d}/",))
            paths.append(os.path.join(root, d, "native", d))
    sys.path[:0] = paths
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH", ""), paths[0]) if p)
    os.environ["AEGIS_BUNDLE"] = archive
    return manifest, root, native


def info(manifest: dict[str, Any], root: str, native: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"bundle": manifest["version"], "digest": manifest["digest"],
           "python": platform.python_version(), "implementation": platform.python_implementation(),
           "machine": platform.machine(), "glibc": ".".join(map(str, _glibc() or ())) or None,
           "unpacked": root, "native_set": native,
           "native_sets": [s["name"] for s in manifest["native"]],
           "supports": manifest["supports"]}
    try:
        import nats  # noqa: F401
        out["nats"] = "ok"
    except ImportError as exc:
        out["nats"] = f"missing: {exc}"
    try:
        import nkeys

        kp = nkeys.from_seed(nkeys.encode_seed(bytes(32), nkeys.PREFIX_BYTE_USER))
        kp.verify(b"nonce", kp.sign(b"nonce"))
        out["nkeys"] = "ok"
    except Exception as exc:  # noqa: BLE001 - report whatever stops credentials from working
        out["nkeys"] = f"unavailable: {type(exc).__name__}: {exc}"
    return out


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 10):  # noqa: UP036 - the user's Python may be anything
        raise SystemExit(f"{PROG}: needs CPython >= 3.10, this is {platform.python_version()}")
    manifest, root, native = setup()
    if argv[:1] == ["--bundle-info"]:
        print(json.dumps(info(manifest, root, native), indent=1))
        return 0
    if argv[:1] == ["check"]:  # the check pods of a workflow run the checks from the bundle
        from aegis_flow.steps.cli import main as check_main

        return check_main(argv)
    from aegis_flow.supervisor.__main__ import main as supervisor_main

    return supervisor_main(argv, prog=PROG)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
