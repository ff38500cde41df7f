"""``aegis-flow bundle``: build the self-contained supervisor (a zipapp ``.pyz``).

The bundle holds ``payload/aegis_flow`` (the worker side only: supervisor, protocol, outcome,
the core's model/machine, steps, progress), ``deps/`` (nats-py, nkeys and, when installed,
tomli — all pure Python) and ``native/`` trees of PyNaCl and cffi (compiled code; a *set* for
one CPython version, machine and minimum glibc is cffi's tree for that CPython plus the PyNaCl
tree of that machine, which is abi3 and shared by every CPython), plus ``manifest.json`` and
the ``boot.py`` entry point. Only credentials need the native part (nkeys signs the NATS
nonce with PyNaCl); a bundle started by a Python with no matching set runs without NATS
credentials.

The naming and tag logic is pure; side effects: :func:`build` reads the installed files and the
given wheels and writes the archive (deterministic: sorted members, fixed timestamps).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import io
import json
import os
import re
import stat
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent  # the aegis_flow package directory

# the worker side of aegis_flow (DESIGN.md §3); tests/test_bundle.py runs the result
PAYLOAD = ("__init__.py", "outcome.py", "protocol.py", "progress.py", "argtypes.py",
           "settings.py", "vocab.py",
           "master/__init__.py", "master/model.py", "master/machine.py", "master/policy.py",
           "supervisor/", "steps/", "data/causes.toml")
PURE_DEPS = ("nats-py", "nkeys")
OPTIONAL_PURE_DEPS = ("tomli",)  # Python 3.10 reads the cause table with it
NATIVE_DISTS = ("pynacl", "cffi")
FIXED_TIME = (2020, 1, 1, 0, 0, 0)
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


class BundleError(Exception):
    """The bundle cannot be built as asked; the message says what to change."""


@dataclass(frozen=True)
class WheelName:
    """The parts of a wheel file name (PEP 427) that pick where it can run."""

    dist: str
    version: str
    python: tuple[str, ...]
    abi: tuple[str, ...]
    platforms: tuple[str, ...]

    @classmethod
    def parse(cls, filename: str) -> WheelName:
        parts = filename.removesuffix(".whl").split("-")
        if not filename.endswith(".whl") or len(parts) not in (5, 6):
            raise BundleError(f"{filename!r} is not a wheel file name "
                              "(NAME-VERSION-PYTHON-ABI-PLATFORM.whl)")
        return cls(parts[0].lower().replace("_", "-"), parts[1], tuple(parts[-3].split(".")),
                   tuple(parts[-2].split(".")), tuple(parts[-1].split(".")))


def platform_glibc(tag: str) -> tuple[str, tuple[int, int]] | None:
    """``manylinux_2_17_x86_64`` → ("x86_64", (2, 17)); legacy aliases too; else None."""
    m = re.match(r"^manylinux_(\d+)_(\d+)_(.+)$", tag)
    if m:
        return m.group(3), (int(m.group(1)), int(m.group(2)))
    m = re.match(r"^(manylinux1|manylinux2010|manylinux2014)_(.+)$", tag)
    if m:
        return m.group(2), _LEGACY[m.group(1)]
    return None


def _lowest_glibc(platforms: Iterable[str]) -> tuple[str, tuple[int, int]] | None:
    found = [g for g in (platform_glibc(p) for p in platforms) if g]
    return min(found, key=lambda g: g[1]) if found else None


@dataclass(frozen=True)
class NativeSet:
    """PyNaCl + cffi for one CPython version, machine and minimum glibc."""

    python: str  # cp311
    machine: str  # x86_64
    glibc: tuple[int, int]
    dirs: tuple[str, ...] = ()  # under native/: PyNaCl's (shared by every CPython), cffi's

    @property
    def name(self) -> str:
        return f"{self.python}-{self.machine}-glibc{self.glibc[0]}.{self.glibc[1]}"

    def manifest(self) -> dict[str, object]:
        return {"name": self.name, "python": self.python, "machine": self.machine,
                "glibc": list(self.glibc), "dirs": list(self.dirs)}


def nacl_dir(machine: str, glibc: tuple[int, int]) -> str:
    """PyNaCl is abi3: one tree per machine and glibc floor serves every CPython."""
    return f"nacl-{machine}-glibc{glibc[0]}.{glibc[1]}"


def cffi_dir(python: str, machine: str, glibc: tuple[int, int]) -> str:
    return f"cffi-{python}-{machine}-glibc{glibc[0]}.{glibc[1]}"


def pair_wheels(names: Iterable[WheelName]) -> list[tuple[NativeSet, WheelName, WheelName]]:
    """Match each cffi wheel (per CPython) with a PyNaCl abi3 wheel for the same machine.

    The set needs the newer of the two glibc floors; of several PyNaCl wheels the one with the
    lowest floor is used. musllinux and other non-glibc wheels are not paired.
    """
    nacl: dict[str, tuple[tuple[int, int], WheelName]] = {}
    cffis: list[tuple[str, str, tuple[int, int], WheelName]] = []
    for w in names:
        g = _lowest_glibc(w.platforms)
        if g is None:
            continue
        if w.dist == "pynacl" and "abi3" in w.abi:
            if g[0] not in nacl or g[1] < nacl[g[0]][0]:
                nacl[g[0]] = (g[1], w)
        elif w.dist == "cffi":
            cffis += [(py, g[0], g[1], w) for py in w.python if py.startswith("cp")]
    out = []
    for py, machine, floor, cw in sorted(cffis, key=lambda t: (t[0], t[1])):
        if machine in nacl:
            nfloor, nw = nacl[machine]
            dirs = (nacl_dir(machine, nfloor), cffi_dir(py, machine, floor))
            out.append((NativeSet(py, machine, max(floor, nfloor), dirs), nw, cw))
    return out


# -- effects: collect files, write the archive ----------------------------------------------

def _payload_files() -> Iterator[tuple[str, bytes]]:
    for entry in PAYLOAD:
        path = PKG / entry
        files = sorted(path.rglob("*")) if entry.endswith("/") else [path]
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts and f.suffix in (".py", ".toml"):
                yield f"payload/aegis_flow/{f.relative_to(PKG).as_posix()}", f.read_bytes()


def _dist_files(dist: str, prefix: str) -> Iterator[tuple[str, bytes]]:
    d = md.distribution(dist)
    for rel in d.files or ():
        name = str(rel)
        if (name.startswith("..") or ".dist-info/" in name or "__pycache__" in name
                or name.endswith((".pyc", ".h", ".c"))):
            continue
        yield f"{prefix}/{Path(name).as_posix()}", Path(str(d.locate_file(rel))).read_bytes()


def _wheel_files(path: Path, prefix: str) -> Iterator[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            name = info.filename
            if info.is_dir() or ".dist-info/" in name or ".data/" in name or name.endswith(
                    (".h", ".c")):
                continue
            yield f"{prefix}/{name}", zf.read(info)


def _env_native_set() -> NativeSet | None:
    """The set of this very interpreter, from the installed wheels' tags; None if absent."""
    floors: list[tuple[str, tuple[int, int]]] = []
    for dist in NATIVE_DISTS:
        try:
            wheel = md.distribution(dist).read_text("WHEEL") or ""
        except md.PackageNotFoundError:
            return None
        tags = [t.split("-")[-1] for t in re.findall(r"^Tag: (\S+)", wheel, re.M)]
        g = _lowest_glibc(tags)
        if g is None:
            return None
        floors.append(g)
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    (machine, nacl_floor), (_, cffi_floor) = floors  # NATIVE_DISTS order: pynacl, cffi
    return NativeSet(py, machine, max(nacl_floor, cffi_floor),
                     (nacl_dir(machine, nacl_floor), cffi_dir(py, machine, cffi_floor)))


