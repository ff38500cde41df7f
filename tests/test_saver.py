"""The checkpoint saver beside training (issue 18, ``--saver``): its state, a real saver
process restarted 3 s after it exits, ``close()`` leaving nothing behind, the worker and
``aegis-flow run`` flags, and the Argo rendering."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from aegis_flow.argtypes import split_command
from aegis_flow.jobspec import JobSpec, JobSpecError
from aegis_flow.supervisor.agent import Supervisor, WorkerConfig
from aegis_flow.supervisor.saver import (
    CANNOT_START,
    RESTART_DELAY,
    RESTARTING,
    RUNNING,
    STARTING,
    STOPPED,
    Saver,
    SaverState,
    saver_env,
)
from aegis_flow.workflow import render
from tests.jobs import Job, assert_nothing_left

ENV = {**os.environ, "AEGIS_PRELOAD": "", "PYTHONUNBUFFERED": "1"}

# -- the state, pure ---------------------------------------------------------------------------


def test_a_saver_that_exits_is_restarted_3_s_later_and_counted() -> None:
    s = SaverState()
    assert (s.status, s.restarts, s.data(0.0)) == (STARTING, 0, {
        "state": "starting", "pid": None, "restarts": 0, "last_exit_code": None})
    s = s.started(100)
    assert (s.status, s.pid, s.restarts) == (RUNNING, 100, 0)
    s = s.exited(1, now=10.0)
    assert (s.status, s.pid, s.last_exit_code, s.restart_at) == (RESTARTING, None, 1, 13.0)
    assert s.wait(11.0) == pytest.approx(2.0) and s.wait(20.0) == 0.0
    assert s.data(11.0) == {"state": "restarting", "pid": None, "restarts": 0,
                            "last_exit_code": 1, "restart_in": 2.0}
    s = s.started(101)
    assert (s.status, s.pid, s.restarts, s.last_exit_code) == (RUNNING, 101, 1, 1)
    assert s.wait(11.0) == 0.0  # running: no restart pending


def test_a_clean_exit_restarts_too_and_the_delay_is_fixed() -> None:
    """A saver is a daemon: exit 0 is not 'done'. No back-off: every exit waits RESTART_DELAY."""
    s = SaverState().started(1)
    for n in range(5):
        s = s.exited(0, now=100.0 * n)
        assert s.restart_at == 100.0 * n + RESTART_DELAY
        s = s.started(2 + n)
    assert s.restarts == 5


def test_a_command_that_cannot_start_is_tried_again_with_code_127() -> None:
    s = SaverState().exited(CANNOT_START, now=0.0)
    assert (s.status, s.last_exit_code, s.restart_at) == (RESTARTING, 127, RESTART_DELAY)
    assert s.started(5).restarts == 1


def test_stopped_is_final() -> None:
    s = SaverState().started(7).stopped()
    assert (s.status, s.pid, s.restart_at) == (STOPPED, None, None)
    s = s.exited(143, now=1.0)  # the exit that close() caused
    assert (s.status, s.last_exit_code, s.restart_at) == (STOPPED, 143, None)
    assert s.started(8).status == STOPPED
    assert s.data(0.0)["state"] == "stopped"


def test_the_saver_gets_the_training_environment_less_the_progress_socket() -> None:
    env = saver_env({"RANK": "1", "AEGIS_WORK_DIR": "/w", "AEGIS_PROGRESS_SOCKET": "/s"})
    assert env == {"RANK": "1", "AEGIS_WORK_DIR": "/w"}


@pytest.mark.parametrize("text,says", [
    ("", "is empty"), ("   ", "is empty"), ("python 'up.py", "cannot be parsed"),
    ("x \\", "cannot be parsed")])
def test_a_bad_saver_string_is_named_with_the_fix(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        split_command(text)


def test_a_saver_string_is_split_like_a_shell() -> None:
    assert split_command("python up.py --dir 'a b'") == ("python", "up.py", "--dir", "a b")


def test_the_heartbeat_carries_the_saver_state_only_when_there_is_one() -> None:
    cfg = WorkerConfig(command=("true",), job="j", rank=0, world_size=1)
    assert "saver" not in Supervisor(cfg)._beat_data()
    sup = Supervisor(WorkerConfig(command=("true",), job="j", rank=0, world_size=1,
                                  saver=("up",)))
    sup.saver = Saver(("up",), {}, rank=0)
    assert sup._beat_data()["saver"] == {"state": "starting", "pid": None, "restarts": 0,
                                         "last_exit_code": None}


# -- a real saver process ----------------------------------------------------------------------

CRASHER = """\
import sys, time
print(f"saver up at {time.time():.3f}", flush=True)
sys.exit(1)
"""

# spawns a grandchild in its own process group that ignores SIGTERM (only SIGKILL ends it)
SPAWNER = """\
import signal, subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c",
                        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                        "time.sleep(120)"])
