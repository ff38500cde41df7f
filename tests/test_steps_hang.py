"""The hang watchdog (fake clock), the progress API over a real datagram socket, and real
children that stop making progress."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aegis_flow import progress
from aegis_flow.steps.base import CheckStatus
from aegis_flow.steps.hang import HangWatchdog, ProgressSocket, collect_stacks

ROOT = Path(__file__).resolve().parent.parent


def wd(**kw: float) -> HangWatchdog:
    return HangWatchdog(hang_after=kw.get("hang_after", 10.0),
                        quit_after=kw.get("quit_after", 30.0), started=kw.get("started", 0.0))


# --- the pure watchdog ---------------------------------------------------------------------------


def test_both_thresholds_from_the_start() -> None:
    w = wd()
    assert [w.check(t) for t in (0, 9.9, 10, 29.9, 30, 100)] == [
        None, None, "hang", "hang", "hang_with_quit", "hang_with_quit"]


def test_output_resets_the_clock_in_output_mode() -> None:
    w = wd().observe_output(5.0).observe_output(12.0)
    assert w.mode == "output"
    assert (w.check(21.9), w.check(22.0), w.check(42.0)) == (None, "hang", "hang_with_quit")


def test_progress_resets_and_then_takes_precedence_over_output() -> None:
    w = wd().observe_output(1.0).observe_progress(2.0, step=1)
    assert w.mode == "progress" and w.check(11.9) is None
    w = w.observe_output(11.0).observe_output(20.0)  # logs while stuck: still hung
    assert w.check(12.0) == "hang" and w.check(32.0) == "hang_with_quit"
    w = w.observe_progress(33.0, step=2)
    assert w.check(33.0) is None and w.last_step == 2


def test_a_repeated_step_number_is_not_progress() -> None:
    w = wd().observe_progress(1.0, 7).observe_progress(9.0, 7)
    assert w.last_activity() == 1.0 and w.check(11.0) == "hang"


def test_thresholds_are_validated() -> None:
    with pytest.raises(ValueError, match="hang_after <= quit_after"):
        HangWatchdog(hang_after=5, quit_after=1, started=0)
    with pytest.raises(ValueError):
        HangWatchdog(hang_after=0, quit_after=1, started=0)


def test_as_a_check_result() -> None:
    w = wd().observe_progress(0.0, 3)
    assert w.to_result(5.0).status is CheckStatus.PASS
    r = w.to_result(31.0, stacks="Thread 1: MainThread")
    assert r.status is CheckStatus.FAIL and r.detail.startswith("hang_with_quit")
    assert r.data["stacks"] == "Thread 1: MainThread" and r.data["last_step"] == 3


# --- the progress API over a real socket ---------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[ProgressSocket]:
    with tempfile.TemporaryDirectory(prefix="aegis-") as d, ProgressSocket(
            Path(d) / "progress.sock") as sock:
        yield sock


def test_step_delivers_to_a_bound_datagram_socket(receiver: ProgressSocket,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(progress.SOCKET_ENV, receiver.path)
    progress.step(5)
    assert receiver.drain() == [5]
    progress.step(6)  # within 0.1 s of the last send: dropped (at most ~10 sends/s)
    assert receiver.drain() == []
    time.sleep(progress.MIN_INTERVAL + 0.02)
    progress.step(7)
    assert receiver.drain() == [7]


def test_step_is_a_no_op_outside_aegis_flow_and_never_raises(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(progress.SOCKET_ENV, raising=False)
    t0 = time.perf_counter()
    for i in range(10_000):
        progress.step(i)
    assert time.perf_counter() - t0 < 0.5
    monkeypatch.setenv(progress.SOCKET_ENV, str(tmp_path / "nobody-listens.sock"))
    progress.step(1)  # ECONNREFUSED/ENOENT swallowed


# --- real children -------------------------------------------------------------------------------


def watch(code: str, *, hang_after: float, quit_after: float,
          receiver: ProgressSocket | None = None,
          limit: float = 10.0) -> tuple[list[float], dict[str, float], bool, int]:
    """Run ``code``, feed its real output (and progress) times to a watchdog until it says
    hang_with_quit. Returns output times, when each level first fired, whether the child was
    still alive at "hang", and the progress reports seen."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if receiver is not None:
        env[progress.SOCKET_ENV] = receiver.path
    child = subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE, env=env)
    assert child.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(child.stdout, selectors.EVENT_READ)
    w = HangWatchdog(hang_after=hang_after, quit_after=quit_after, started=time.monotonic())
    outputs: list[float] = []
    fired: dict[str, float] = {}
    alive_at_hang, steps = False, 0
    try:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and "hang_with_quit" not in fired:
            for _key, _ in sel.select(timeout=0.02):
                if os.read(child.stdout.fileno(), 65536):
                    now = time.monotonic()
                    w = w.observe_output(now)
                    outputs.append(now)
            if receiver is not None:
                for step in receiver.drain():
                    w = w.observe_progress(time.monotonic(), step)
                    steps += 1
            level = w.check(time.monotonic())
            if level is not None and level not in fired:
                fired[level] = time.monotonic()
                if level == "hang":
                    alive_at_hang = child.poll() is None
    finally:
        child.kill()
        child.wait()
        sel.close()
    return outputs, fired, alive_at_hang, steps


