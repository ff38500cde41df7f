"""Observability end to end: one real local job (real nats-server, master, supervisors, child
processes) with an injected crash, watched through /metrics, /progress, ``status --json``, the
fault log, the final metrics snapshot and the timeline picture.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aegis_flow.master.faultlog import KEYS, read_records
from tests.jobs import ROOT, Job, assert_nothing_left, http_get

pytestmark = pytest.mark.e2e

STEPPER = str(ROOT / "tests" / "fixtures" / "stepper.py")
PHASES_OF_ONE_CRASH = ["Pending", "BootChecking", "RunCommand", "Troubleshooting", "RunCommand",
                       "Succeed"]
SUMMARY = "job Succeed: max restarts 2, restarted 1 times; hardware faults rescheduled 0 times"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(scrape: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in scrape.items() if n == name and want <= ls)


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aegis_flow.cli", *args, "--state-dir",
                           str(tmp)], capture_output=True, text=True, timeout=60, cwd=tmp)


def test_metrics_fault_log_status_and_timeline_of_a_job_with_one_crash(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--workers", "2", "--max-retry", "2", "--lost-timeout", "2",
                         "--no-prewarm", "--inject", "crash:rank=1:after=1.5s"],
              [sys.executable, STEPPER, "6", str(tmp_path)])
    job.wait_for("restart 1", count=2, timeout=150)  # both ranks run their second epoch
    port = int((tmp_path / "job" / "metrics.port").read_text())
    base = f"http://127.0.0.1:{port}"
    assert http_get(base + "/healthz")[0] == 200
    assert http_get(base + "/readyz")[0] == 200
    assert http_get(base + "/nope")[0] == 404

    # the heartbeats carry the restarted children's numbers: poll until they arrive
    deadline = time.monotonic() + 30
    while True:
        scrape = samples(http_get(base + "/metrics")[1].decode())
        children = [value(scrape, "aegis_worker_child_restarts", rank=str(r)) for r in (0, 1)]
        rates = [value(scrape, "aegis_worker_step_rate", rank=str(r)) for r in (0, 1)]
        if children == [1, 1] and all(r > 0 for r in rates) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert children == [1, 1], scrape
    assert all(0 < r < 100 for r in rates), rates  # ~20 steps/s; a loaded machine is slower

    # the crash: detected once, one L1 recovery by SIGKILL, one troubleshoot round
    assert value(scrape, "aegis_restarts_total", cause="sigkill", level="L1") == 1
    assert value(scrape, "aegis_restarts_total") == 1
    assert value(scrape, "aegis_time_to_detect_seconds_count", kind="error") == 1
    assert 0 < value(scrape, "aegis_time_to_detect_seconds_sum", kind="error") < 30
    assert value(scrape, "aegis_time_to_recover_seconds_count", level="L1") == 1
    assert value(scrape, "aegis_check_round_seconds_count", kind="bootcheck", outcome="pass") == 1
    assert value(scrape, "aegis_check_round_seconds_count", kind="troubleshoot",
                 outcome="pass") == 1
    # every check of both workers, by round: bootcheck (round 0) and the troubleshoot (round 1)
    for check, rnd in (("env", "0"), ("io", "0"), ("runtime", "0"), ("health", "0"),
                       ("io", "1"), ("runtime", "1")):
        assert value(scrape, "aegis_check_duration_seconds_count", check_type=check, round=rnd,
                     worker_num="2", gpu_type="cpu") == 2, (check, rnd)
    assert value(scrape, "aegis_check_duration_seconds_count", check_type="env", round="1") == 0
    assert value(scrape, "aegis_check_duration_seconds_count", outcome="fail") == 0
    assert value(scrape, "aegis_jobs_created_total", gpu_type="cpu", worker_num="2") == 1
    assert value(scrape, "aegis_jobs_succeeded_total") == 0
    assert value(scrape, "aegis_job_phase", phase="RunCommand") == 1
    assert value(scrape, "aegis_job_phase") == 1
    assert value(scrape, "aegis_job_recover_count") == 1
    assert [value(scrape, "aegis_worker_retries", rank=str(r)) for r in (0, 1)] == [1, 1]

    # status --json (the KV document over NATS) against the master's own view (/progress)
    for _ in range(5):
        shown = cli(tmp_path, "status", "job", "--json")
        assert shown.returncode == 0, shown.stderr
        stored = json.loads(shown.stdout)["status"]
        live = json.loads(http_get(base + "/progress")[1])
        mine = {"phase": stored["phase"], "recover_count": stored["recover_count"],
                "seq": stored["seq"],
                "workers": [(w["rank"], w["phase"], w["retries"], w["node"])
                            for w in stored["workers"]]}
        theirs = {"phase": live["phase"], "recover_count": live["recover_count"],
                  "seq": live["seq"],
                  "workers": [(w["rank"], w["phase"], w["retries"], w["node"])
                              for w in live["workers"]]}
        if mine == theirs:
            break
        time.sleep(0.5)  # a transition between the two reads
    assert mine == theirs
    assert stored["phase"] == "RunCommand" and stored["recover_count"] == 1

    assert job.wait(timeout=150) == 0, job.output
    assert_nothing_left(str(tmp_path))
    assert SUMMARY in "\n".join(job.output.splitlines()[-3:]), job.output  # runner, at the end

    # after the end: status reads the final document, and says the summary
    final = (tmp_path / "job" / "status.json").read_text()
    shown = cli(tmp_path, "status", "job", "--json")
    assert json.loads(shown.stdout) == json.loads(final)
    table = cli(tmp_path, "status", "job", "--watch", "0.2")
    assert table.returncode == 0 and SUMMARY in table.stdout, table

    # the final metrics snapshot beside the fault log
    snap = samples((tmp_path / "job" / "logs" / "metrics.prom").read_text())
    assert value(snap, "aegis_jobs_succeeded_total", gpu_type="cpu", worker_num="2") == 1
    assert value(snap, "aegis_job_phase", phase="Succeed") == 1

    check_fault_log(read_records(tmp_path / "job" / "logs"))
    printed = cli(tmp_path, "logs", "job", "--json")
    assert printed.returncode == 0
    assert len(printed.stdout.splitlines()) == len(read_records(tmp_path / "job" / "logs"))

    picture = tmp_path / "timeline.png"
    drawn = cli(tmp_path, "report", "job", "-o", str(picture))
    assert drawn.returncode == 0, drawn.stderr
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    pixels = imread(str(picture))
    assert pixels.shape[0] > 200 and pixels.shape[1] > 600
    assert pixels.std() > 0.05  # bars, marks and text, not a blank canvas


def check_fault_log(records: list[dict[str, Any]]) -> None:
    """Every record well-formed; every phase transition of the job and of each worker is there
    as an end of the old phase and a start of the new one, at the same time, in order."""
    assert records
    for rec in records:
        assert set(KEYS) <= set(rec), rec
    rows: dict[Any, list[dict[str, Any]]] = {}
    for rec in records:
        if rec["kind"] in ("phase_start", "phase_end"):
            rows.setdefault(rec["rank"], []).append(rec)
    assert sorted(rows, key=str) == [0, 1, None]
    for rank, lines in rows.items():
        starts = [r["Phase"] for r in lines if r["kind"] == "phase_start"]
        assert starts == PHASES_OF_ONE_CRASH, (rank, starts)
        assert lines[0]["kind"] == "phase_start"
        for i in range(1, len(lines), 2):  # (end of old, start of new) pairs
            end, start = lines[i], lines[i + 1]
            assert (end["kind"], start["kind"]) == ("phase_end", "phase_start"), (rank, i)
            assert end["Phase"] == lines[i - 1]["Phase"]
            assert end["TimeStamp"] == start["TimeStamp"]
    errors = [r for r in records if r["kind"] == "report" and r["cause"] == "sigkill"]
    assert [(r["rank"], r["Phase"]) for r in errors] == [(1, "RunCommand")]
    assert errors[0]["PodName"] == "job-worker-1" and errors[0]["NodeName"] == "local-node-1"
    assert errors[0]["PodIP"] and errors[0]["NodeIP"]
    finishes = [r for r in records if r["kind"] == "report" and r["Message"].startswith("Finish")]
    assert len(finishes) == 6  # bootcheck, troubleshoot, command: 2 workers each
    recovered = [r for r in records if r["kind"] == "recovered"]
    assert [(r["cause"], r["level"]) for r in recovered] == [("sigkill", "L1")]
    assert records[-1]["kind"] == "summary" and records[-1]["Message"] == SUMMARY
    stamps = [r["TimeStamp"] for r in records]
    assert stamps == sorted(stamps)