print(f"grandchild {kid.pid}", flush=True)
time.sleep(120)
"""


def gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for its reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


async def until(cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_a_crashing_saver_is_restarted_about_3_s_after_it_exits(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASHER)
    said: list[str] = []

    async def go() -> Saver:
        saver = Saver([sys.executable, str(script)], ENV, rank=3, say=said.append)
        saver.start()
        await until(lambda: saver.state.restarts >= 1, 10.0)
        await until(lambda: saver.state.status == RESTARTING, 5.0)  # its second exit
        await saver.close()
        return saver

    saver = asyncio.run(go())
    out = capfd.readouterr().out
    times = [float(t) for t in re.findall(r"^\[rank 3 saver\] saver up at ([\d.]+)$", out, re.M)]
    assert len(times) >= 2, out
    # the first run exits right after it prints; the second prints right after it starts
    assert 2.5 <= times[1] - times[0] <= 6.0, times
    assert saver.state.status == STOPPED and saver.state.last_exit_code == 1
    assert said[0] == ("rank 3: the saver ended (exit code 1); restarting it in "
                       f"{RESTART_DELAY:g} s (restart 1)")


def test_close_leaves_neither_the_saver_nor_what_it_spawned(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "spawn.py"
    script.write_text(SPAWNER)

    async def with_grandchild() -> tuple[int, int, float]:
        saver = Saver([sys.executable, str(script)], ENV, rank=0, grace=1.0)
        saver.start()
        seen = ""

        def printed() -> bool:
            nonlocal seen
            seen += capfd.readouterr().out
            return "grandchild" in seen

        await until(printed, 10.0)
        kid = int(re.search(r"grandchild (\d+)", seen).group(1))  # type: ignore[union-attr]
        pid = saver.state.pid
        assert pid is not None and saver.state.status == RUNNING
        t0 = time.monotonic()
        await saver.close()
        took = time.monotonic() - t0
        await saver.close()  # idempotent
        return pid, kid, took

    pid, kid, took = asyncio.run(with_grandchild())
    assert took < 5.0
    deadline = time.monotonic() + 5
    while not (gone(pid) and gone(kid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid) and gone(kid), (pid, kid)


def test_close_while_waiting_to_restart_starts_nothing_again(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASHER)

    async def go() -> Saver:
        saver = Saver([sys.executable, str(script)], ENV, rank=0, say=lambda _: None)
        saver.start()
        await until(lambda: saver.state.status == RESTARTING, 10.0)
        await saver.close()
        await asyncio.sleep(RESTART_DELAY + 0.5)
        return saver

    saver = asyncio.run(go())
    assert (saver.state.status, saver.state.restarts, saver.state.pid) == (STOPPED, 0, None)


def test_a_saver_that_cannot_start_is_retried_not_fatal() -> None:
    said: list[str] = []

    async def go() -> Saver:
        saver = Saver(["/nonexistent/saver"], ENV, rank=0, restart_delay=0.2,
                      say=said.append)
        saver.start()
        await until(lambda: len(said) >= 2, 5.0)
        await saver.close()
        return saver

    saver = asyncio.run(go())
    assert saver.state.last_exit_code == CANNOT_START
    assert said[0].startswith("rank 0: cannot start the saver '/nonexistent/saver': ")


def test_the_worker_runs_the_saver_beside_a_plain_run_and_stops_it_at_exit(
        tmp_path: Path) -> None:
    """No NATS: the supervisor falls back to running the command alone; the saver runs
    beside it all the same and is gone when the worker exits."""
    script = tmp_path / "spawn.py"
    script.write_text(SPAWNER)
    proc = subprocess.run(
        [sys.executable, "-m", "aegis_flow.cli", "worker", "--job", "j", "--rank", "0",
         "--world-size", "1", "--nats-url", "nats://127.0.0.1:1", "--connect-timeout", "0.5",
         "--grace", "1", "--saver", f"{sys.executable} {script}", "--",
         sys.executable, "-c", "import time; time.sleep(3)"],
        capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert "[rank 0 saver] grandchild " in proc.stdout, proc.stdout + proc.stderr
    kid = int(re.search(r"grandchild (\d+)", proc.stdout).group(1))  # type: ignore[union-attr]
    deadline = time.monotonic() + 5
    while not gone(kid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(kid)
    assert_nothing_left(str(script), timeout=5)


# -- the command lines -------------------------------------------------------------------------


@pytest.mark.parametrize("value,says", [
    ("", "the saver command is empty"),
    ("python 'up.py", "cannot be parsed (no closing quotation)"),
    ("no-such-saver-program --x", "the saver command 'no-such-saver-program' is not found"),
])
def test_a_bad_saver_is_one_clear_line_and_nothing_starts(tmp_path: Path, value: str,
                                                          says: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aegis_flow.cli", "run", "--workers", "1", "--state-dir",
         str(tmp_path / "state"), "--saver", value, "--", sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=ENV)
    assert proc.returncode == 2
    assert proc.stderr.startswith("aegis-flow: error: --saver: "), proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "state").exists()


def test_the_worker_flag_gives_the_config_its_argument_list() -> None:
    from aegis_flow.supervisor.__main__ import parse

    cfg, _ = parse(["--job", "j", "--rank", "0", "--world-size", "1",
                    "--saver", "python up.py --dir 'a b'", "--", "python", "t.py"])
    assert cfg.saver == ("python", "up.py", "--dir", "a b")
    cfg, _ = parse(["--job", "j", "--rank", "0", "--world-size", "1", "--", "t"])
    assert cfg.saver == ()
    with pytest.raises(SystemExit):
        parse(["--job", "j", "--rank", "0", "--world-size", "1", "--saver", "", "--", "t"])


def worker_argv(spec: JobSpec) -> list[str]:
    templates = {t["name"]: t for t in render(spec)["spec"]["templates"]}
    command: list[str] = templates["worker"]["container"]["command"]
    return command


def test_argo_renders_the_saver_on_the_worker_command_only_when_set() -> None:
    from aegis_flow.supervisor.__main__ import parse

    plain = worker_argv(JobSpec(image="img", command=("python", "train.py")))
    assert "--saver" not in plain  # the golden workflows stay as they are
    argv = worker_argv(JobSpec(image="img", command=("python", "train.py"),
                               saver="python3 upload.py --dir '/checkpoints/a b'"))
    i = argv.index("--saver")
    assert argv[i + 1] == "python3 upload.py --dir '/checkpoints/a b'"
    assert argv[i + 2:] == ["--", "python", "train.py"]
    assert [a for a in argv if a != argv[i + 1]] == [*plain[:i], "--saver", *plain[i:]]
    filled = [re.sub(r"\{\{[^}]*rank\}\}", "1", a).replace("{{workflow.name}}", "wf")
              for a in argv[2:]]
    cfg, _ = parse(filled)
    assert cfg.saver == ("python3", "upload.py", "--dir", "/checkpoints/a b")


@pytest.mark.parametrize("saver,says", [
    ("up.py 'x", "saver: saver \"up.py 'x\" cannot be parsed"),
    ("  ", "saver: saver is empty"),
    ("up.py --job {{workflow.name}}", "contains '{{' or '}}'"),
])
def test_the_job_spec_refuses_a_saver_that_cannot_run(saver: str, says: str) -> None:
    with pytest.raises(JobSpecError, match=re.escape(says)):
        JobSpec.parse({"image": "img", "command": ["python", "t.py"], "saver": saver})


# -- end to end --------------------------------------------------------------------------------

E2E_SAVER = """\
import os, sys, time
rank = os.environ["RANK"]
marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"crashed-{rank}")
if not os.path.exists(marker):
    open(marker, "w").close()
    print(f"first start rank {rank} world {os.environ['WORLD_SIZE']}", flush=True)
    time.sleep(0.5)
    print(f"crashing at {time.time():.3f}", flush=True)
    sys.exit(1)
