"""A new user's mistakes get one line, at once, from the real CLI (issue: the first hour).

Each test runs ``aegis-flow`` in a process and asserts the exact first line of what it says;
nothing is started and no traceback is printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "aegis_flow.cli"]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_a_bad_worker_count_gets_one_message_whatever_its_sign(tmp_path: Path,
                                                               workers: str) -> None:
    out = cli("run", "--workers", workers, "--state-dir", str(tmp_path), "--", "true")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"aegis-flow: error: workers ({workers}) must be at least 1: pass --workers 1 or more"]
    assert list(tmp_path.iterdir()) == []


def test_a_state_dir_that_cannot_be_made_is_named_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    where = blocker / "state"
    out = cli("run", "--workers", "1", "--state-dir", str(where), "--", "true")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"aegis-flow: error: cannot keep job 'job' in {where}: Not a directory (choose a "
        "writable directory with --state-dir)"]


def test_a_state_dir_on_a_filesystem_that_refuses_it(tmp_path: Path) -> None:
    out = cli("run", "--workers", "1", "--state-dir", "/proc/aegis-state", "--", "true")
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert line.startswith("aegis-flow: error: cannot keep job 'job' in /proc/aegis-state: ")
    assert "Traceback" not in out.stderr


def test_stop_of_a_job_that_does_not_exist(tmp_path: Path) -> None:
    out = cli("stop", "nosuch", "--state-dir", str(tmp_path))
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"aegis-flow stop: no job 'nosuch' in {tmp_path} (give --state-dir, or --nats-url)"]


def test_stop_of_a_job_that_has_ended_says_how_it_ended(tmp_path: Path) -> None:
    from aegis_flow.master.machine import Phase, initial_status
    from aegis_flow.master.model import evolve
    from aegis_flow.master.store import encode_doc

    done = evolve(initial_status(2, 3), phase=Phase.SUCCEED, recover_count=1)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "status.json").write_bytes(encode_doc(done))
    out = cli("stop", "mine", "--state-dir", str(tmp_path))
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "aegis-flow stop: job 'mine' is not running; it ended: job Succeed: max restarts 3, "
        "restarted 1 times; hardware faults rescheduled 0 times"]


def test_a_bare_python_runs_with_aegis_flows_interpreter() -> None:
    from aegis_flow.local.runner import with_our_python

    assert with_our_python(("python", "t.py"), "/v/bin/python") == (
        ("/v/bin/python", "t.py"),
        "running 'python' as /v/bin/python (the interpreter aegis-flow runs in; give a path "
        "to use another)")
    for explicit in (("/usr/bin/python3", "t.py"), ("./env/bin/python", "t.py"),
                     ("bash", "run.sh")):
        assert with_our_python(explicit, "/v/bin/python") == (explicit, "")


@pytest.mark.e2e
def test_the_readmes_own_job_runs_as_written_without_the_venv_activated(
        tmp_path: Path) -> None:
    """README "Run your own job locally", its first command verbatim, from a shell whose
    PATH has no venv (the `python` it finds, if any, has no torch)."""
    import os
    import shlex

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    section = readme[readme.index("## Run your own job locally"):]
    block = section[section.index("```sh\n") + 6:section.index("\n```", section.index("```sh"))]
    (line,) = [x for x in block.splitlines() if x.startswith(".venv/bin/aegis-flow run")]
    for name in (".venv", "examples"):  # the checkout as the user has it, in a fresh cwd
        (tmp_path / name).symlink_to(root / name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    out = subprocess.run(shlex.split(line), cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[aegis-flow] running 'python' as /" in out.stderr  # the venv's, with torch
    assert "job succeeded" in out.stderr + out.stdout


def test_status_says_each_ranks_state_in_words() -> None:
    from aegis_flow.local.status import render
    from aegis_flow.master.machine import Ack, Error, initial_status, step
    from aegis_flow.master.store import encode_doc

    s = initial_status(2, 3)
    for r in range(2):
        s, _ = step(s, Ack(r, f"pod-{r}", node=f"n{r}"))
    s, _ = step(s, Error(1, s.seq, cause="SIGKILL"))
    table = render(encode_doc(s))
    assert "True" not in table and "False" not in table
    header = next(line for line in table.splitlines() if line.lstrip().startswith("rank"))
    assert header.split()[:5] == ["rank", "inner", "phase", "retries", "state"]


@pytest.mark.parametrize(("command", "first_line"), [
    (["python", "nosuchfile.py"], "aegis-flow: error: the script 'nosuchfile.py' does not exist "
                                  "(in {cwd}): nothing was started"),
    (["nosuchcmd", "--foo"], "aegis-flow: error: the command 'nosuchcmd' is not found on PATH: "
                             "nothing was started"),
    (["./nope.sh"], "aegis-flow: error: the command './nope.sh' is not an executable file "
                    "(in {cwd}): nothing was started"),
], ids=["script", "command", "path"])
def test_a_command_that_cannot_start_is_refused_at_once(tmp_path: Path, command: list[str],
                                                        first_line: str) -> None:
    out = cli("run", "--workers", "2", "--state-dir", str(tmp_path / "state"), "--", *command,
              cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [first_line.format(cwd=tmp_path)]
    assert not (tmp_path / "state").exists()


@pytest.mark.e2e
def test_the_users_own_exception_is_shown_without_our_frames(tmp_path: Path) -> None:
    """A script that raises: the job fails at the second identical failure (T16), and what the
    user reads is their own traceback, not the pre-warmed interpreter's frames."""
    (tmp_path / "bug.py").write_text("def load():\n    raise ValueError('my bug: shape "
                                     "mismatch')\n\n\nload()\n")
    out = cli("run", "--workers", "2", "--quiet", "--state-dir", str(tmp_path / "state"), "--",
              "python", "bug.py", cwd=tmp_path)
    assert out.returncode == 1
    text = out.stdout + out.stderr
    assert "zygote.py" not in text and "runpy" not in text
    assert 'File "bug.py", line 2, in load' in text  # as `python bug.py` shows it
    summary = next(line for line in text.splitlines()
                   if line.startswith("[aegis-flow] job Failed: "))
    assert "the same error: ValueError: my bug: shape mismatch" in summary, summary


