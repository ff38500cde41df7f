"""A healthy rank's collateral traceback is printed as one line; a real error is not touched."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from aegis_flow.supervisor import child as childmod
from aegis_flow.supervisor.fold import TracebackFolder, peer_failure

# What rank 0 of a real gloo job printed when rank 1 os._exit()ed during all_reduce (torch 2.13)
GLOO = (Path(__file__).parent / "fixtures" / "gloo_peer_reset.txt").read_text(
    encoding="utf-8").rstrip("\n")

FOLDED = ("this rank stopped because a peer failed (RuntimeError: Read error [127.0.0.1]:32170: "
          "Connection reset by peer); its 9-line traceback is folded "
          "(AEGIS_FOLD_TRACEBACKS=0 prints it)")

USER_ERROR = """\
Traceback (most recent call last):
  File "train.py", line 3, in <module>
    load()
  File "train.py", line 2, in load
    raise ValueError('my bug')
ValueError: my bug"""


def run(folder: TracebackFolder, text: str) -> list[str]:
    out = [shown for line in text.splitlines() for shown in folder.feed(line)]
    return out + folder.flush()


def test_a_peer_failure_is_one_line_and_the_output_around_it_is_kept() -> None:
    text = f"step 10 loss 0.5\n{GLOO}\nafter"
    assert run(TracebackFolder(), text) == ["step 10 loss 0.5", FOLDED, "after"]


def test_a_users_own_error_is_printed_whole() -> None:
    assert run(TracebackFolder(), USER_ERROR) == USER_ERROR.splitlines()


@pytest.mark.parametrize("line", [
    "RuntimeError: NCCL communicator was aborted on rank 0.",
    "torch.distributed.DistNetworkError: failed to recv, got 0 bytes",
    "RuntimeError: [pair.cc:598] Connection closed by peer [10.0.0.2]:4242",
])
def test_other_peer_failures_are_recognised(line: str) -> None:
    assert peer_failure(line) is not None


def test_an_unfinished_traceback_is_printed_at_the_end() -> None:
    head = GLOO.splitlines()[:3]
    assert run(TracebackFolder(), "\n".join(head)) == head


def test_a_real_process_traceback_is_folded_on_the_way_out(
        capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    script = ("import sys\nprint('step 1', flush=True)\n"
              "raise RuntimeError('[pair.cc:537] Read error [127.0.0.1]:1: Connection reset "
              "by peer. This is typically caused by a remote worker hanging. GLHF!')\n")

    async def go(fold: str) -> childmod.ExitStatus:
        monkeypatch.setenv("AEGIS_FOLD_TRACEBACKS", fold)
        child = await childmod.start([sys.executable, "-c", script], {}, prefix="[rank 0] ")
        return await child.wait()

    status = asyncio.run(go("1"))
    lines = capfd.readouterr().out.splitlines()
    assert lines[0] == "[rank 0] step 1"
    assert lines[1].startswith("[rank 0] this rank stopped because a peer failed (RuntimeError: "
                               "Read error [127.0.0.1]:1: Connection reset by peer); its ")
    assert len(lines) == 2
    assert any("Traceback" in line for line in status.tail)  # the tail keeps it all
    asyncio.run(go("0"))
    assert "[rank 0] Traceback (most recent call last):" in capfd.readouterr().out
