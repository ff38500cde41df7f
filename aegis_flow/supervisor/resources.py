"""What one worker's processes, network and GPUs are doing now: one small dict per heartbeat.

The first monitoring layer: every supervisor samples its training process(es), its node's
network and its GPUs continuously, so the master can see a metric's *shape* change (GPU
utilisation drops to zero, bandwidth collapses, memory only grows) before anything fails.
:class:`Sampler` turns the kernel's counters into rates between two calls; the rules that judge
the samples across ranks live in :mod:`aegis_flow.master.anomaly` (pure).

Standard library only (it runs in the user's image). Side effects, all in :class:`Sampler`:
it reads files under its ``proc`` root (``/proc``: ``PID/stat``, ``PID/status``, ``PID/statm``,
``net/dev``) and its ``sys`` root (``/sys``: ``class/infiniband/*/ports/*/counters/
port_{rcv,xmit}_data``); on its first :meth:`Sampler.sample` it imports ``pynvml`` (package
``nvidia-ml-py``) if present and calls ``nvmlInit`` (and registers an NVML event set for XID
errors), then queries NVML on every sample; :meth:`Sampler.close` shuts NVML down. It never
raises from :meth:`Sampler.sample`: anything it cannot read is a key left out. It keeps the
previous counters (per pid, network, InfiniBand) to compute rates; time is the caller's
``now`` (use a monotonic clock), so the parsers below are pure.

Cost: a few small file reads per pid and per IB port, plus per GPU five NVML queries
(microseconds each). ``pcie=True`` adds two ``nvmlDeviceGetPcieThroughput`` calls per GPU,
each of which samples a counter for ~20 ms in the driver: off by default (the heartbeat is
0.5 s); call :meth:`Sampler.sample` from a thread (``asyncio.to_thread``) when it is on.

The dict (JSON-able; at most ~1.5 KB for 8 processes and 8 GPUs with every key, pcie and 4
XIDs each, and 19-digit counters: the size test bounds it below 2 KB).
Every key is optional: absent when the source is missing, unreadable, or (rates) on the first
sample.

``procs``: list, one entry per pid passed, in that order:
    ``pid`` (int); ``cpu`` CPU % since the previous sample (utime+stime from ``PID/stat`` over
    wall time; 100 = one core busy, so it can exceed 100; ``None`` on a pid's first sample);
    ``rss`` resident set size in bytes (``VmRSS`` of ``PID/status``, else ``statm``). A pid
    that no longer exists is ``{"pid": N}``.
``net``: ``{"rx": B/s, "tx": B/s}``, the node's every interface but ``lo`` from ``net/dev``
    (in a container: its network namespace), ints.
``ib``: ``{"rx": B/s, "tx": B/s}``, summed over every InfiniBand port; the sysfs counters
    count 4-byte words, multiplied by 4 here. A counter that went backwards (reset; legacy
    32-bit counters saturate) gives no rate for that port this time.
``gpus``: list, one entry per GPU NVML sees: ``i`` index; ``util`` GPU utilisation %;
    ``mem`` memory used, bytes; ``temp`` °C; ``ecc`` volatile uncorrected ECC errors (since
    the driver loaded); ``xid`` list of XID error codes seen since the previous sample (only
    when there were some; at most 4); ``pcie_rx`` / ``pcie_tx`` PCIe throughput, B/s (only
    with ``pcie=True``). NVLink throughput is not sampled (NVML's counters for it differ by
    generation).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

MAX_PROCS = 16  # bounds the dict: more pids than this are sampled only up to this many
MAX_GPUS = 16
MAX_XIDS = 4  # XID codes kept per GPU per sample


def parse_proc_stat(text: str) -> int:
    """Clock ticks the process has run (utime + stime) from the text of ``/proc/PID/stat``.

    The command name (field 2) is in parentheses and may hold spaces or ')': split after the
    last ')'; utime and stime are fields 14 and 15."""
    rest = text[text.rindex(")") + 1:].split()
    return int(rest[11]) + int(rest[12])


def parse_rss_status(text: str) -> int | None:
    """Resident bytes from the text of ``/proc/PID/status`` (``VmRSS:  1234 kB``), or None."""
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) >= 2 else None
    return None


def parse_rss_statm(text: str, page_size: int) -> int:
    """Resident bytes from the text of ``/proc/PID/statm`` (its second field is pages)."""
    return int(text.split()[1]) * page_size


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """Interface → (rx bytes, tx bytes) from the text of ``/proc/net/dev``, ``lo`` excluded."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        name, _, data = line.partition(":")
        name = name.strip()
        fields = data.split()
        if name == "lo" or len(fields) < 9:
            continue
        try:
            out[name] = (int(fields[0]), int(fields[8]))
        except ValueError:
            continue
    return out


