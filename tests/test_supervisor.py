"""The supervisor's process control: child lifecycle, signals, reaping, pre-warmed starts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aegis_flow.supervisor import child as childmod
from aegis_flow.supervisor.prewarm import Zygote, python_command

ENV = {**os.environ, "AEGIS_PRELOAD": ""}


def test_child_exit_codes_signals_and_tail() -> None:
    async def go() -> None:
        c = await childmod.start([sys.executable, "-c", "print('a'); print('b'); exit(3)"],
                                 ENV, prefix="[t] ")
        st = await c.wait()
        assert (st.code, st.signal, st.tail, st.cause) == (3, None, ("a", "b"), "exit code 3")
        c = await childmod.start(["sleep", "30"], ENV)
        c.signal_group(signal.SIGKILL)
        st = await c.wait()
        assert st.signal == signal.SIGKILL and st.cause == "killed by SIGKILL"
        assert st.shell_code == 128 + signal.SIGKILL
    asyncio.run(go())


def test_stop_escalates_to_sigkill_after_the_grace_period() -> None:
    async def go() -> None:
        c = await childmod.start(["sh", "-c", "trap '' TERM; sleep 30"], ENV)
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        st = await c.stop(grace=0.5)
        assert 0.4 < time.monotonic() - t0 < 5
        assert st.signal == signal.SIGKILL
    asyncio.run(go())


def test_reap_orphans_reaps_only_unknown_children() -> None:
    stray = subprocess.Popen(["true"])
    time.sleep(0.3)  # now a zombie child of ours
    assert childmod.reap_orphans(lambda pid: pid == stray.pid) == 0  # ours: left alone
    assert childmod.reap_orphans(lambda pid: False) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(stray.pid, os.WNOHANG)


def test_sigterm_is_forwarded_to_the_command_in_fallback_mode(tmp_path: Path) -> None:
    script = tmp_path / "trap.sh"
    script.write_text("trap 'echo got-term; exit 0' TERM\necho ready\n"
                      "while :; do sleep 0.1; done\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "aegis_flow.cli", "worker", "--job", "j", "--rank", "0",
         "--world-size", "1", "--nats-url", "nats://127.0.0.1:1", "--connect-timeout", "1",
         "--", "sh", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "ready" in proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "got-term" in out
    assert proc.returncode == 0


@pytest.mark.parametrize("cmd,expected", [
    (["python", "train.py"], True), (["python3.11", "-u", "train.py", "--x"], True),
    (["/usr/bin/python3", "-m", "pkg.mod"], True), (["python", "-c", "print(1)"], False),
    (["torchrun", "train.py"], False), (["python"], False), (["sh", "-c", "x"], False),
], ids=str)
def test_which_commands_are_forked_from_the_prewarmed_interpreter(
        cmd: list[str], expected: bool) -> None:
    assert python_command(cmd) is expected


def test_prewarmed_interpreter_runs_scripts_with_argv_env_and_exit_codes(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import os, sys, time\nprint('argv', sys.argv[1:], os.environ['X'])\n"
                      "time.sleep(float(os.environ.get('NAP', '0')))\n"
                      "sys.exit(int(sys.argv[1]))\n")
    crash = tmp_path / "crash.py"
    crash.write_text("raise RuntimeError('boom')\n")

    async def go() -> None:
        z = Zygote([sys.executable, str(script)], ENV)
        try:
            assert await z.ready(30)
            c = await z.spawn([sys.executable, str(script), "5"], {**ENV, "X": "hello"},
                              prefix="", tail_lines=5, on_line=None)
            st = await c.wait()
            assert st.code == 5 and "argv ['5'] hello" in st.tail
            c = await z.spawn([sys.executable, str(crash)], ENV, prefix="", tail_lines=20,
                              on_line=None)
            st = await c.wait()
            assert st.code == 1 and any("RuntimeError: boom" in line for line in st.tail)
            c = await z.spawn([sys.executable, str(script), "0"], {**ENV, "X": "y", "NAP": "30"},
                              prefix="", tail_lines=5, on_line=None)
            c.signal_group(signal.SIGKILL)
            st = await c.wait()
            assert st.signal == signal.SIGKILL
        finally:
            z.close()
        assert z.proc.poll() is not None
    asyncio.run(go())


def test_prewarmed_interpreter_runs_a_warm_module_with_dash_m_like_a_cold_python() -> None:
    """The check CLI is imported in the pre-warmed interpreter; ``-m`` must still run it as
    __main__ once, without runpy's "found in sys.modules" warning in the rank's output."""
    lines: list[str] = []

    async def go() -> None:
        warm = {**ENV, "AEGIS_PRELOAD": "aegis_flow.steps.cli"}  # warm it, not torch
        z = Zygote([sys.executable, "-m", "aegis_flow.steps.cli"], warm)
        try:
            assert await z.ready(60)
            c = await z.spawn([sys.executable, "-m", "aegis_flow.steps.cli", "explain"], ENV,
                              prefix="", tail_lines=5, on_line=lines.append)
            st = await c.wait()
            assert st.code == 0
        finally:
            z.close()

    asyncio.run(go())
    text = "\n".join(lines)
    assert "T10" in text or "hardware" in text  # the diagnosis table really printed
    assert "RuntimeWarning" not in text and "found in sys.modules" not in text


def test_refused_credentials_are_told_from_network_faults() -> None:
    import nats.errors

    from aegis_flow.supervisor.agent import lockout_exit_code, refused_credentials

    assert refused_credentials(nats.errors.AuthorizationError())
    assert refused_credentials(nats.errors.Error("nats: -ERR 'Authorization Violation'"))
    assert refused_credentials(nats.errors.Error("nats: 'User Authentication Revoked'"))
    assert refused_credentials(nats.errors.Error("nats: 'User Authentication Expired'"))
    for fault in (ConnectionRefusedError(111, "Connection refused"), asyncio.TimeoutError(),
                  nats.errors.StaleConnectionError(), nats.errors.Error("nats: slow consumer"),
                  None):
        assert not refused_credentials(fault), fault
    # a retired worker's pod is recreated unless its command had already succeeded
    assert lockout_exit_code(None) == lockout_exit_code(1) == lockout_exit_code(-9) == 71
    assert lockout_exit_code(0) == 0


def test_a_prewarmed_rank_shows_in_ps_as_the_users_command(tmp_path: Path) -> None:
    """``ps`` shows a forked rank as the user's command (and its rank and work dir), not as
    ``zygote.py``; ``top``'s name is the script's; the zygote keeps its own command line."""
    script = tmp_path / "my_train.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(30)\n")
    seen: dict[str, str] = {}

    async def go() -> None:
        z = Zygote([sys.executable, str(script)], ENV, str(tmp_path))
        try:
            assert await z.ready(30)
            env = {**ENV, "RANK": "3", "AEGIS_WORK_DIR": str(tmp_path)}
            c = await z.spawn([sys.executable, str(script), "--lr", "0.1"], env, prefix="",
                              tail_lines=5, on_line=None)
            for _ in range(100):
                if c.last_output is not None:
                    break
                await asyncio.sleep(0.05)
            for who, pid in (("child", c.pid), ("zygote", z.proc.pid)):
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                seen[who] = raw.replace(b"\0", b" ").decode().strip()
                seen[who + "-comm"] = Path(f"/proc/{pid}/comm").read_text().strip()
            c.signal_group(signal.SIGKILL)
            await c.wait()
        finally:
            z.close()

    asyncio.run(go())
    assert seen["child"] == (f"{sys.executable} {script} --lr 0.1 [aegis-flow rank 3 · "
                             f"{tmp_path}]")
    assert seen["child-comm"] == "my_train.py"
    assert seen["zygote"].endswith(f"zygote.py {tmp_path}") and seen["zygote-comm"] == \
        "aegis-zygote"
