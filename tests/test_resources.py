"""The resource sampler: fake /proc and /sys trees, a fake NVML, and one real child process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aegis_flow.supervisor.resources import (
    Sampler,
    parse_net_dev,
    parse_proc_stat,
    parse_rss_status,
)

CLK = 100
PAGE = 4096

NET_DEV = """Inter-|   Receive                          |  Transmit
 face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop fifo
    lo: {lo} 10 0 0 0 0 0 0 {lo} 10 0 0 0 0 0 0
  eth0: {rx} 20 0 0 0 0 0 0 {tx} 20 0 0 0 0 0 0
  eth1: {rx} 20 0 0 0 0 0 0 {tx} 20 0 0 0 0 0 0
"""


def stat_text(pid: int, utime: int, stime: int, comm: str = "py (x) y") -> str:
    # fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
    return (f"{pid} ({comm}) S 1 1 1 0 -1 4194304 100 0 0 0 {utime} {stime} 0 0 20 0 1 0 "
            "123 456 789\n")


def write_proc(root: Path, pid: int, utime: int, stime: int, rss_kb: int | None,
               statm_pages: int = 0) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(stat_text(pid, utime, stime))
    status = "Name:\tpy\nState:\tS (sleeping)\n"
    if rss_kb is not None:
        status += f"VmRSS:\t  {rss_kb} kB\n"
    (d / "status").write_text(status)
    (d / "statm").write_text(f"1000 {statm_pages} 10 1 0 50 0\n")


def write_net(root: Path, rx: int, tx: int, lo: int) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "net" / "dev").write_text(NET_DEV.format(rx=rx, tx=tx, lo=lo))


def write_ib(sys_root: Path, dev: str, port: int, rcv_words: int, xmit_words: int) -> None:
    d = sys_root / "class" / "infiniband" / dev / "ports" / str(port) / "counters"
    d.mkdir(parents=True, exist_ok=True)
    (d / "port_rcv_data").write_text(f"{rcv_words}\n")
    (d / "port_xmit_data").write_text(f"{xmit_words}\n")


def sampler(tmp_path: Path, **kw: Any) -> Sampler:
    kw.setdefault("gpus", False)
    return Sampler(proc=tmp_path / "proc", sys=tmp_path / "sys", clk_tck=CLK, page_size=PAGE,
                   **kw)


def test_parsers() -> None:
    assert parse_proc_stat(stat_text(7, 30, 12, comm="a) (b")) == 42
    assert parse_rss_status("Name:\tx\nVmRSS:\t  2048 kB\n") == 2048 * 1024
    assert parse_rss_status("Name:\tx\n") is None
    assert parse_net_dev(NET_DEV.format(rx=5, tx=6, lo=99)) == {"eth0": (5, 6), "eth1": (5, 6)}


def test_cpu_percent_from_two_samples_and_rss(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_proc(proc, 11, utime=100, stime=50, rss_kb=300_000)
    s = sampler(tmp_path)
    first = s.sample(10.0, [11])
    assert first["procs"] == [{"pid": 11, "cpu": None, "rss": 300_000 * 1024}]
    # 2 s later: 150 more ticks at 100 Hz = 1.5 CPU-seconds → 75 %
    write_proc(proc, 11, utime=200, stime=100, rss_kb=310_000)
    second = s.sample(12.0, [11])
    assert second["procs"] == [{"pid": 11, "cpu": 75.0, "rss": 310_000 * 1024}]


def test_rss_falls_back_to_statm_and_gone_pid_is_bare(tmp_path: Path) -> None:
    write_proc(tmp_path / "proc", 12, 1, 1, rss_kb=None, statm_pages=256)  # no VmRSS (kernel
    out = sampler(tmp_path).sample(1.0, [12, 99])                         # thread-like)
    assert out["procs"] == [{"pid": 12, "cpu": None, "rss": 256 * PAGE}, {"pid": 99}]


def test_net_rates_exclude_lo(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_net(proc, rx=1000, tx=2000, lo=0)
    s = sampler(tmp_path)
    assert "net" not in s.sample(0.0, [])  # no rate from one reading
    write_net(proc, rx=1000 + 4_000_000, tx=2000 + 1_000_000, lo=10**12)  # lo: a flood, ignored
    # two interfaces each +4 MB rx / +1 MB tx over 2 s
    assert s.sample(2.0, [])["net"] == {"rx": 4_000_000, "tx": 1_000_000}


def test_net_counter_reset_gives_no_rate_for_that_reading(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_net(proc, rx=10**9, tx=10**9, lo=0)
    s = sampler(tmp_path)
    s.sample(0.0, [])
    write_net(proc, rx=5, tx=5, lo=0)
    assert "net" not in s.sample(1.0, [])
    write_net(proc, rx=1005, tx=2005, lo=0)
    assert s.sample(2.0, [])["net"] == {"rx": 2000, "tx": 4000}


def test_infiniband_counters_count_four_byte_words(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    write_ib(sys_root, "mlx5_0", 1, 0, 0)
    write_ib(sys_root, "mlx5_1", 1, 0, 0)
    s = sampler(tmp_path)
    assert "ib" not in s.sample(0.0, [])
    write_ib(sys_root, "mlx5_0", 1, 1_000_000, 500_000)
    write_ib(sys_root, "mlx5_1", 1, 1_000_000, 0)
    # (1e6 + 1e6) words × 4 bytes over 2 s; 5e5 words × 4 over 2 s
    assert s.sample(2.0, [])["ib"] == {"rx": 4_000_000, "tx": 1_000_000}


def test_no_ib_no_net_no_pids_is_an_empty_dict(tmp_path: Path) -> None:
    s = sampler(tmp_path)
    assert s.sample(0.0, []) == {} and s.sample(1.0, []) == {}


# -- NVML --------------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


class FakeNvml:
    """The slice of pynvml the sampler uses; ``fail`` names calls that raise NVMLError."""

    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    nvmlEventTypeXidCriticalError = 8
    NVMLError = NVMLError

    def __init__(self, count: int = 2, fail: frozenset[str] = frozenset(),
                 xids: list[tuple[int, int]] | None = None) -> None:
        self.count, self.fail = count, fail
        self.xids = list(xids or [])
        self.shut = False

    def _maybe(self, name: str) -> None:
        if name in self.fail:
            raise NVMLError(name)

    def nvmlInit(self) -> None:
        self._maybe("init")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        self._maybe("count")
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._maybe("handle")
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        self._maybe("util")
        return SimpleNamespace(gpu=90 + h, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        self._maybe("mem")
        return SimpleNamespace(used=(h + 1) * 10**9, total=80 * 10**9)

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        self._maybe("temp")
        return 60 + h

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        self._maybe("ecc")
        return 0

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        self._maybe("pcie")
        return 1000 + counter  # KB/s

    def nvmlEventSetCreate(self) -> str:
        self._maybe("events")
        return "set"

    def nvmlDeviceRegisterEvents(self, h: int, kinds: int, events: str) -> None:
        self._maybe("register")

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0
        if not self.xids:
            raise NVMLError("timeout")
        index, code = self.xids.pop(0)
        return SimpleNamespace(device=index, eventData=code)

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlEventSetFree(self, events: str) -> None:
        pass


def test_nvml_absent_means_no_gpus_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml → ImportError
    s = sampler(tmp_path, gpus=True)
    assert "gpus" not in s.sample(0.0, []) and "gpus" not in s.sample(1.0, [])


def test_nvml_init_raising_means_no_gpus_key(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fail=frozenset({"init"})))
    write_proc(tmp_path / "proc", 5, 1, 1, rss_kb=100)
    out = sampler(tmp_path, gpus=True).sample(0.0, [5])
    assert "gpus" not in out and out["procs"][0]["rss"] == 100 * 1024


def test_nvml_from_sys_modules_every_key(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(count=2, xids=[(1, 79), (1, 48)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = sampler(tmp_path, gpus=True, pcie=True)
    gpus = s.sample(0.0, [])["gpus"]
    assert gpus == [
        {"i": 0, "util": 90, "mem": 10**9, "temp": 60, "ecc": 0,
         "pcie_rx": 1001 * 1024, "pcie_tx": 1000 * 1024},
        {"i": 1, "util": 91, "mem": 2 * 10**9, "temp": 61, "ecc": 0,
         "pcie_rx": 1001 * 1024, "pcie_tx": 1000 * 1024, "xid": [79, 48]},
    ]
    assert "xid" not in s.sample(1.0, [])["gpus"][1]  # drained: only new events are reported
    s.close()
    assert fake.shut


def test_nvml_queries_raising_leave_keys_out_never_raise(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(fail=frozenset({"util", "ecc", "events"}))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = sampler(tmp_path, gpus=True)
    assert s.sample(0.0, [])["gpus"] == [{"i": 0, "mem": 10**9, "temp": 60},
                                         {"i": 1, "mem": 2 * 10**9, "temp": 61}]
    fake.fail = frozenset({"handle"})  # GPUs fell off the bus: index-only entries
    assert s.sample(1.0, [])["gpus"] == [{"i": 0}, {"i": 1}]
    fake.fail = frozenset({"count"})  # NVML itself broken now: no gpus key, other keys stay
    write_proc(tmp_path / "proc", 5, 1, 1, rss_kb=100)
    out = s.sample(2.0, [5])
    assert "gpus" not in out and out["procs"][0]["pid"] == 5


def test_gpus_false_never_imports_nvml(tmp_path: Path) -> None:
    def boom(name: str) -> Any:
        raise AssertionError(f"imported {name}")
    assert sampler(tmp_path, gpus=False, import_module=boom).sample(0.0, []) == {}


def test_size_bound_eight_gpus_eight_procs(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    pids = list(range(4_000_000, 4_000_008))
    for pid in pids:
        write_proc(proc, pid, 10**9, 10**9, rss_kb=10**9)
    write_net(proc, 10**15, 10**15, 0)
    for n in range(8):
        write_ib(sys_root, f"mlx5_{n}", 1, 0, 0)
    fake = FakeNvml(count=8, xids=[(i, 79) for i in range(8) for _ in range(5)])
    fake.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=80 * 10**9)  # type: ignore
    fake.nvmlDeviceGetTotalEccErrors = lambda h, k, c: 10**6  # type: ignore
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = sampler(tmp_path, gpus=True, pcie=True)
    s.sample(0.0, pids)
    for pid in pids:
        write_proc(proc, pid, 2 * 10**9, 2 * 10**9, rss_kb=10**9)
    write_net(proc, 2 * 10**15, 2 * 10**15, 0)
    for n in range(8):
        write_ib(sys_root, f"mlx5_{n}", 1, 10**15, 10**15)
    fake.xids = [(i, 79) for i in range(8) for _ in range(5)]
    out = s.sample(0.001, pids)
    assert {"procs", "net", "ib", "gpus"} <= out.keys()
    assert [len(g["xid"]) for g in out["gpus"]] == [4] * 8  # 5 each queued, 4 kept
    size = len(json.dumps(out, separators=(",", ":")))
    assert size < 2048, size


# -- the real thing ----------------------------------------------------------------------------


def test_real_child_process_cpu_and_rss() -> None:
    busy = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", busy])
    try:
        s = Sampler(gpus=False)
        t0 = time.monotonic()
        first = s.sample(t0, [child.pid])
        assert first["procs"][0]["cpu"] is None
        time.sleep(0.8)
        second = s.sample(time.monotonic(), [child.pid])
        entry = second["procs"][0]
        assert entry["pid"] == child.pid
        assert entry["cpu"] > 20, entry  # a busy loop: ~100 % of a core, less on a loaded box
        assert entry["rss"] > 1024 * 1024, entry
        assert second["net"]["rx"] >= 0  # the real /proc/net/dev parses
        json.dumps(second)
    finally:
        child.kill()
        child.wait()
