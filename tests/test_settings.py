"""aegis_flow.settings: one table of defaults, the cross-field rules, the AEGIS_* contract.

Fast unit tests (no processes), except one real `aegis-flow run` per bad value at the end.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aegis_flow import settings as s
from aegis_flow.local.runner import LocalJob, RunConfig
from aegis_flow.master.runtime import MasterConfig
from aegis_flow.settings import LOCAL, MASTER, WORKER, ConfigError
from aegis_flow.supervisor.agent import WorkerConfig

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "aegis_flow"
NAME = re.compile(r"\bAEGIS_[A-Z][A-Z0-9_]*")


def defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING}


# ---------------------------------------------------------------- one source of defaults


def test_the_master_config_takes_its_defaults_from_the_table() -> None:
    from aegis_flow.master.creds import SecurityConfig

    ours = defaults(MasterConfig)
    security = defaults(SecurityConfig)  # the credentials' settings live there
    for name, value in dataclasses.asdict(MASTER).items():
        assert (security if name in ("jwt_lifetime", "revoke_grace") else ours)[name] == value, \
            name


def test_the_worker_config_takes_its_defaults_from_the_table() -> None:
    ours = defaults(WorkerConfig)
    for name, value in dataclasses.asdict(WORKER).items():
        assert ours[name] == value, name


def test_the_run_config_takes_its_defaults_from_the_table() -> None:
    ours = defaults(RunConfig)
    assert (ours["connect_timeout"], ours["lost_timeout"], ours["max_retry"]) == (
        MASTER.connect_timeout, MASTER.lost_timeout, MASTER.max_retry)
    assert (ours["heartbeat"], ours["grace"]) == (WORKER.heartbeat_interval, WORKER.grace)
    assert (ours["job"], str(ours["state_dir"]), ours["max_process_restarts"]) == (
        LOCAL.job, LOCAL.state_dir, LOCAL.max_process_restarts)
    assert ours["jwt_lifetime"] == MASTER.jwt_lifetime


def test_the_master_command_line_defaults_are_the_table() -> None:
    from aegis_flow.master.__main__ import build_parser

    a = build_parser().parse_args(["--job", "j", "--workers", "1", "--nats-url", "nats://x"])
    for name in ("namespace", "max_retry", "flap_limit", "connect_timeout", "lost_timeout",
                 "replace_timeout", "linger", "jwt_lifetime"):
        assert getattr(a, name) == getattr(MASTER, name), name


def test_the_worker_command_line_defaults_are_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from aegis_flow.supervisor.__main__ import build_parser

    for var in ("AEGIS_NAMESPACE", "AEGIS_NATS_URL", "AEGIS_WORK_DIR", "POD_IP"):
        monkeypatch.delenv(var, raising=False)
    a = build_parser().parse_args(["--job", "j"])
    assert (a.namespace, a.nats_url, a.pod_ip, a.work_dir) == (
        WORKER.namespace, WORKER.nats_url, WORKER.pod_ip, WORKER.work_dir)
    assert (a.connect_timeout, a.master_timeout, a.heartbeat, a.grace) == (
        WORKER.connect_timeout, WORKER.master_timeout, WORKER.heartbeat_interval, WORKER.grace)
    assert (a.hang_after, a.hang_quit_after) == (WORKER.hang_after, WORKER.hang_quit_after)


def test_the_run_command_line_defaults_are_the_table() -> None:
    from aegis_flow.cli import build_parser

    a = build_parser().parse_args(["run", "--workers", "1", "--", "true"])
    assert (a.max_retry, a.connect_timeout, a.lost_timeout, a.jwt_lifetime) == (
        MASTER.max_retry, MASTER.connect_timeout, MASTER.lost_timeout, MASTER.jwt_lifetime)
    assert (a.job, str(a.state_dir), a.metrics_port) == (
        LOCAL.job, LOCAL.state_dir, LOCAL.metrics_port)


def test_master_timeout_drift_is_gone() -> None:
    """Regression (issue 12): WorkerConfig.master_timeout was 60.0 while --master-timeout
    defaulted to 90.0; 60 was not even more than the master's connect timeout (60)."""
    from aegis_flow.supervisor.__main__ import build_parser

    cli = build_parser().parse_args(["--job", "j"]).master_timeout
    assert defaults(WorkerConfig)["master_timeout"] == cli == WORKER.master_timeout
    assert WORKER.master_timeout > MASTER.connect_timeout


