"""The structured fault log: JSON lines in a job's log directory, with size-based rotation.

One record per phase start/end (per worker and for the job), per worker report, per
quarantine, recovery, control-plane outage (start and end) and per job end (the user's
summary). Keys: the design's ``PodName,
PodIP, NodeName, NodeIP, TimeStamp, Phase, Message`` plus ``cause`` and ``level`` (L1 process,
L2 container, L3 node), and ``rank`` and ``kind`` so that tools need not parse messages.

Side effects: :class:`FaultLog` appends to ``DIR/faults.jsonl`` (flushed per line, so a reader
sees every line at once) and renames files when it rotates (``faults.jsonl.1`` is the newest
rotated one). :func:`read_records` and :func:`follow` only read. :func:`record` is pure.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

FILE_NAME = "faults.jsonl"
KEYS = ("PodName", "PodIP", "NodeName", "NodeIP", "TimeStamp", "Phase", "Message", "cause",
        "level", "rank", "kind")
#: what a record's ``kind`` can be
KINDS = ("phase_start", "phase_end", "report", "connected", "quarantine", "recovered",
         "summary", "outage")


class FaultLogError(ValueError):
    """A fault log line that is not a record (names the file and line)."""


def timestamp(now: float) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2026-11-30T04:01:02.123Z``."""
    return datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def record(kind: str, *, now: float, phase: str, message: str, pod: str = "", pod_ip: str = "",
           node: str = "", node_ip: str = "", cause: str = "", level: str = "",
           rank: int | None = None) -> dict[str, Any]:
    """One fault log record (pure)."""
    return {"PodName": pod, "PodIP": pod_ip, "NodeName": node, "NodeIP": node_ip,
            "TimeStamp": timestamp(now), "Phase": phase, "Message": message, "cause": cause,
            "level": level, "rank": rank, "kind": kind}


class FaultLog:
    """Append-only JSON lines with rotation: at ``max_bytes`` the file becomes ``.1``."""

    def __init__(self, directory: str | Path, *, max_bytes: int = 4 << 20,
                 backups: int = 5) -> None:
        if max_bytes < 1 or backups < 1:
            raise ValueError("fault log: max_bytes and backups must be at least 1")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / FILE_NAME
        self.max_bytes, self.backups = max_bytes, backups
        self._fh: TextIO = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._size = self._fh.tell()

    def write(self, rec: Mapping[str, Any]) -> None:
        self.write_many([rec])

    def write_many(self, recs: Iterable[Mapping[str, Any]]) -> None:
        """Append records with one write and one flush (they may straddle a rotation)."""
        text = "".join(json.dumps(rec, separators=(",", ":"), ensure_ascii=False) + "\n"
                       for rec in recs)
        if not text:
            return
        self._fh.write(text)
        self._fh.flush()
        self._size += len(text)
        if self._size >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        self._fh.close()
        for i in range(self.backups - 1, 0, -1):
            older = self.directory / f"{FILE_NAME}.{i}"
            if older.exists():
                os.replace(older, self.directory / f"{FILE_NAME}.{i + 1}")
        os.replace(self.path, self.directory / f"{FILE_NAME}.1")
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._size = 0

    def close(self) -> None:
        self._fh.close()


def log_files(directory: str | Path) -> list[Path]:
    """The log's files, oldest first (``.N`` … ``.1``, then the current one)."""
    d = Path(directory)
    rotated = []
    for f in d.glob(f"{FILE_NAME}.*"):
        suffix = f.name.rsplit(".", 1)[-1]
        if suffix.isdigit():
            rotated.append((int(suffix), f))
    files = [f for _, f in sorted(rotated, reverse=True)]
    if (d / FILE_NAME).exists():
        files.append(d / FILE_NAME)
    return files


def parse_line(line: str, where: str = "") -> dict[str, Any]:
    try:
        rec = json.loads(line)
    except ValueError as exc:
        raise FaultLogError(f"{where}: not JSON ({exc})") from None
    if not isinstance(rec, dict) or not all(k in rec for k in KEYS[:9]):
        raise FaultLogError(f"{where}: not a fault record (keys {KEYS[:9]} expected)")
    return rec


def read_records(directory: str | Path) -> list[dict[str, Any]]:
    """Every record, oldest first; FaultLogError names the first damaged line."""
    out = []
    for f in log_files(directory):
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    out.append(parse_line(line, f"{f}:{n}"))
    return out


def follow(directory: str | Path, *, poll: float = 0.25,
           stop: Callable[[], bool] = lambda: False) -> Iterator[dict[str, Any]]:
    """Every record so far, then new ones as they are written, across rotations.

    Ends after the job's ``summary`` record, or when ``stop()`` says so.
    """
    path = Path(directory) / FILE_NAME
    for f in log_files(directory):
        if f.name == FILE_NAME:
            continue
        with open(f, encoding="utf-8") as old:
            for n, line in enumerate(old, 1):
                if line.strip():
                    rec = parse_line(line, f"{f}:{n}")
                    yield rec
                    if rec["kind"] == "summary":
                        return
    fh: TextIO | None = None
    inode = -1
    buf = ""
    try:
        while not stop():
            chunk = ""
            if fh is None and path.exists():
                fh = open(path, encoding="utf-8")  # noqa: SIM115
                inode = os.fstat(fh.fileno()).st_ino
            if fh is not None:
                chunk = fh.read()
                try:
                    rotated = os.stat(path).st_ino != inode
                except FileNotFoundError:
                    rotated = True
                if rotated:  # finish the old file, open the new one next round
                    chunk += fh.read()
                    fh.close()
                    fh = None
            buf += chunk
            while "\n" in buf:
                line, buf = buf.split("\n", 1)
                if line.strip():
                    rec = parse_line(line, str(path))
                    yield rec
                    if rec["kind"] == "summary":
                        return
            if not chunk:
                time.sleep(poll)
    finally:
        if fh is not None:
            fh.close()


def format_record(rec: Mapping[str, Any]) -> str:
    """One readable line: time, pod, phase, kind, level/cause, message."""
    tags = " ".join(x for x in (rec.get("level") or "", rec.get("cause") or "") if x)
    return (f"{rec['TimeStamp']}  {rec['PodName'] or '-':<22} {rec['Phase'] or '-':<16} "
            f"{rec.get('kind', ''):<11} {tags + '  ' if tags else ''}{rec['Message']}")
