"""The rdma check over a synthetic sysfs tree (one port ACTIVE, one DOWN)."""

from __future__ import annotations

from pathlib import Path

from aegis_flow.steps.base import CheckStatus
from aegis_flow.steps.rdma import check_rdma, read_ports


def port(root: Path, dev: str, num: int, state: str, phys: str) -> None:
    d = root / "class" / "infiniband" / dev / "ports" / str(num)
    d.mkdir(parents=True)
    (d / "state").write_text(state + "\n")
    (d / "phys_state").write_text(phys + "\n")
    (d / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (d / "link_layer").write_text("InfiniBand\n")


def test_all_ports_active_pass(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp")
    port(tmp_path, "mlx5_1", 1, "4: ACTIVE", "5: LinkUp")
    r = check_rdma(sysfs_root=tmp_path)
    assert r.status is CheckStatus.PASS and "mlx5_0/1, mlx5_1/1" in r.detail
    assert r.budget == 25.0 and r.data["ports"][0]["rate"] == "400 Gb/sec (4X NDR)"


def test_a_down_port_fails_naming_it(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp")
    port(tmp_path, "mlx5_1", 1, "1: DOWN", "3: Disabled")
    r = check_rdma(sysfs_root=tmp_path)
    assert r.status is CheckStatus.FAIL
    assert "mlx5_1/1" in r.detail and "1: DOWN" in r.detail and "mlx5_0" not in r.detail


def test_active_but_link_not_up_fails(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "7: Phy Test")
    assert check_rdma(sysfs_root=tmp_path).status is CheckStatus.FAIL


def test_unreadable_state_fails(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp")
    (tmp_path / "class/infiniband/mlx5_0/ports/1/state").unlink()
    r = check_rdma(sysfs_root=tmp_path)
    assert r.status is CheckStatus.FAIL and "unreadable" in r.detail


def test_no_rdma_device_is_not_applicable(tmp_path: Path) -> None:
    assert check_rdma(sysfs_root=tmp_path).status is CheckStatus.NOT_APPLICABLE
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    assert read_ports(tmp_path) == []
    assert check_rdma(sysfs_root=tmp_path).status is CheckStatus.NOT_APPLICABLE


def test_this_machine_has_no_rdma() -> None:
    assert check_rdma().status is CheckStatus.NOT_APPLICABLE
