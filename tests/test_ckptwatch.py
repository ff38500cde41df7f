"""Completed checkpoints seen with no code change, and the checkpoint API's datagram.

Unit tier: real directories and a real datagram socket; no torch needed (completion is judged
by names and DCP's ``.metadata``, not by reading the files).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aegis_flow import checkpoint
from aegis_flow.steps.hang import ProgressSocket
from aegis_flow.supervisor.ckptwatch import Watch, newest_complete


def test_the_newest_complete_checkpoint_is_found_and_half_written_ones_are_not(
        tmp_path: Path) -> None:
    assert newest_complete(tmp_path / "missing", "ckpt-*") is None
    (tmp_path / "ckpt-10.pt").write_bytes(b"x" * 10)
    (tmp_path / "ckpt-30.pt.tmp").write_bytes(b"x")  # torch.save still writing: not final
    (tmp_path / "ckpt-20.pt").write_bytes(b"")  # created, nothing in it yet
    assert newest_complete(tmp_path, "ckpt-*") == (10, tmp_path / "ckpt-10.pt")
    dcp = tmp_path / "ckpt-40"
    dcp.mkdir()
    (dcp / "__0_0.distcp").write_bytes(b"shard")
    assert newest_complete(tmp_path, "ckpt-*") == (10, tmp_path / "ckpt-10.pt")  # no metadata
    (dcp / ".metadata").write_bytes(b"meta")  # DCP writes it last
    assert newest_complete(tmp_path, "ckpt-*") == (40, dcp)
    assert newest_complete(tmp_path, "step_*") is None  # the pattern decides


def test_a_watch_reports_each_newer_checkpoint_once() -> None:
    w = Watch()
    w, news = w.news((10, Path("ckpt-10")))
    assert news == (10, Path("ckpt-10"))
    for found in ((10, Path("ckpt-10")), (5, Path("ckpt-5")), None):
        w2, news = w.news(found)
        assert news is None and w2 == w
    assert w.news((20, Path("ckpt-20")))[1] == (20, Path("ckpt-20"))


def test_done_sends_one_datagram_the_supervisor_reads(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AEGIS_PROGRESS_SOCKET", raising=False)
    assert checkpoint.done(3, "x") is False  # outside aegis-flow: nothing, no error
    path = tmp_path / "p.sock"
    with ProgressSocket(path) as ps:
        monkeypatch.setenv("AEGIS_PROGRESS_SOCKET", str(path))
        assert checkpoint.done(120, tmp_path / "ckpt-120.pt")
        assert checkpoint.done(-1) is False and checkpoint.done("x") is False  # type: ignore[arg-type]
        assert checkpoint.done(121, "a\nb")  # a newline cannot split the datagram
        assert ps.drain() == []  # no step numbers: checkpoints are kept apart
        assert ps.checkpoints == [(120, str(tmp_path / "ckpt-120.pt")), (121, "a b")]
    os.environ.pop("AEGIS_PROGRESS_SOCKET", None)
    monkeypatch.setenv("AEGIS_PROGRESS_SOCKET", str(tmp_path / "gone.sock"))
    assert checkpoint.done(1) is False  # the supervisor is gone: never raises


def test_the_gates_choice_is_the_last_safe_step_and_plain_reports_only_raise_it() -> None:
    import time

    from machine_helpers import running

    from aegis_flow import protocol as p
    from aegis_flow.master.machine import CheckpointDone, step

    status = running(2, 1)
    for event, expected in ((CheckpointDone(30), 30), (CheckpointDone(10), 30),
                            (CheckpointDone(20, gated=True), 20), (CheckpointDone(25), 25)):
        status, _ = step(status, event)
        assert status.checkpoint_step == expected, event

    def msg(data: dict[str, object]) -> p.Message:
        return p.Message(job="j", namespace="default", pod_name="j-worker-0",
                         type=p.MsgType.CHECKPOINT, rank=0, seq=1, incarnation="i",
                         phase="Running", data=data, timestamp=time.time())

    assert p.to_event(msg({"step": 20, "gate": ["moved aside"]})) == CheckpointDone(20, True)
    assert p.to_event(msg({"step": 20})) == CheckpointDone(20, False)


def test_requested_returns_each_round_once_and_nothing_outside_aegis_flow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``checkpoint.requested()``: the run id the supervisor wrote to $AEGIS_SAVE_REQUEST, once
    per round; None with no variable, no file, an empty file or the same round again."""
    monkeypatch.setattr(checkpoint, "_seen", {"stat": None, "run_id": ""})
    monkeypatch.delenv(checkpoint.REQUEST_ENV, raising=False)
    assert checkpoint.requested() is None  # outside aegis-flow
    path = tmp_path / "request"
    monkeypatch.setenv(checkpoint.REQUEST_ENV, str(path))
    assert checkpoint.requested() is None  # no round asked for
    path.write_text("fault-7-1\n")
    assert checkpoint.requested() == "fault-7-1"
    assert checkpoint.requested() is None  # once per round
    os.utime(path, ns=(1, 1))  # touched, same round: still not again
    assert checkpoint.requested() is None
    path.write_text("fault-9-1\n")
    assert checkpoint.requested() == "fault-9-1"
    path.write_text("")
    assert checkpoint.requested() is None
    path.unlink()  # a new run: the supervisor removed it
    assert checkpoint.requested() is None