print(f"back at {time.time():.3f}", flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.e2e
def test_run_with_a_saver_that_crashes_once(tmp_path: Path) -> None:
    saver = tmp_path / "saver.py"
    saver.write_text(E2E_SAVER)
    job = Job(tmp_path, ["--workers", "2", "--lost-timeout", "2", "--no-prewarm", "--quiet",
                         "--saver", f"{sys.executable} {saver}"],
              [sys.executable, "-c", "import time; time.sleep(8)"])
    assert job.wait(timeout=120) == 0, job.output
    for rank in (0, 1):
        prefix = re.escape(f"[rank {rank} saver] ")
        assert re.search(rf"^{prefix}first start rank {rank} world 2$", job.output, re.M), \
            job.output
        crashed = re.search(rf"^{prefix}crashing at ([\d.]+)$", job.output, re.M)
        back = re.search(rf"^{prefix}back at ([\d.]+)$", job.output, re.M)
        assert crashed and back, job.output
        assert 2.5 <= float(back.group(1)) - float(crashed.group(1)) <= 3.0 + 2.5, job.output
    for rank in (0, 1):
        assert f"rank {rank}: the saver ended (exit code 1); restarting it in 3 s (restart 1)" \
            in job.output
    assert job.status()["status"]["phase"] == "Succeed"
    assert_nothing_left(str(saver))
    assert_nothing_left(str(tmp_path))