def test_the_defaults_obey_every_rule() -> None:
    s.check_master(MasterConfig(job="j", workers=1))
    s.check_worker(WorkerConfig(command=("x",), job="j", rank=0, world_size=1))
    s.check_local(RunConfig(command=("x",), workers=1))
    assert s.master_timeout_for(MASTER.connect_timeout) == WORKER.master_timeout


@pytest.mark.parametrize("connect_timeout", [1.0, 60.0, 600.0])
def test_local_workers_wait_for_the_master_longer_than_it_waits_for_them(
        connect_timeout: float) -> None:
    job = LocalJob(RunConfig(command=("x",), workers=1, connect_timeout=connect_timeout))
    args = job._worker_args(0)
    master_timeout = float(args[args.index("--master-timeout") + 1])
    assert master_timeout > connect_timeout
    s.check_worker(WorkerConfig(command=("x",), job="j", rank=0, world_size=1,
                                master_timeout=master_timeout),
                   master_connect_timeout=connect_timeout)


# ---------------------------------------------------------------- the rules

MASTER_OK = MasterConfig(job="j", workers=2)
WORKER_OK = WorkerConfig(command=("x",), job="j", rank=0, world_size=2)
LOCAL_OK = RunConfig(command=("x",), workers=2)


@pytest.mark.parametrize("change,message", [
    ({"workers": 0}, "workers (0) must be at least 1: pass --workers 1 or more"),
    ({"max_retry": -1}, "max-retry (-1) must be at least 0"),
    ({"flap_limit": -2}, "flap-limit (-2) must be at least 0"),
    ({"connect_timeout": 0.0}, "the connect timeout (0 s) must be more than 0 seconds"),
    ({"lost_timeout": -1.0}, "the lost timeout (-1 s) must be more than 0 seconds"),
    ({"lost_timeout": float("nan")}, "the lost timeout (nan s)"),
    ({"replace_timeout": float("inf")}, "(inf s) must be more than 0 seconds, and finite: "
                                        "pass --replace-timeout with a positive number"),
    ({"linger": -1.0}, "linger (-1 s) must be 0 or more seconds"),
    ({"lost_timeout": 0.75}, "lost timeout (0.75 s) must be at least twice the workers' "
                             "heartbeat interval (0.5 s), or one late heartbeat loses a worker: "
                             "raise --lost-timeout to 1 or more"),
], ids=str)
def test_bad_master_settings_are_named_with_their_fix(change: dict[str, Any],
                                                      message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        s.check_master(dataclasses.replace(MASTER_OK, **change))


@pytest.mark.parametrize("change,message", [
    ({"world_size": 0, "rank": 0}, "world size (0) must be at least 1"),
    ({"rank": 2}, "rank (2) must be within 0..1 (world size 2): pass --rank"),
    ({"rank": -1}, "rank (-1) must be within 0..1"),
    ({"connect_timeout": 0.0}, "the NATS connect timeout (0 s)"),
    ({"heartbeat_interval": 0.0}, "the heartbeat interval (0 s)"),
    ({"heartbeat_interval": 2.0}, "lost timeout (3 s) must be at least twice the workers' "
                                  "heartbeat interval (2 s), or one late heartbeat loses a "
                                  "worker: lower --heartbeat to 1.5 or less"),
    ({"grace": -1.0}, "grace (-1 s) must be 0 or more seconds"),
    ({"hang_after": 10.0, "hang_quit_after": 5.0},
     "hang-after (10 s) must be shorter than hang-quit-after (5 s): raise --hang-quit-after "
     "above 10 or lower --hang-after"),
    ({"hang_after": 5.0, "hang_quit_after": 5.0}, "hang-after (5 s) must be shorter"),
    ({"master_timeout": 30.0},
     "a worker's master timeout (30 s) must exceed the master's connect timeout (60 s)"),
    ({"master_timeout": 60.0}, "raise --master-timeout above 60"),
], ids=str)
def test_bad_worker_settings_are_named_with_their_fix(change: dict[str, Any],
                                                      message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        s.check_worker(dataclasses.replace(WORKER_OK, **change))


@pytest.mark.parametrize("change,message", [
    ({"workers": 0}, "workers (0) must be at least 1"),
    ({"max_retry": -1}, "max-retry (-1)"),
    ({"lost_timeout": -1.0}, "the lost timeout (-1 s) must be more than 0 seconds: pass "
                             "--lost-timeout"),
    ({"connect_timeout": 0.0}, "the connect timeout (0 s)"),
    ({"jwt_lifetime": 0.0}, "the JWT lifetime (0 s)"),
    ({"hang_after": 1000.0}, "hang-after (1000 s) must be shorter than hang-quit-after "
                             "(900 s, the default)"),
    ({"hang_quit_after": 100.0}, "hang-after (300 s, the default) must be shorter"),
    ({"hang_after": 7.0, "hang_quit_after": 7.0}, "hang-after (7 s) must be shorter"),
    ({"heartbeat": 2.0}, "at least twice the workers' heartbeat interval (2 s)"),
    ({"max_process_restarts": -1}, "max_process_restarts (-1)"),
], ids=str)
def test_bad_local_settings_are_named_with_their_fix(change: dict[str, Any],
                                                     message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        s.check_local(dataclasses.replace(LOCAL_OK, **change))


def test_run_job_refuses_bad_settings_before_starting_anything(tmp_path: Path) -> None:
    from aegis_flow.local.runner import run_job

    with pytest.raises(ConfigError, match="workers"):
        run_job(RunConfig(command=("true",), workers=0, state_dir=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_config_error_is_a_value_error_printed_on_one_line() -> None:
    import io

    out = io.StringIO()
    assert s.report(ConfigError("workers (0) must be at least 1"), out) == 2
    assert out.getvalue() == "aegis-flow: error: workers (0) must be at least 1\n"
    assert issubclass(ConfigError, ValueError)


# ---------------------------------------------------------------- the AEGIS_* contract


def env_names_in(paths: list[Path]) -> dict[str, list[str]]:
    """Every AEGIS_* word in the string literals (docstrings included) of these files."""
    seen: dict[str, list[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in NAME.findall(node.value):
                    seen.setdefault(name, []).append(f"{path.name}:{node.lineno}")
    return seen


def unlisted(paths: list[Path]) -> dict[str, list[str]]:
    return {name: where for name, where in env_names_in(paths).items()
            if name not in s.ENV and name not in s.LOG_MARKERS}


PACKAGE = sorted(p for p in PKG.rglob("*.py") if p.name != "settings.py")


def test_every_aegis_variable_in_the_package_is_in_the_table() -> None:
    assert unlisted(PACKAGE) == {}, "add these to aegis_flow.settings.ENV_VARS"


def test_the_table_lists_no_variable_the_package_never_mentions() -> None:
    stale = set(s.ENV) - set(env_names_in(PACKAGE))
    assert stale == set()


def test_the_check_catches_a_planted_unknown_variable(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('import os\n"""Reads $AEGIS_DOCUMENTED_ONLY."""\n'
                       'x = os.environ.get("AEGIS_PLANTED_KNOB", "")\n'
                       'y = f"{x}AEGIS_IN_FSTRING"\nDEFAULT_AEGIS_IMAGE = "not a variable"\n'
                       'z = os.environ.get("AEGIS_JOB")  # listed\n')
    assert sorted(unlisted([planted])) == ["AEGIS_DOCUMENTED_ONLY", "AEGIS_IN_FSTRING",
                                           "AEGIS_PLANTED_KNOB"]


def test_the_table_is_well_formed() -> None:
    assert len(s.ENV) == len(s.ENV_VARS)  # each name once
    assert {v.kind for v in s.ENV_VARS} <= {"bool", "int", "float", "str"}
    assert all(v.reader and v.meaning and v.set_by for v in s.ENV_VARS)
    assert {v.name for v in s.ENV_VARS if v.test_only} == {
        "AEGIS_TEST_DROP", "AEGIS_TEST_SLOW_RANK", "AEGIS_TIMING"}
    assert not s.LOG_MARKERS & set(s.ENV)


@pytest.mark.parametrize("name,raw,default,expected", [
    ("AEGIS_TIMING", "1", False, True), ("AEGIS_TIMING", " Off ", True, False),
    ("AEGIS_TIMING", "", True, True), ("AEGIS_EXPECT_GPUS", "8", 0, 8),
    ("AEGIS_EXPECT_GPUS", "  ", 3, 3), ("AEGIS_JOB", "train", "", "train"),
    ("AEGIS_PRELOAD", "", "torch", ""),  # a set, empty string is a value
    ("AEGIS_JOB", None, "dflt", "dflt"),
], ids=str)
def test_env_value_parses_as_the_table_says(name: str, raw: str | None, default: Any,
                                            expected: Any) -> None:
    environ = {} if raw is None else {name: raw}
    assert s.env_value(name, default, environ=environ) == expected


@pytest.mark.parametrize("name,raw,default,message", [
    ("AEGIS_TIMING", "maybe", False, "AEGIS_TIMING='maybe': expected 1/true/yes/on"),
    ("AEGIS_EXPECT_GPUS", "two", 0, "AEGIS_EXPECT_GPUS='two': expected a whole number (GPUs "
                                    "this node must have (unset: any)): fix it or unset it"),
    ("AEGIS_ZYGOTE_FD", "3.5", -1, "AEGIS_ZYGOTE_FD='3.5': expected a whole number"),
], ids=str)
def test_a_malformed_variable_is_a_clear_error(name: str, raw: str, default: Any,
                                               message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        s.env_value(name, default, environ={name: raw})


def test_reading_an_unlisted_variable_is_a_programming_error() -> None:
    with pytest.raises(KeyError, match="AEGIS_NOT_LISTED is not in"):
        s.env_value("AEGIS_NOT_LISTED", "", environ={})
    with pytest.raises(TypeError, match="AEGIS_EXPECT_GPUS is parsed as int"):
        s.env_value("AEGIS_EXPECT_GPUS", "", environ={"AEGIS_EXPECT_GPUS": "2"})


def test_settings_import_only_the_standard_library() -> None:
    tree = ast.parse((PKG / "settings.py").read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, roots


def test_the_docs_show_the_tables_of_the_code() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    begin, end = "<!-- BEGIN tables: python -m aegis_flow.settings -->\n", "<!-- END tables -->"
    assert doc[doc.index(begin) + len(begin):doc.index(end)] == s.markdown()


# ---------------------------------------------------------------- the command lines


@pytest.mark.parametrize("args,message", [
    (["--workers", "0"], "workers (0) must be at least 1"),
    (["--lost-timeout", "-1"], "the lost timeout (-1 s) must be more than 0 seconds"),
    (["--hang-after", "60", "--hang-quit-after", "60"], "hang-after (60 s) must be shorter"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_run_rejects_a_bad_value_in_one_line(tmp_path: Path, args: list[str],
                                             message: str) -> None:
    """The real CLI, in a process: one line on stderr, exit 2, nothing started."""
    base = ["--workers", "2"] if "--workers" not in args else []
    out = subprocess.run([sys.executable, "-m", "aegis_flow.cli", "run", *base, *args,
                          "--state-dir", str(tmp_path), "--", "true"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("aegis-flow: error: "), out.stderr
    assert message in out.stderr
    assert not (tmp_path / "job").exists()


def test_the_master_command_rejects_a_bad_value_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    from aegis_flow.master.__main__ import main

    assert main(["--job", "j", "--workers", "2", "--nats-url", "nats://127.0.0.1:1",
                 "--connect-timeout", "-5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aegis-flow: error: the connect timeout (-5 s)") and err.count("\n") == 1


def test_the_worker_command_rejects_a_bad_value_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    from aegis_flow.supervisor.__main__ import parse

    with pytest.raises(SystemExit) as exc:
        parse(["--job", "j", "--rank", "0", "--world-size", "1", "--master-timeout", "30",
               "--", "true"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == ("aegis-flow: error: a worker's master timeout (30 s) must exceed the "
                   "master's connect timeout (60 s), or it runs alone while the master still "
                   "waits for its peers: raise --master-timeout above 60\n")
