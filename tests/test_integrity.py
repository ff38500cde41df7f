"""The checkpoint integrity gate: real torch.save files, a real single-process DCP save."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

import pytest

from aegis_flow.supervisor import integrity
from aegis_flow.supervisor.integrity import (
    DIR_MANIFEST,
    RESUME_LINK,
    Damaged,
    Kind,
    Problem,
    candidates,
    damaged_name,
    gate,
    record,
    verify,
)

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2025, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
STAMP = "20250304T050607Z"


def state(step: int) -> dict[str, object]:
    """What examples/train_ddp.py saves: a model and SGD (momentum) and Adam optimizer state."""
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    adam = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    sgd.step()
    adam.step()
    return {"step": step, "model": model.state_dict(), "optimizer": sgd.state_dict(),
            "adam": adam.state_dict()}


def save_file(path: Path, step: int = 1) -> Path:
    torch.save(state(step), path)
    return path


def save_dcp(path: Path, step: int = 1) -> Path:
    model = state(step)["model"]
    with warnings.catch_warnings():  # "torch.distributed is disabled ... single process"
        warnings.simplefilter("ignore")
        dcp.save({"model": model}, checkpoint_id=str(path))
    return path


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_byte(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


def storage_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".distcp")


# --- single files ------------------------------------------------------------------------------


def test_a_good_file_passes_and_says_its_checksum_was_not_checked(tmp_path: Path) -> None:
    verdict = verify(save_file(tmp_path / "ckpt-1.pt"))
    assert verdict.ok and verdict.kind is Kind.FILE and verdict.problem is None
    assert "no manifest recorded: sha256 not checked" in verdict.reason


def test_a_good_file_with_a_manifest_passes_on_its_checksum(tmp_path: Path) -> None:
    path = save_file(tmp_path / "ckpt-1.pt")
    manifest = record(path)
    assert manifest == tmp_path / "ckpt-1.pt.aegis-sha256.json"
    entry = json.loads(manifest.read_text())["files"]["ckpt-1.pt"]
    assert entry["size"] == path.stat().st_size and len(entry["sha256"]) == 64
    verdict = verify(path)
    assert verdict.ok and "sha256 matches the manifest" in verdict.reason


@pytest.mark.parametrize("with_manifest", [False, True], ids=["no-manifest", "manifest"])
def test_a_file_cut_to_half_its_bytes_is_truncated(tmp_path: Path, with_manifest: bool) -> None:
    path = save_file(tmp_path / "ckpt-1.pt")
    if with_manifest:
        record(path)
    truncate(path)
    verdict = verify(path)
    assert not verdict.ok and verdict.problem is Problem.TRUNCATED
    assert verdict.reason.startswith("truncated: ")
    if not with_manifest:
        assert "torch.load failed: " in verdict.reason


def test_a_flipped_byte_with_a_manifest_fails_on_its_checksum(tmp_path: Path) -> None:
    path = save_file(tmp_path / "ckpt-1.pt")
    record(path)
    flip_byte(path)
    verdict = verify(path)
    assert not verdict.ok and verdict.problem is Problem.CHECKSUM
    assert verdict.reason == "checksum: ckpt-1.pt's sha256 differs from the manifest's"


def test_a_flipped_byte_without_a_manifest_is_caught_by_the_zip_crcs(tmp_path: Path) -> None:
    path = save_file(tmp_path / "ckpt-1.pt")
    flip_byte(path, at=0.3)
    verdict = verify(path)
    assert not verdict.ok and verdict.problem in (Problem.CHECKSUM, Problem.UNREADABLE)


def test_garbage_and_empty_files_and_missing_paths(tmp_path: Path) -> None:
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    (tmp_path / "empty.pt").write_bytes(b"")
    assert verify(tmp_path / "garbage.pt").problem is Problem.UNREADABLE
    assert verify(tmp_path / "empty.pt").problem is Problem.TRUNCATED
    missing = verify(tmp_path / "nope.pt")
    assert (missing.ok, missing.kind, missing.problem) == (False, Kind.MISSING, Problem.MISSING)


def test_a_file_with_a_non_tensor_object_is_not_unpickled_and_not_called_damaged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ckpt-1.pt"
    torch.save({"when": datetime(2025, 1, 1)}, path)  # not on weights_only's allow-list
    verdict = verify(path)
    assert verdict.ok and "refused a non-tensor object" in verdict.reason


# --- DCP directories ---------------------------------------------------------------------------


def test_a_good_dcp_directory_passes_with_and_without_a_manifest(tmp_path: Path) -> None:
    path = save_dcp(tmp_path / "step_00010")
    verdict = verify(path)
    assert verdict.ok and verdict.kind is Kind.DCP
    assert "no manifest recorded: checksums not checked" in verdict.reason
    assert record(path) == path / DIR_MANIFEST
    listed = json.loads((path / DIR_MANIFEST).read_text())["files"]
    assert ".metadata" in listed and {p.name for p in storage_files(path)} <= set(listed)
    assert verify(path).ok and "checksums match the manifest" in verify(path).reason


def test_a_dcp_directory_without_a_storage_file_is_incomplete(tmp_path: Path) -> None:
    path = save_dcp(tmp_path / "step_00010")
    shard = storage_files(path)[0]
    shard.unlink()
    verdict = verify(path)
    assert not verdict.ok and verdict.problem is Problem.INCOMPLETE
    assert f"storage file {shard.name}, named by .metadata, is missing" in verdict.reason


def test_a_dcp_directory_without_its_metadata_is_incomplete(tmp_path: Path) -> None:
    path = save_dcp(tmp_path / "step_00010")
    (path / ".metadata").unlink()
    verdict = verify(path)
    assert not verdict.ok and verdict.problem is Problem.INCOMPLETE
    assert "no .metadata" in verdict.reason


def test_a_dcp_directory_with_a_cut_storage_file_is_truncated(tmp_path: Path) -> None:
    path = save_dcp(tmp_path / "step_00010")
    truncate(storage_files(path)[0])
    assert verify(path).problem is Problem.TRUNCATED


def test_a_dcp_directory_with_unparseable_metadata_is_unreadable(tmp_path: Path) -> None:
    path = save_dcp(tmp_path / "step_00010")
    (path / ".metadata").write_bytes(b"\x00garbage")
    assert verify(path).problem is Problem.UNREADABLE


def test_a_dcp_directory_whose_shard_differs_from_the_manifest(tmp_path: Path) -> None:
    path = save_dcp(tmp_path / "step_00010")
    record(path)
    flip_byte(storage_files(path)[0])
    assert verify(path).problem is Problem.CHECKSUM


# --- candidates --------------------------------------------------------------------------------


def test_candidates_newest_first_skipping_ours_temporaries_and_the_moved_aside(
    tmp_path: Path,
) -> None:
    for name in ("ckpt-90.pt", "ckpt-120.pt", "ckpt-100.pt", "ckpt-foo.pt",
                 "ckpt-120.pt.aegis-sha256.json", "ckpt-130.pt.tmp", ".ckpt-140.pt.1.tmp",
                 f"ckpt-150.pt.damaged-{STAMP}", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "ckpt-step_00110").mkdir()
    (tmp_path / RESUME_LINK).symlink_to("ckpt-90.pt")
    assert [p.name for p in candidates(tmp_path, "ckpt-*")] == [
        "ckpt-120.pt", "ckpt-step_00110", "ckpt-100.pt", "ckpt-90.pt", "ckpt-foo.pt"]
    assert [p.name for p in candidates(tmp_path, "*.pt")] == [
        "ckpt-120.pt", "ckpt-100.pt", "ckpt-90.pt", "ckpt-foo.pt"]


def test_candidates_without_numbers_go_by_modification_time(tmp_path: Path) -> None:
    for age, name in enumerate(("new.pt", "mid.pt", "old.pt")):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, ns=(1_000_000_000 * (10 - age),) * 2)
    assert [p.name for p in candidates(tmp_path, "*.pt")] == ["new.pt", "mid.pt", "old.pt"]


def test_damaged_names_are_utc_and_never_collide() -> None:
    name = damaged_name("ckpt-1.pt", NOW)
    assert name == f"ckpt-1.pt.damaged-{STAMP}"
    assert damaged_name("ckpt-1.pt", NOW, [name]) == f"{name}-2"
    assert damaged_name("ckpt-1.pt", NOW, [name, f"{name}-2"]) == f"{name}-3"


# --- the gate ----------------------------------------------------------------------------------


def test_the_gate_catches_a_planted_truncation(tmp_path: Path) -> None:
    """Not a checker that always passes: the newest checkpoint is cut in half and must be caught."""
    good = save_file(tmp_path / "ckpt-100.pt", 100)
    bad = save_file(tmp_path / "ckpt-110.pt", 110)
    record(bad)
    truncate(bad)
    result = gate(tmp_path, "ckpt-*", now=NOW)
    assert result.chosen == good and result.error is None
    moved = tmp_path / f"ckpt-110.pt.damaged-{STAMP}"
    assert result.damaged == (Damaged(bad, result.damaged[0].reason, moved),)
    assert result.damaged[0].reason.startswith("truncated: ")
    assert not bad.exists() and moved.is_file()  # moved aside, never deleted
    assert (tmp_path / f"{moved.name}.aegis-sha256.json").is_file()  # its manifest went along
    link = tmp_path / RESUME_LINK
    assert link.is_symlink() and os.readlink(link) == "ckpt-100.pt" and result.link == link
    assert link.resolve() == good.resolve()
    assert result.messages == (
        f"checkpoint ckpt-110.pt is damaged ({result.damaged[0].reason}): moved aside to "
        f"{moved.name}; resuming from ckpt-100.pt",)
    # the next gate sees only the good one, and replaces the link in place
    again = gate(tmp_path, "ckpt-*", now=NOW)
    assert again.chosen == good and again.damaged == ()
    assert again.messages[0].startswith("resuming from ckpt-100.pt, the newest of 1 checkpoint")


def test_the_gate_reads_no_older_checkpoint_than_the_first_good_one(tmp_path: Path) -> None:
    (tmp_path / "ckpt-1.pt").write_bytes(b"damaged, but older than a good one")
    save_file(tmp_path / "ckpt-2.pt")
    result = gate(tmp_path, now=NOW)
    assert result.chosen == tmp_path / "ckpt-2.pt" and result.damaged == ()
    assert (tmp_path / "ckpt-1.pt").exists()


def test_a_gate_with_nothing_chooses_nothing(tmp_path: Path) -> None:
    assert gate(tmp_path, now=NOW) == integrity.GateResult(
        None, messages=("no checkpoint found: starting without one",))
    missing = gate(tmp_path / "not-yet", now=NOW)
    assert missing.chosen is None and missing.error is None
    assert missing.messages == (f"no checkpoint directory {tmp_path / 'not-yet'}: starting "
                                "without a checkpoint",)


def test_a_gate_with_only_damaged_checkpoints_removes_the_stale_link(tmp_path: Path) -> None:
    (tmp_path / "ckpt-5.pt").write_bytes(b"junk")
    (tmp_path / RESUME_LINK).symlink_to("ckpt-5.pt")
    result = gate(tmp_path, now=NOW)
    assert result.chosen is None and len(result.damaged) == 1
    assert not (tmp_path / RESUME_LINK).is_symlink()
    assert result.messages[-1].endswith("; no good checkpoint left: starting without one")


def test_a_gate_that_cannot_read_the_directory_says_so(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    result = gate(not_a_dir, now=NOW)
    assert result.chosen is None and result.error is not None
    assert result.messages == (result.error,)
    assert result.error.startswith(f"cannot read the checkpoint directory {not_a_dir}: ")


# --- the command line (a real subprocess) ------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aegis_flow.supervisor.integrity", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.e2e  # two interpreters that import torch: ~5 s
def test_cli_verify_exits_0_for_good_and_1_for_damaged(tmp_path: Path) -> None:
    good = save_file(tmp_path / "ckpt-1.pt")
    ok = cli("verify", str(good))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"{good}: ok (file): readable by torch.load")
    truncate(good)
    bad = cli("verify", str(good))
    assert bad.returncode == 1 and bad.stdout.startswith(f"{good}: damaged (file): truncated: ")


@pytest.mark.e2e  # two interpreters that import torch: ~5 s
def test_cli_gate_moves_aside_and_exits_1(tmp_path: Path) -> None:
    save_file(tmp_path / "ckpt-100.pt")
    (tmp_path / "ckpt-110.pt").write_bytes(b"junk")
    out = cli("gate", str(tmp_path), "--pattern", "ckpt-*.pt")
    assert out.returncode == 1, out.stderr
    assert "checkpoint ckpt-110.pt is damaged (unreadable: torch.load failed" in out.stdout
    assert out.stdout.rstrip().endswith("; resuming from ckpt-100.pt")
    again = cli("gate", str(tmp_path), "--json")
    assert again.returncode == 0
    assert json.loads(again.stdout)["chosen"] == str(tmp_path / "ckpt-100.pt")


def test_cli_usage_and_help(tmp_path: Path) -> None:
    assert cli().returncode == 2
    assert cli("gate").returncode == 2
    assert cli("verify", "a", "b").returncode == 2
    helped = cli("--help")
    assert helped.returncode == 0 and "verify" in helped.stdout and "gate" in helped.stdout
    assert "exit status: 0 good" in helped.stdout
    assert "--pattern GLOB" in cli("gate", "--help").stdout
