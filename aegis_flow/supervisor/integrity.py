"""Checkpoint integrity gate: verify the checkpoint a resume will load; move a damaged one aside.

Three layers, from the inside out:

* :func:`record` (at save time, from a training script) writes a manifest beside a checkpoint:
  the size and sha256 of a single file (``X.aegis-sha256.json``) or of every file of a
  torch.distributed.checkpoint (DCP) directory (``<dir>/.aegis-manifest.json``).
* :func:`verify` says whether one checkpoint is complete and readable and matches its manifest;
  :func:`candidates` lists a directory's checkpoints, newest first.
* :func:`gate` walks the candidates newest first, renames each damaged one aside
  (``<name>.damaged-<UTC time>``: never deleted), chooses the first good one and points the
  symlink ``<dir>/aegis-resume`` at it. ``python -m aegis_flow.supervisor.integrity`` is the
  operators' command line over :func:`verify` and :func:`gate` (``--help``).

Side effects: reading files (:func:`verify`, :func:`candidates`, :func:`gate`); writing a
manifest (:func:`record`); renaming damaged checkpoints aside and replacing the ``aegis-resume``
symlink (:func:`gate`); stdout/stderr (:func:`main` only). :func:`damaged_name`,
:func:`checkpoint_number` and :func:`resume_messages` are pure. torch is imported only when a
checkpoint is read (by :mod:`aegis_flow.steps.ckpt_read`); everything else is the standard
library, so importing this module keeps a supervisor light.
"""

from __future__ import annotations

import argparse
import enum
import fnmatch
import hashlib
import importlib.util
import json
import os
import re
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from aegis_flow.steps import ckpt_read

FILE_MANIFEST_SUFFIX = ".aegis-sha256.json"  # beside a single file: X.aegis-sha256.json
DIR_MANIFEST = ".aegis-manifest.json"  # inside a DCP directory
MANIFEST_FORMAT = "aegis-checkpoint-manifest/1"
DCP_METADATA = ".metadata"
DAMAGED_TAG = ".damaged-"
RESUME_LINK = "aegis-resume"
DEFAULT_PATTERN = "ckpt-*"
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6 is a zip archive
_CHUNK = 1 << 20
_DETAIL_LIMIT = 240


class Kind(str, enum.Enum):
    FILE = "file"  # one torch.save file
    DCP = "dcp"  # a torch.distributed.checkpoint directory
    MISSING = "missing"


class Problem(str, enum.Enum):
    MISSING = "missing"  # no such path
    TRUNCATED = "truncated"  # shorter than recorded or than its format says
    UNREADABLE = "unreadable"  # torch cannot load it, or its .metadata cannot be parsed
    INCOMPLETE = "incomplete"  # a DCP directory without .metadata or a storage file
    CHECKSUM = "checksum"  # size or sha256 differs from the manifest, a zip CRC fails


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str  # one line: what was checked, or what is wrong ("truncated: ...")
    kind: Kind
    problem: Problem | None = None  # None exactly when ok


@dataclass(frozen=True)
class Damaged:
    path: Path  # where the checkpoint was
    reason: str  # its verdict's reason
    moved_to: Path | None  # where it is now; None when the rename failed (it was skipped)


@dataclass(frozen=True)
class GateResult:
    chosen: Path | None  # the checkpoint to resume from; None: start without one
    damaged: tuple[Damaged, ...] = ()  # newest first
    messages: tuple[str, ...] = ()  # lines for the fault log
    error: str | None = None  # the directory or the symlink could not be handled

    @property
    def link(self) -> Path | None:
        return self.chosen.parent / RESUME_LINK if self.chosen is not None else None


# --- record ------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_path(path: Path) -> Path:
    """Where the manifest of checkpoint ``path`` lives (whether or not it exists)."""
    if path.is_dir():
        return path / DIR_MANIFEST
    return path.with_name(path.name + FILE_MANIFEST_SUFFIX)


def _files_of(path: Path) -> dict[str, Path]:
    if not path.is_dir():
        return {path.name: path}
    return {p.relative_to(path).as_posix(): p for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != DIR_MANIFEST}


