"""Hang detection that needs no code change and blames the rank that stopped first (issue 18).

Pure and unit tier: the automatic progress datagram and the watchdog's modes
(``steps/hang.py``), the innermost frame of a py-spy dump, ``policy.stopped_first`` and the
core's B5 row (``machine.step``), and the runtime's bookkeeping of each rank's counts. The
real-process proof is ``tests/test_hang_e2e.py``.
"""

from __future__ import annotations

import pytest
from machine_helpers import running, transitions

from aegis_flow.master import policy
from aegis_flow.master.machine import Finish, HangWithQuit, step
from aegis_flow.steps.hang import AutoProgress, HangWatchdog, ProgressSocket, top_frame


def test_the_automatic_datagram_parses_and_bad_ones_are_refused() -> None:
    auto = AutoProgress.parse(b"a 12 40 1764650000.125 3.500")
    assert auto == AutoProgress(12, 40, 1764650000.125, 3.5)
    assert AutoProgress.parse(b"a 0 1 5.0 -1.000") == AutoProgress(0, 1, 5.0, None)
    for bad in (b"a 1 2 3", b"a x 2 3 4", b"a -1 2 3 4", b"b 1 2 3 4", b"a 1 2 nan 4",
                b"a 1 2 3 nan", b""):
        assert AutoProgress.parse(bad) is None, bad
    assert auto is not None and auto.beat() == {"steps": 12, "forwards": 40,
                                                "last_active": 1764650000.125, "forward_ms": 3.5}


def test_the_socket_keeps_steps_and_the_latest_counts_apart(tmp_path: object) -> None:
    import socket
    from pathlib import Path

    path = Path(str(tmp_path)) / "p.sock"
    with ProgressSocket(path) as ps:
        out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for raw in (b"7", b"a 1 2 10.0 1.0", b"junk", b"a 2 4 11.0 1.0", b"8"):
            out.sendto(raw, str(path))
        assert ps.drain() == [7, 8]
        assert ps.auto == AutoProgress(2, 4, 11.0, 1.0)
        ps.reset()
        assert ps.auto is None


def test_a_quiet_process_whose_counts_move_is_not_hung() -> None:
    """Review 6h: a job that prints nothing for longer than the thresholds was restarted.
    With the counts it is idle only while the counts stand still."""
    dog = HangWatchdog(5, 10, started=0.0)
    assert dog.check(6.0) == "hang"  # output mode: silence is a hang
    for t in range(1, 60):
        dog = dog.observe_auto(float(t), AutoProgress(t, 2 * t, float(t), 1.0))
        assert dog.check(t + 0.5) is None
    assert dog.mode == "torch"
    # output no longer counts: a process logging while its counts stand still is hung
    dog = dog.observe_output(70.0)
    assert dog.check(70.0) == "hang_with_quit" and dog.idle(70.0) == 11.0
    # the same counts again are no progress
    assert dog.observe_auto(71.0, AutoProgress(59, 118, 59.0, None)) == dog


def test_the_progress_api_outranks_the_counts_in_the_mode() -> None:
    dog = HangWatchdog(5, 10, started=0.0).observe_auto(1.0, AutoProgress(1, 1, 1.0, 1.0))
    assert dog.mode == "torch"
    assert dog.observe_progress(2.0, 3).mode == "progress"


DUMP = '''Process 14738: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 14740 (idle): "aegis-progress"
    send (zygote.py:150)
Thread 14738 (idle): "MainThread"
    load_batch (train.py:31)
    <module> (train.py:50)
'''


def test_the_innermost_frame_of_the_main_thread_is_named() -> None:
    assert top_frame(DUMP) == "load_batch (train.py:31)"
    assert top_frame("py-spy not installed: no Python stacks collected") is None
    assert top_frame('Thread 1 (idle): "MainThread"\n') is None


@pytest.mark.parametrize(("activity", "first"), [
    (((0, 10, 11), (1, 10, 10), (2, 10, 11)), 1),  # rank 1 is one forward behind
    (((0, 9, 10), (1, 10, 11)), 0),  # behind in steps
    (((0, 10, 11), (1, 10, 11)), None),  # equal: the network, or all of them
    (((0, 10, 10), (1, 10, 10), (2, 10, 11)), None),  # two equally behind
    (((0, 10, 10),), None),  # one rank's counts say nothing
    ((), None),
])
def test_stopped_first(activity: tuple[tuple[int, int, int], ...], first: int | None) -> None:
    assert policy.stopped_first(activity) == first


def test_b5_the_rank_behind_is_charged_whichever_rank_reported() -> None:
    """Review 6h/issue 18: the rank blamed was whichever reported first. Rank 0's watchdog
    fires first (it sleeps in the collective, waiting); the counts show rank 2 behind."""
    status = running(3, 3)
    seq = status.seq
    counts = ((0, 10, 11), (1, 10, 11), (2, 10, 10))
    status, effects = step(status, HangWithQuit(0, seq, waiting=True, activity=counts))
    assert transitions(effects) == ["T14"] and status.retries == (0, 0, 1)
    assert status.worker(2).cause == policy.HANG_CAUSE


def test_b5_counts_naming_nobody_leave_the_old_rules() -> None:
    status = running(3, 3)
    seq = status.seq
    even = ((0, 10, 11), (1, 10, 11), (2, 10, 11))
    status, effects = step(status, HangWithQuit(0, seq, waiting=True, activity=even))
    assert transitions(effects) == ["T14s"] and status.retries == (0, 0, 0)  # a suspect (B1)


def test_b5_a_finished_rank_behind_is_not_charged() -> None:
    status = running(3, 3)
    seq = status.seq
    status, _ = step(status, Finish(2, seq, ok=True))
    counts = ((0, 10, 11), (1, 10, 11), (2, 10, 10))
    status, effects = step(status, HangWithQuit(0, seq, waiting=True, activity=counts))
    assert transitions(effects) == ["T14s"] and status.retries == (0, 0, 0)


def test_the_runtime_compares_counts_of_the_current_run_only() -> None:
    from aegis_flow import protocol as p
    from aegis_flow.master.runtime import Master, MasterConfig

    rt = Master(MasterConfig(job="j", workers=3, observe=False))

    def beat(rank: int, seq: int, progress: object) -> p.Message:
        return p.Message(job="j", namespace="default", pod_name=f"j-worker-{rank}",
                         type=p.MsgType.ACK, rank=rank, seq=seq, incarnation="i",
                         phase="Running", data={"progress": progress}, timestamp=0.0)

    rt._count(beat(0, 4, {"steps": 9, "forwards": 10}))
    rt._count(beat(1, 3, {"steps": 50, "forwards": 50}))  # the run before: not comparable
    rt._count(beat(2, 4, {"steps": 9, "forwards": 9}))
    for junk in ({"steps": -1, "forwards": 2}, {"steps": True, "forwards": 2}, "x", None,
                 {"steps": 1.5, "forwards": 2}):
        rt._count(beat(1, 4, junk))  # malformed: ignored, never raised
    assert rt._activity(4) == ((0, 9, 10), (2, 9, 9))
    assert policy.stopped_first(rt._activity(4)) == 2