@pytest.mark.e2e
def test_an_injection_that_never_fired_is_named_at_the_end(tmp_path: Path) -> None:
    """The job ends before the crash is due: the run says the fault was never injected, so a
    green run is not mistaken for a recovery. The exit fault that did fire is not named; a
    second run of the same job fires it again (the markers belong to a run)."""
    args = ["run", "--workers", "2", "--quiet", "--fresh", "--state-dir", str(tmp_path / "s"),
            "--inject", "crash:rank=1:after=600s", "--inject", "exit:rank=0:after=0.5s:code=3",
            "--", "python", "-c", "import time; time.sleep(3)"]
    for _ in range(2):
        out = cli(*args, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        warnings = [line for line in out.stderr.splitlines() if "never fired" in line]
        assert warnings == [
            "[aegis-flow] WARNING: --inject crash:rank=1:after=600s never fired: rank 1's "
            "command never ran 600 s in run 0 (it ended or was stopped sooner, or the rank does "
            "not exist)"], out.stderr
        assert "[aegis-flow inject] exiting with code 3" in out.stdout + out.stderr


@pytest.mark.e2e
def test_status_watch_follows_a_rerun_instead_of_showing_the_last_one(tmp_path: Path) -> None:
    """``status --watch`` started right after a rerun began follows the new run to its end;
    it neither shows the previous run's final table nor exits early."""
    import time

    from tests.jobs import Job

    fast = ["--workers", "2", "--quiet", "--no-prewarm", "--lost-timeout", "2"]
    assert Job(tmp_path, fast, ["true"]).wait(120) == 0
    rerun = Job(tmp_path, fast, ["sleep", "6"])
    from aegis_flow.local.runs import running_pid

    deadline = time.monotonic() + 30
    while running_pid(tmp_path / "job") is None:  # the rerun has begun: it holds the lock
        assert time.monotonic() < deadline and rerun.proc.poll() is None, rerun.output
        time.sleep(0.01)
    watcher = subprocess.Popen([*CLI, "status", "job", "--state-dir", str(tmp_path),
                                "--watch", "0.3"], stdout=subprocess.PIPE, text=True)
    try:
        assert rerun.wait(120) == 0, rerun.output
        ended = time.monotonic()
        out, _ = watcher.communicate(timeout=30)
        assert watcher.returncode == 0, out
        assert time.monotonic() - ended < 10
        frames = out.split("--- ")[1:]
        assert len(frames) >= 5, out  # it watched the run, not one look at the last record
        assert "RunCommand" in out  # the new run, live
        assert "the job has ended" in frames[-1]
    finally:
        watcher.kill()


def test_an_explicit_interpreter_without_torch_is_refused_at_once(tmp_path: Path) -> None:
    """``/path/to/python train.py`` names the user's interpreter: it is asked (not imported
    into) whether it has torch; the base Python under this venv has not."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    probe = subprocess.run([str(base), "-c", "import importlib.util as u; "
                            "print(u.find_spec('torch') is None)"], capture_output=True,
                           text=True)
    if probe.stdout.strip() != "True":
        pytest.skip(f"{base} has torch here: no interpreter without it to try")
    (tmp_path / "train.py").write_text("print('never')\n")
    out = cli("run", "--workers", "2", "--state-dir", str(tmp_path / "state"), "--",
              str(base), "train.py", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"aegis-flow: error: the interpreter '{base}' cannot import torch, so every rank would "
        f"fail: use a Python that has torch, or a bare 'python' to run aegis-flow's own "
        f"({sys.executable}): nothing was started"]
    assert not (tmp_path / "state").exists()


@pytest.mark.e2e
def test_ctrl_c_stops_the_job_quietly(tmp_path: Path) -> None:
    """Ctrl-C at a terminal signals the whole foreground process group: every process stops,
    the embedded NATS server last, so no worker reports a lost connection on the way out."""
    import os
    import signal
    import time

    from tests.jobs import Output, assert_nothing_left, processes_mentioning

    env = {**os.environ, "OMP_NUM_THREADS": "1", "AEGIS_PRELOAD": ""}
    run = Output([*CLI, "run", "--workers", "2", "--no-prewarm", "--state-dir", str(tmp_path),
                  "--", "sleep", "60"], env, tmp_path, start_new_session=True)
    try:
        run.wait_for("RunCommand", timeout=90)
        time.sleep(1)
        os.killpg(run.proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        assert run.proc.wait(60) == 128 + signal.SIGINT, run.output
        run._reader.join(10)
        assert "interrupted by SIGINT; stopping every process" in run.output
        assert "EOF" not in run.output and "Traceback" not in run.output, run.output
        assert_nothing_left(str(tmp_path))
    finally:
        for pid in processes_mentioning(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)