def record(path: str | os.PathLike[str]) -> Path:
    """Write the manifest of a checkpoint just saved (a file or a DCP directory); return its path.

    Call it after the checkpoint is complete (after ``os.replace`` of a file, after
    ``torch.distributed.checkpoint.save`` returned, on one rank). Written atomically (temporary
    file, fsync, ``os.replace``): a crash leaves the old manifest or none, and a checkpoint
    without a manifest is still verified, only without checksums.
    """
    ckpt = Path(path)
    if not ckpt.exists():
        raise FileNotFoundError(f"no checkpoint at {ckpt} to record")
    files = {name: {"size": p.stat().st_size, "sha256": sha256_of(p)}
             for name, p in _files_of(ckpt).items()}
    target = manifest_path(ckpt)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    body = json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1, sort_keys=True)
    with tmp.open("w") as fh:
        fh.write(body + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return target


# --- verify ------------------------------------------------------------------------------------


def _detail(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return line if len(line) <= _DETAIL_LIMIT else line[: _DETAIL_LIMIT - 3] + "..."


def _read_manifest(path: Path) -> dict[str, dict[str, object]] | str | None:
    """The manifest's files, None when there is none, or a reason it cannot be read."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        files = data["files"]
        if data.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            return f"manifest {path.name} has an unknown format"
        return files
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"manifest {path.name} cannot be read ({_detail(exc)})"


def _check_manifest(root: Path, manifest: dict[str, dict[str, object]],
                    kind: Kind) -> Verdict | None:
    """The first file that differs from the manifest, as a failed verdict; None: all match."""
    for name, entry in sorted(manifest.items()):
        file = root / name if kind is Kind.DCP else root
        if not file.is_file():
            return Verdict(False, f"incomplete: {name}, listed in the manifest, is missing",
                           kind, Problem.INCOMPLETE)
        size, want = file.stat().st_size, entry.get("size")
        if isinstance(want, int) and size < want:
            return Verdict(False, f"truncated: {name} has {size} of the {want} bytes recorded",
                           kind, Problem.TRUNCATED)
        if size != want:
            return Verdict(False, f"checksum: {name} has {size} bytes, the manifest "
                           f"recorded {want}", kind, Problem.CHECKSUM)
        if sha256_of(file) != entry.get("sha256"):
            return Verdict(False, f"checksum: {name}'s sha256 differs from the manifest's",
                           kind, Problem.CHECKSUM)
    return None


def _bad_zip_record(path: Path) -> str | None:
    """The first record of a zip archive whose CRC fails; None when every one passes."""
    with zipfile.ZipFile(path) as archive:
        return archive.testzip()


def _verify_file(path: Path) -> Verdict:
    manifest = _read_manifest(manifest_path(path))
    if isinstance(manifest, str):
        return Verdict(False, f"checksum: {manifest}", Kind.FILE, Problem.CHECKSUM)
    if manifest is not None:
        failed = _check_manifest(path, manifest, Kind.FILE)
        if failed is not None:
            return failed
    size = path.stat().st_size
    if size == 0:
        return Verdict(False, "truncated: the file is empty", Kind.FILE, Problem.TRUNCATED)
    with path.open("rb") as fh:
        is_zip_start = fh.read(4) == ZIP_MAGIC
    is_whole_zip = is_zip_start and zipfile.is_zipfile(path)
    if is_whole_zip and manifest is None:  # no sha256 to lean on: the zip's own CRCs
        try:
            bad = _bad_zip_record(path)
        except (OSError, zipfile.BadZipFile, EOFError) as exc:
            bad = f"? ({_detail(exc)})"
        if bad is not None:
            return Verdict(False, f"checksum: zip record {bad} fails its CRC", Kind.FILE,
                           Problem.CHECKSUM)
    sums = ("sha256 matches the manifest" if manifest is not None
            else "no manifest recorded: sha256 not checked" + (", zip CRCs pass" if is_whole_zip
                                                              else ""))
    try:
        ckpt_read.load_file(path)
    except Exception as exc:
        if ckpt_read.is_weights_only_refusal(exc) and is_whole_zip:
            return Verdict(True, "readable: zip archive intact; torch.load(weights_only=True) "
                           "refused a non-tensor object, so it was not unpickled "
                           f"({sums}; {size} bytes)", Kind.FILE)
        if is_zip_start and not is_whole_zip:
            return Verdict(False, f"truncated: zip archive without its end record; "
                           f"torch.load failed: {_detail(exc)}", Kind.FILE, Problem.TRUNCATED)
        return Verdict(False, f"unreadable: torch.load failed: {_detail(exc)}", Kind.FILE,
                       Problem.UNREADABLE)
    return Verdict(True, f"readable by torch.load ({sums}; {size} bytes)", Kind.FILE)


def _verify_dcp(path: Path) -> Verdict:
    manifest = _read_manifest(path / DIR_MANIFEST)
    if isinstance(manifest, str):
        return Verdict(False, f"checksum: {manifest}", Kind.DCP, Problem.CHECKSUM)
    if manifest is not None:
        failed = _check_manifest(path, manifest, Kind.DCP)
        if failed is not None:
            return failed
    if not (path / DCP_METADATA).is_file():
        return Verdict(False, f"incomplete: no {DCP_METADATA} (a save that did not finish?)",
                       Kind.DCP, Problem.INCOMPLETE)
    try:
        extents = ckpt_read.dcp_extents(path)
    except Exception as exc:
        return Verdict(False, f"unreadable: {DCP_METADATA} cannot be read: {_detail(exc)}",
                       Kind.DCP, Problem.UNREADABLE)
    for name, needed in sorted(extents.items()):
        file = path / name
        if not file.is_file():
            return Verdict(False, f"incomplete: storage file {name}, named by {DCP_METADATA}, "
                           "is missing", Kind.DCP, Problem.INCOMPLETE)
        size = file.stat().st_size
        if size < needed:
            return Verdict(False, f"truncated: storage file {name} has {size} bytes, "
                           f"{DCP_METADATA} needs {needed}", Kind.DCP, Problem.TRUNCATED)
    sums = ("checksums match the manifest" if manifest is not None
            else "no manifest recorded: checksums not checked")
    return Verdict(True, f"complete: {DCP_METADATA} and the {len(extents)} storage file(s) it "
                   f"names ({sums})", Kind.DCP)


def verify(path: str | os.PathLike[str]) -> Verdict:
    """Whether the checkpoint at ``path`` (a torch.save file or a DCP directory) can be resumed.

    A file: its manifest's size and sha256 when one was recorded (else the zip archive's CRCs),
    then ``torch.load(map_location="cpu", weights_only=True)``. A DCP directory: its manifest
    when recorded, ``.metadata`` present and parseable, every storage file it names present and
    long enough. Never raises for a damaged checkpoint: the verdict says what is wrong.
    """
    ckpt = Path(path)
    try:
        if ckpt.is_dir():
            return _verify_dcp(ckpt)
        if ckpt.is_file():
            return _verify_file(ckpt)
    except OSError as exc:
        kind = Kind.DCP if ckpt.is_dir() else Kind.FILE
        return Verdict(False, f"unreadable: {_detail(exc)}", kind, Problem.UNREADABLE)
    return Verdict(False, "missing: no such file or directory", Kind.MISSING, Problem.MISSING)


# --- candidates and the gate -------------------------------------------------------------------


def checkpoint_number(name: str) -> int | None:
    """The largest integer in a checkpoint's name (``ckpt-120.pt``: 120), None if it has none."""
    numbers = [int(n) for n in re.findall(r"\d+", name)]
    return max(numbers) if numbers else None


def _is_ours_or_hidden(name: str) -> bool:
    return (name.startswith(".") or name.endswith(".tmp") or name == RESUME_LINK
            or FILE_MANIFEST_SUFFIX in name or DAMAGED_TAG in name)


def candidates(directory: str | os.PathLike[str], pattern: str = DEFAULT_PATTERN) -> list[Path]:
    """The checkpoints in ``directory`` whose names match ``pattern`` (a glob), newest first.

    Newest: the largest integer in the name (``ckpt-120.pt`` before ``ckpt-90.pt``, ``step_00080``
    is 80); names without one come after those with one; ties and names without one go by
    modification time. Skipped: our manifests, temporary files (``*.tmp``, names starting with
    ``.``), checkpoints already moved aside (``*.damaged-*``), symlinks (``aegis-resume``).
    Raises OSError when the directory cannot be read.
    """
    keyed = []
    for entry in Path(directory).iterdir():
        name = entry.name
        if _is_ours_or_hidden(name) or not fnmatch.fnmatchcase(name, pattern):
            continue
        if entry.is_symlink() or not (entry.is_file() or entry.is_dir()):
            continue
        number = checkpoint_number(name)
        keyed.append(((number is not None, number or 0, entry.stat().st_mtime_ns, name), entry))
    return [entry for _, entry in sorted(keyed, key=lambda kv: kv[0], reverse=True)]


def damaged_name(name: str, now: datetime, taken: Sequence[str] = ()) -> str:
    """``<name>.damaged-<UTC time>``, with ``-2``, ``-3``... when that name is ``taken``."""
    stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = f"{name}{DAMAGED_TAG}{stamp}"
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def resume_messages(chosen: Path | None, damaged: Sequence[Damaged], verdict: Verdict | None,
                    total: int) -> tuple[str, ...]:
    """The fault log's lines for one gate: one per damaged checkpoint, the last says the choice."""
    if chosen is not None:
        outcome = f"resuming from {chosen.name}"
    elif damaged:
        outcome = "no good checkpoint left: starting without one"
    else:
        return ("no checkpoint found: starting without one",)
    lines = []
    for d in damaged:
        where = (f"moved aside to {d.moved_to.name}" if d.moved_to is not None
                 else "could not be moved aside, skipped")
        lines.append(f"checkpoint {d.path.name} is damaged ({d.reason}): {where}")
    if lines:
        return (*lines[:-1], f"{lines[-1]}; {outcome}")
    detail = f" ({verdict.reason})" if verdict is not None else ""
    return (f"{outcome}, the newest of {total} checkpoint(s){detail}",)


def _move_aside(path: Path, now: datetime) -> Path:
    taken = [p.name for p in path.parent.iterdir()]
    target = path.with_name(damaged_name(path.name, now, taken))
    manifest = manifest_path(path)
    os.rename(path, target)
    if not path.is_dir() and manifest.is_file():  # a file's manifest travels with it
        os.rename(manifest, target.with_name(target.name + FILE_MANIFEST_SUFFIX))
    return target


def _point_link(directory: Path, chosen: Path | None) -> str | None:
    """Point ``aegis-resume`` at ``chosen`` atomically (remove it when None); an error or None."""
    link = directory / RESUME_LINK
    try:
        if chosen is None:
            if link.is_symlink():
                link.unlink()
            return None
        tmp = directory / f".{RESUME_LINK}.{os.getpid()}.tmp"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(chosen.name, tmp)  # relative: the directory may be mounted elsewhere
        os.replace(tmp, link)
        return None
    except OSError as exc:
        return f"cannot point {link} at {chosen.name if chosen else 'nothing'}: {_detail(exc)}"


def gate(directory: str | os.PathLike[str], pattern: str = DEFAULT_PATTERN, *,
         now: datetime) -> GateResult:
    """Choose the checkpoint to resume from; move every newer damaged one aside.

    Verifies the candidates newest first and stops at the first good one (older ones are not
    read). Each damaged one is renamed to ``<name>.damaged-<now, UTC>`` (never deleted; a
    file's manifest is renamed with it); ``<directory>/aegis-resume`` becomes a relative symlink
    to the chosen one (temporary symlink, then ``os.replace``), or is removed when none is good.
    A directory that does not exist is a first run (chosen None, no error); one that cannot be
    read is an ``error`` with a message, never an exception.
    """
    root = Path(directory)
    try:
        found = candidates(root, pattern)
    except FileNotFoundError:
        return GateResult(None, messages=(f"no checkpoint directory {root}: starting without a "
                                          "checkpoint",))
    except OSError as exc:
        message = f"cannot read the checkpoint directory {root}: {_detail(exc)}"
        return GateResult(None, messages=(message,), error=message)
    if found and importlib.util.find_spec("torch") is None:
        # without torch every checkpoint would look unreadable: judge none, move none
        message = (f"torch is not importable in {sys.executable}: no checkpoint in {root} was "
                   "verified or moved")
        return GateResult(None, messages=(message,), error=message)
    chosen: Path | None = None
    good: Verdict | None = None
    damaged: list[Damaged] = []
    for path in found:
        verdict = verify(path)
        if verdict.ok:
            chosen, good = path, verdict
            break
        try:
            moved: Path | None = _move_aside(path, now)
        except OSError:
            moved = None
        damaged.append(Damaged(path, verdict.reason, moved))
    messages = resume_messages(chosen, damaged, good, len(found))
    error = _point_link(root, chosen) if found or (root / RESUME_LINK).is_symlink() else None
    if any(d.moved_to is None for d in damaged) and error is None:
        error = "a damaged checkpoint could not be moved aside"
    return GateResult(chosen, tuple(damaged), messages + ((error,) if error else ()), error)


# --- the operators' command line ---------------------------------------------------------------

EXIT_GOOD, EXIT_DAMAGED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aegis_flow.supervisor.integrity",
        description="Verify checkpoints before a resume; move damaged ones aside.",
        epilog="exit status: 0 good (gate: nothing was damaged), 1 damaged (gate: something was "
               "moved aside, or the directory could not be read), 2 usage. A file is checked "
               "with torch.load(weights_only=True) and, when record() wrote one, its "
               "X.aegis-sha256.json manifest; a torch.distributed.checkpoint directory for "
               ".metadata, the storage files it names and its .aegis-manifest.json.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    v = sub.add_parser("verify", help="verify one checkpoint (a file or a DCP directory)",
                       description="Verify one checkpoint; print ok or damaged and why.")
    v.add_argument("path", metavar="PATH")
    g = sub.add_parser(
        "gate", help="choose the newest good checkpoint in a directory",
        description="Walk DIR's checkpoints newest first (largest number in the name, then "
                    "modification time); rename each damaged one to NAME.damaged-<UTC time> "
                    "(never deleted); point DIR/aegis-resume at the first good one.")
    g.add_argument("directory", metavar="DIR")
    g.add_argument("--pattern", default=DEFAULT_PATTERN, metavar="GLOB",
                   help=f"which names are checkpoints (default {DEFAULT_PATTERN!r}; e.g. "
                        "'step_*' for DCP directories)")
    g.add_argument("--json", action="store_true",
                   help="print the result as one JSON object (for a supervisor)")
    g.add_argument("--out", metavar="FILE", default=None,
                   help="also write that JSON object to FILE (the supervisor reads it there)")
    return parser


def _gate_json(result: GateResult) -> str:
    return json.dumps({
        "chosen": str(result.chosen) if result.chosen else None,
        "damaged": [{"path": str(d.path), "reason": d.reason,
                     "moved_to": str(d.moved_to) if d.moved_to else None}
                    for d in result.damaged],
        "messages": list(result.messages), "error": result.error,
    })


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, a usage error 2
        return int(exc.code or 0)
    if args.command == "verify":
        verdict = verify(args.path)
        print(f"{args.path}: {'ok' if verdict.ok else 'damaged'} ({verdict.kind.value}): "
              f"{verdict.reason}")
        return EXIT_GOOD if verdict.ok else EXIT_DAMAGED
    result = gate(args.directory, args.pattern, now=datetime.now(timezone.utc))
    if args.out:
        Path(args.out).write_text(_gate_json(result) + "\n")
    if args.json:
        print(_gate_json(result))
    elif not args.out:  # with --out the caller shows the messages
        for line in result.messages:
            print(line, file=sys.stderr if line == result.error else sys.stdout)
    return EXIT_DAMAGED if result.damaged or result.error else EXIT_GOOD


if __name__ == "__main__":
    sys.exit(main())
