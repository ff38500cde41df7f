"""Credentials end to end: ``aegis-flow run`` with auth on (the default), a job that outlives
its workers' JWTs, and an unauthenticated client shut out. Real processes, real nats-server,
real gRPC.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import nats
import pytest

from aegis_flow.local.runner import LocalJob, RunConfig
from tests.jobs import SLEEPER, Job, assert_nothing_left, retries

pytestmark = pytest.mark.e2e


def test_a_job_longer_than_the_jwt_lifetime_renews_and_succeeds(tmp_path: Path) -> None:
    # 8 s JWTs (short enough to renew twice or more here, long enough that a loaded machine
    # still starts a supervisor before its first JWT runs out) and a 14 s command
    job = Job(tmp_path, ["--workers", "2", "--jwt-lifetime", "8", "--lost-timeout", "3",
                         "--no-prewarm"],
              [sys.executable, SLEEPER, "14", "0", str(tmp_path)])
    job.wait_for("restart 0", count=2, timeout=90)

    async def anonymous() -> str:
        try:
            nc = await nats.connect(job.nats_url(), connect_timeout=2, allow_reconnect=False,
                                    max_reconnect_attempts=0)
        except Exception as exc:  # noqa: BLE001 - what we expect
            return str(exc)
        await nc.close()
        return "connected"

    assert "authorization violation" in asyncio.run(anonymous()).lower()
    assert job.wait(timeout=120) == 0, job.output
    doc = job.status()
    assert doc["status"]["phase"] == "Succeed"
    assert retries(doc) == (0, 0)  # reconnecting with a fresh JWT is no failure
    assert job.output.count("credentials renewed") >= 4, job.output  # 2 workers, 2+ each
    for rank in (0, 1):
        creds = tmp_path / "job" / "creds" / f"{rank}.creds"
        assert os.stat(creds).st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "job" / "token").st_mode & 0o777 == 0o600
    assert_nothing_left(str(tmp_path))


def test_insecure_nats_starts_no_credential_step_and_says_so(tmp_path: Path) -> None:
    secure = LocalJob(RunConfig(command=("true",), workers=1, state_dir=tmp_path))
    secure.grpc_addr = "127.0.0.1:1"
    args = secure._worker_args(0)
    assert args[args.index("-m") + 1] == "aegis_flow.security.worker_init"
    assert "--creds" in args and "--auth-dir" in secure._master_args()
    plain = LocalJob(RunConfig(command=("true",), workers=1, state_dir=tmp_path, secure=False))
    assert "worker_init" not in " ".join(plain._worker_args(0))
    assert "--auth-dir" not in plain._master_args()
    job = Job(tmp_path, ["--workers", "1", "--insecure-nats", "--no-prewarm"],
              [sys.executable, SLEEPER, "0.1", "0", str(tmp_path)])
    assert job.wait(timeout=90) == 0, job.output
    assert "WITHOUT authentication" in job.output and "debugging only" in job.output.lower()
    assert "worker-init" not in job.output