@dataclass(frozen=True)
class BuildResult:
    path: Path
    size: int
    native: tuple[str, ...]
    supports: dict[str, object]


def build(out: Path, *, native_wheels: Path | None = None, native_from_env: bool = True
          ) -> BuildResult:
    """Write the bundle to ``out``; return what went in."""
    members: dict[str, bytes] = dict(_payload_files())
    for dist in PURE_DEPS:
        try:
            members.update(_dist_files(dist, "deps"))
        except md.PackageNotFoundError:
            raise BundleError(f"{dist} is not installed here: pip install {dist}") from None
    tomli = False
    for dist in OPTIONAL_PURE_DEPS:
        try:
            members.update(_dist_files(dist, "deps"))
            tomli = True
        except md.PackageNotFoundError:
            pass
    sets: dict[str, NativeSet] = {}
    if native_wheels is not None:
        if not native_wheels.is_dir():
            raise BundleError(f"--native-wheels {native_wheels}: not a directory of wheels")
        wheels = {WheelName.parse(p.name): p for p in sorted(native_wheels.glob("*.whl"))}
        for w, p in wheels.items():  # pure wheels there (e.g. tomli for Python 3.10): deps/
            if w.dist in OPTIONAL_PURE_DEPS and w.abi == ("none",) and w.platforms == ("any",):
                members.update(_wheel_files(p, "deps"))
                tomli = True
        pairs = pair_wheels(wheels)
        if not pairs:
            raise BundleError(f"--native-wheels {native_wheels}: no PyNaCl abi3 + cffi "
                              "manylinux wheels that pair up (pip download --only-binary=:all: "
                              "--python-version 3.X --platform manylinux2014_x86_64 pynacl cffi)")
        for ns, nacl_w, cffi_w in pairs:
            sets[ns.name] = ns
            for w, d in zip((nacl_w, cffi_w), ns.dirs, strict=True):
                members.update(_wheel_files(wheels[w], f"native/{d}"))
    env_set = _env_native_set() if native_from_env else None
    if env_set is not None and not any(
            (s.python, s.machine) == (env_set.python, env_set.machine) for s in sets.values()):
        sets[env_set.name] = env_set
        for dist, d in zip(NATIVE_DISTS, env_set.dirs, strict=True):
            members.update(_dist_files(dist, f"native/{d}"))
    boot = (PKG / "bundle" / "boot.py").read_bytes()
    digest = hashlib.sha256()
    for name in sorted(members):
        digest.update(name.encode() + b"\0" + members[name])
    digest.update(boot)
    version = _version()
    ordered = sorted(sets.values(), key=lambda s: (s.python, s.machine, s.glibc))
    supports: dict[str, object] = {
        "python": "CPython >= 3.10" if tomli else "CPython >= 3.11 (3.10 needs tomli in the "
                  "build environment)",
        "os": "Linux (the supervisor uses prctl and process groups)",
        "credentials": [s.name for s in ordered] or "none: no native set, NATS without auth",
    }
    manifest = {"version": version, "digest": digest.hexdigest()[:16],
                "native": [s.manifest() for s in ordered], "supports": supports}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in [("__main__.py", boot),
                           ("manifest.json", json.dumps(manifest, indent=1).encode()),
                           *sorted(members.items())]:
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(b"#!/usr/bin/env python3\n" + buf.getvalue())
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(tmp, out)
    return BuildResult(out, out.stat().st_size, tuple(s.name for s in ordered), supports)


def _version() -> str:
    try:
        return md.version("aegis-flow")
    except md.PackageNotFoundError:  # pragma: no cover - running from a plain checkout
        return "0+unknown"