def rate(prev: tuple[float, int] | None, now: float, value: int) -> float | None:
    """Per-second change of a counter since ``prev`` (time, value): None without a previous
    value, with no time passed, or when the counter went backwards (a reset)."""
    if prev is None:
        return None
    dt, dv = now - prev[0], value - prev[1]
    if dt <= 0 or dv < 0:
        return None
    return dv / dt


def cpu_percent(prev: tuple[float, int] | None, now: float, ticks: int,
                clk_tck: int) -> float | None:
    """CPU % (100 = one core) from two (time, ticks) readings of one process."""
    per_s = rate(prev, now, ticks)
    return None if per_s is None else round(100.0 * per_s / clk_tck, 1)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


class Sampler:
    """Samples processes, network, InfiniBand and NVIDIA GPUs; see the module doc.

    ``nvml``: the ``pynvml`` module to use (tests pass a stand-in); by default imported on
    the first sample, and no GPUs are sampled if it is missing or ``nvmlInit`` fails.
    ``gpus=False`` never touches NVML."""

    def __init__(self, proc: str | os.PathLike[str] = "/proc",
                 sys: str | os.PathLike[str] = "/sys", *, gpus: bool = True,
                 pcie: bool = False, nvml: Any = None,
                 import_module: Callable[[str], Any] = importlib.import_module,
                 clk_tck: int | None = None, page_size: int | None = None) -> None:
        self._proc = Path(proc)
        self._sys = Path(sys)
        self._want_gpus = gpus
        self._pcie = pcie
        self._nv: Any = nvml
        self._import = import_module
        self._nvml_tried = False
        self._events: Any = None
        self._clk_tck = clk_tck or os.sysconf("SC_CLK_TCK")
        self._page_size = page_size or os.sysconf("SC_PAGE_SIZE")
        self._cpu: dict[int, tuple[float, int]] = {}  # pid → (time, ticks)
        self._net: dict[str, tuple[float, int, int]] = {}  # iface → (time, rx, tx)
        self._ib: dict[str, tuple[float, int, int]] = {}  # port dir → (time, rx, tx) bytes

    # -- the sample --------------------------------------------------------------------------

    def sample(self, now: float, pids: Sequence[int]) -> dict[str, Any]:
        """One heartbeat's resources dict (see the module doc); never raises."""
        out: dict[str, Any] = {}
        for key, part in (("procs", lambda: self._procs(now, pids)),
                          ("net", lambda: self._net_rates(now)),
                          ("ib", lambda: self._ib_rates(now)),
                          ("gpus", self._gpus)):
            try:
                value = part()
            except Exception:  # a sampler must not break the heartbeat
                continue
            if value:
                out[key] = value
        return out

    def _procs(self, now: float, pids: Sequence[int]) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        seen: dict[int, tuple[float, int]] = {}
        for pid in list(pids)[:MAX_PROCS]:
            entry: dict[str, Any] = {"pid": pid}
            base = self._proc / str(pid)
            stat = _read(base / "stat")
            if stat is not None:
                try:
                    ticks = parse_proc_stat(stat)
                except (ValueError, IndexError):
                    pass
                else:
                    entry["cpu"] = cpu_percent(self._cpu.get(pid), now, ticks, self._clk_tck)
                    seen[pid] = (now, ticks)
            rss = self._rss(base)
            if rss is not None:
                entry["rss"] = rss
            entries.append(entry)
        self._cpu = seen  # pids not asked for any more are forgotten
        return entries

    def _rss(self, base: Path) -> int | None:
        status = _read(base / "status")
        if status is not None:
            try:
                found = parse_rss_status(status)
            except ValueError:
                found = None
            if found is not None:
                return found
        statm = _read(base / "statm")
        if statm is not None:
            try:
                return parse_rss_statm(statm, self._page_size)
            except (ValueError, IndexError):
                return None
        return None

    def _net_rates(self, now: float) -> dict[str, int] | None:
        text = _read(self._proc / "net" / "dev")
        if text is None:
            return None
        counters = {name: (now, rx, tx) for name, (rx, tx) in parse_net_dev(text).items()}
        result = _sum_rates(self._net, counters, now)
        self._net = counters
        return result

    def _ib_rates(self, now: float) -> dict[str, int] | None:
        root = self._sys / "class" / "infiniband"
        counters: dict[str, tuple[float, int, int]] = {}
        if root.is_dir():
            for counters_dir in sorted(root.glob("*/ports/*/counters")):
                rx = _read(counters_dir / "port_rcv_data")
                tx = _read(counters_dir / "port_xmit_data")
                if rx is None or tx is None:
                    continue
                try:  # the counters count 4-byte words
                    counters[str(counters_dir)] = (now, int(rx) * 4, int(tx) * 4)
                except ValueError:
                    continue
        result = _sum_rates(self._ib, counters, now)
        self._ib = counters
        return result

    # -- NVML --------------------------------------------------------------------------------

    def _nvml(self) -> Any:
        """The initialised pynvml module, or None (tried once; a failure disables GPUs)."""
        if not self._want_gpus:
            return None
        if self._nvml_tried:
            return self._nv
        self._nvml_tried = True
        try:
            nv = self._nv if self._nv is not None else self._import("pynvml")
            nv.nvmlInit()
        except Exception:  # ImportError, NVMLError, a broken install: no GPUs
            self._nv = None
            return None
        self._nv = nv
        try:
            events = nv.nvmlEventSetCreate()
            kinds = nv.nvmlEventTypeXidCriticalError
            registered = 0
            for i in range(min(int(nv.nvmlDeviceGetCount()), MAX_GPUS)):
                try:
                    nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(i), kinds, events)
                    registered += 1
                except Exception:  # not supported on this GPU
                    continue
            self._events = events if registered else None
        except Exception:  # no XID events then
            self._events = None
        return nv

    def _xids(self, nv: Any) -> dict[int, list[int]]:
        """XID codes per GPU index since the last call, drained without waiting."""
        found: dict[int, list[int]] = {}
        if self._events is None:
            return found
        for _ in range(MAX_GPUS * MAX_XIDS):  # bounded: a storm waits for the next sample
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVMLError_Timeout: none pending
                break
            try:
                index = int(nv.nvmlDeviceGetIndex(data.device))
            except Exception:
                index = -1
            codes = found.setdefault(index, [])
            if len(codes) < MAX_XIDS:
                codes.append(int(data.eventData))
        return found

    def _gpus(self) -> list[dict[str, Any]] | None:
        nv = self._nvml()
        if nv is None:
            return None
        count = min(int(nv.nvmlDeviceGetCount()), MAX_GPUS)
        xids = self._xids(nv)
        return [self._gpu(nv, i, xids.get(i)) for i in range(count)]

    def _gpu(self, nv: Any, i: int, xids: list[int] | None) -> dict[str, Any]:
        gpu: dict[str, Any] = {"i": i}
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
        except Exception:  # a lost GPU: an entry with its index only
            return gpu
        queries: list[tuple[str, Callable[[], Any]]] = [
            ("util", lambda: int(nv.nvmlDeviceGetUtilizationRates(handle).gpu)),
            ("mem", lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).used)),
            ("temp", lambda: int(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))),
            ("ecc", lambda: int(nv.nvmlDeviceGetTotalEccErrors(
                handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))),
        ]
        if self._pcie:  # NVML reports KB/s
            queries += [
                ("pcie_rx", lambda: 1024 * int(nv.nvmlDeviceGetPcieThroughput(
                    handle, nv.NVML_PCIE_UTIL_RX_BYTES))),
                ("pcie_tx", lambda: 1024 * int(nv.nvmlDeviceGetPcieThroughput(
                    handle, nv.NVML_PCIE_UTIL_TX_BYTES))),
            ]
        for key, query in queries:
            try:
                gpu[key] = query()
            except Exception:  # not supported, or failed: the key is absent
                continue
        if xids:
            gpu["xid"] = xids
        return gpu

    def close(self) -> None:
        """Free the XID event set and shut NVML down (if it was started); never raises."""
        nv, self._nv, self._nvml_tried = self._nv, None, True
        if nv is None:
            return
        try:
            if self._events is not None:
                nv.nvmlEventSetFree(self._events)
        except Exception:
            pass
        self._events = None
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def _sum_rates(prev: Mapping[str, tuple[float, int, int]],
               now_counters: Mapping[str, tuple[float, int, int]],
               now: float) -> dict[str, int] | None:
    """Summed rx/tx B/s over the counters present both times; None if none had a rate."""
    rx_total = tx_total = 0.0
    any_rate = False
    for name, (_, rx, tx) in now_counters.items():
        before = prev.get(name)
        if before is None:
            continue
        rx_rate = rate((before[0], before[1]), now, rx)
        tx_rate = rate((before[0], before[2]), now, tx)
        if rx_rate is None or tx_rate is None:
            continue
        rx_total += rx_rate
        tx_total += tx_rate
        any_rate = True
    return {"rx": int(rx_total), "tx": int(tx_total)} if any_rate else None
