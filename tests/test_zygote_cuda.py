"""The fork server never forks a CUDA context (issue 19: CUDA-safe pre-warming).

A process forked from one that initialised CUDA cannot use CUDA ("Cannot re-initialize CUDA in
forked subprocess"), so the pre-warmed interpreter must import torch without touching CUDA,
and refuse to fork if anything it imported did. Real zygote processes:

* the default preload (torch, dynamo, DDP, torch.distributed) leaves CUDA uninitialised: the
  zygote gets ready, and a forked child sees torch warm and CUDA untouched — this test fails if
  ``torch.cuda.is_initialized()`` is true in the fork server, since the zygote then refuses;
* the planted error: a preload module that initialises CUDA (``fixtures/preload``) — the zygote
  says why and forks nothing, and a real ``aegis-flow run`` starts its rank cold and succeeds.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from aegis_flow.supervisor.prewarm import Zygote
from tests.jobs import Job, assert_nothing_left

HERE = Path(__file__).resolve().parent
PRELOAD_DIR = str(HERE / "fixtures" / "preload")
CHILD = """\
import sys
import torch
print(f"warm={'torch.distributed' in sys.modules} cuda={torch.cuda.is_initialized()}",
      flush=True)
"""


def _env(preload: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": PRELOAD_DIR + os.pathsep
           + os.environ.get("PYTHONPATH", "")}
    env.pop("AEGIS_PRELOAD", None)
    if preload is not None:
        env["AEGIS_PRELOAD"] = preload
    return env


def test_the_default_preload_leaves_cuda_alone_and_the_child_sees_torch_warm(
        tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = _env(None)  # the default: torch, torch._dynamo, torch.nn.parallel, torch.distributed

    async def go() -> tuple[bool, str, list[str], int]:
        z = Zygote([sys.executable, str(script)], env)
        try:
            ready = await z.ready(120)
            lines: list[str] = []
            if not ready:
                return ready, z.refused, lines, -1
            child = await z.spawn([sys.executable, str(script)], env, prefix="",
                                  tail_lines=5, on_line=lines.append)
            status = await child.wait()
            return ready, z.refused, lines, status.code
        finally:
            z.close()

    ready, refused, lines, code = asyncio.run(go())
    assert ready and not refused, refused
    assert code == 0 and lines == ["warm=True cuda=False"], lines


def test_a_preload_that_initialises_cuda_is_refused_and_says_why(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = _env("torch,fake_cuda_init")

    async def go() -> tuple[bool, str, int | None]:
        z = Zygote([sys.executable, str(script)], env)
        try:
            ready = await z.ready(120)
            await asyncio.wait_for(asyncio.to_thread(z.proc.wait), 30)
            return ready, z.refused, z.proc.returncode
        finally:
            z.close()

    ready, refused, code = asyncio.run(go())
    assert not ready and code == 0
    assert refused.startswith("the pre-warmed interpreter initialised CUDA while importing "
                              "torch, fake_cuda_init: a forked child cannot use"), refused


@pytest.mark.e2e
def test_a_job_whose_preload_initialises_cuda_still_trains_cold(tmp_path: Path) -> None:
    sleeper = str(HERE / "fixtures" / "sleeper.py")
    job = Job(tmp_path, ["--workers", "1", "--max-retry", "0"], ["python", sleeper, "0.5"],
              env={"AEGIS_PRELOAD": "torch,fake_cuda_init",
                   "PYTHONPATH": PRELOAD_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert job.wait(180) == 0, job.output
    assert "the pre-warmed interpreter initialised CUDA while importing" in job.output
    assert "[rank 0] done" in job.output
    assert_nothing_left(str(tmp_path))