def test_a_child_that_stops_printing_is_detected_as_hung() -> None:
    code = "import time\nfor i in range(5):\n    print(i)\n    time.sleep(0.05)\ntime.sleep(60)"
    outputs, fired, alive, _ = watch(code, hang_after=0.4, quit_after=0.8)
    assert len(outputs) >= 1 and set(fired) == {"hang", "hang_with_quit"}
    last = outputs[-1]
    assert last + 0.4 <= fired["hang"] < last + 0.4 + 0.5
    assert last + 0.8 <= fired["hang_with_quit"] < last + 0.8 + 0.5
    assert alive  # "hang" only marks: the process is kept


def test_a_child_that_logs_but_stops_stepping_is_hung(receiver: ProgressSocket) -> None:
    code = ("import time, aegis_flow.progress as p\ni = 0\nwhile True:\n"
            "    if i < 8: p.step(i)\n    print('still logging', i)\n    i += 1\n"
            "    time.sleep(0.12)")
    outputs, fired, alive, steps = watch(code, hang_after=0.5, quit_after=0.9,
                                         receiver=receiver)
    assert steps >= 3 and "hang" in fired and alive
    assert any(t > fired["hang"] for t in outputs)  # it was still printing, yet hung


# --- stacks ---------------------------------------------------------------------------------------


def test_collect_stacks_without_py_spy_says_so() -> None:
    note = collect_stacks(os.getpid(), which=lambda name: None)
    assert "py-spy not installed" in note


def test_collect_stacks_runs_py_spy_dump(tmp_path: Path) -> None:
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho \"Thread 1 (idle): MainThread; args: $*\"\n")
    fake.chmod(0o755)
    assert collect_stacks(42, which=lambda name: str(fake)).strip() == (
        "Thread 1 (idle): MainThread; args: dump --pid 42")
    fake.write_text("#!/bin/sh\necho 'Permission denied (ptrace)' >&2\nexit 1\n")
    assert "failed (exit 1): Permission denied" in collect_stacks(42, which=lambda n: str(fake))


def test_collect_stacks_tries_a_failing_dump_four_times(tmp_path: Path) -> None:
    """CI: py-spy failed twice in a row on a loaded machine; it is asked four times, then the
    note says why."""
    fake, count = tmp_path / "py-spy", tmp_path / "count"
    fake.write_text(f"#!/bin/sh\necho x >> {count}\n"
                    f"[ $(wc -l < {count}) -ge 4 ] && echo 'Thread 1 (idle): \"MainThread\"' "
                    "&& exit 0\necho 'Failed to find python version' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert "MainThread" in collect_stacks(42, which=lambda n: str(fake))
    count.write_text("")
    fake.write_text(f"#!/bin/sh\necho x >> {count}\necho 'Failed to find python' >&2\nexit 1\n")
    assert "failed (exit 1): Failed to find python" in collect_stacks(42, which=lambda n: str(fake))
    assert len(count.read_text().splitlines()) == 4


def test_collect_stacks_with_the_real_py_spy() -> None:
    """py-spy is a dev dependency: this runs in make test (it must not silently skip)."""
    from aegis_flow.steps.hang import find_tool

    assert find_tool("py-spy") is not None
    code = "import time\ndef stuck_in_here():\n    time.sleep(30)\nstuck_in_here()\n"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        assert "stuck_in_here" in collect_stacks(child.pid)
    finally:
        child.kill()
        child.wait()
