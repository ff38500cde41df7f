"""Every rank's heartbeat numbers in Prometheus' text format, written when ``/metrics`` is read.

These are the per-rank series that move with every heartbeat: the supervisor's own numbers
(child restarts, heartbeat lag and delay, step and step rate, up) and the resource sample
(``supervisor/resources.py``: the training processes' CPU and memory, the node's network, and
per GPU its utilisation, memory, temperature and ECC count). At 4,096 ranks of 8 GPUs that is
about 190,000 series. Kept as ``prometheus_client`` labelled gauges they cost the master about
0.2 ms of CPU per heartbeat to write (40 label lookups) and 3 s per scrape to render: a
4,096-rank master spent all its time there (docs/benchmarks.md, "Control plane at scale").
Here the numbers stay where the heartbeat put them (the observer's per-rank views) and a scrape
formats them straight from there, one family after another, in about a tenth of the time.

PURE: formats text from the values it is given; no I/O, no clock. The series and their labels
are the ones the gauges had (``metrics.BEAT_FAMILIES`` lists them for ``exported_names``). A
rank's series appear once it has sent a heartbeat (``up``: once it beat or was found down); a
value the last heartbeat did not carry, or carried malformed, is left out, not shown stale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

MAX_PROCS = 16  # as many processes and GPUs per rank as the sampler sends at most
MAX_GPUS = 16


class View(Protocol):
    """What the renderer reads of one rank (``observer.WorkerView``)."""

    last_beat: float
    child_restarts: int
    beat_lag: float | None
    delay: float
    step_rate: float | None
    step: int | None
    up: bool
    known: bool
    resources: dict[str, Any] | None


def number(value: Any) -> float | None:
    """A finite JSON number (a bool is not one), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _fmt(value: float) -> str:
    return repr(float(value))


def escape(value: str) -> str:
    """A label value as the text format wants it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


Samples = Iterator[tuple[str, float]]  # (extra labels, already formatted as ',k="v"'; value)


def _beat(field: str, *, default: float | None = None) -> Callable[[View], Samples]:
    def get(v: View) -> Samples:
        if v.last_beat <= 0:
            return
        value = getattr(v, field)
        value = default if value is None else value
        if value is not None:
            yield "", value
    return get


def _up(v: View) -> Samples:
    if v.known:
        yield "", 1.0 if v.up else 0.0


def _procs(v: View) -> list[dict[str, Any]]:
    procs = (v.resources or {}).get("procs")
    return [p for p in procs if isinstance(p, dict)][:MAX_PROCS] if isinstance(procs, list) else []


def _proc_sum(key: str) -> Callable[[View], Samples]:
    def get(v: View) -> Samples:
        values = [x for p in _procs(v) if (x := number(p.get(key))) is not None]
        if values:
            yield "", sum(values)
    return get


def _net(v: View) -> Samples:
    res = v.resources or {}
    for link in ("net", "ib"):
        rates = res.get(link)
        if isinstance(rates, dict):
            for direction in ("rx", "tx"):
                value = number(rates.get(direction))
                if value is not None:
                    yield f',link="{link}",direction="{direction}"', value


def _gpu(key: str) -> Callable[[View], Samples]:
    def get(v: View) -> Samples:
        gpus = (v.resources or {}).get("gpus")
        if not isinstance(gpus, list):
            return
        for gpu in gpus[:MAX_GPUS]:
            if not isinstance(gpu, dict):
                continue
            index, value = number(gpu.get("i")), number(gpu.get(key))
            if index is not None and value is not None:
                yield f',gpu="{int(index)}"', value
    return get


@dataclass(frozen=True)
class Family:
    name: str
    help: str
    samples: Callable[[View], Samples]


FAMILIES: tuple[Family, ...] = (
    Family("aegis_worker_child_restarts", "Times the supervisor started the training process "
           "again (from its heartbeat)", _beat("child_restarts")),
    Family("aegis_worker_heartbeat_lag_seconds", "How late the supervisor's last heartbeat "
           "fired against its schedule (a busy or starved supervisor)", _beat("beat_lag")),
    Family("aegis_worker_heartbeat_delay_seconds", "Sent-to-handled delay of the last "
           "heartbeat (clock skew included)", _beat("delay")),
    Family("aegis_worker_step_rate", "Training steps per second of each rank (progress API), "
           "0 when not training", _beat("step_rate", default=0.0)),
    Family("aegis_worker_step", "Last training step each rank reported", _beat("step")),
    Family("aegis_worker_up", "1 while the worker's heartbeats arrive", _up),
    Family("aegis_worker_cpu_percent", "CPU of the rank's training process (100 = one core "
           "busy)", _proc_sum("cpu")),
    Family("aegis_worker_rss_bytes", "Resident memory of the rank's training process",
           _proc_sum("rss")),
    Family("aegis_worker_network_bytes_per_second", "The rank's node's network throughput "
           "(every interface but lo; link ib: InfiniBand ports)", _net),
    Family("aegis_gpu_utilization_percent", "GPU utilisation (NVML)", _gpu("util")),
    Family("aegis_gpu_memory_used_bytes", "GPU memory used (NVML)", _gpu("mem")),
    Family("aegis_gpu_temperature_celsius", "GPU temperature (NVML)", _gpu("temp")),
    Family("aegis_gpu_ecc_uncorrected", "Volatile uncorrected ECC errors since the driver "
           "loaded (NVML)", _gpu("ecc")),
)
NAMES = frozenset(f.name for f in FAMILIES)


def render(job: str, namespace: str, views: Sequence[View]) -> str:
    """The text of every family over every rank's view (rank = its index in ``views``)."""
    head = f'aegis_job="{escape(job)}",aegis_namespace="{escape(namespace)}",rank="'
    labels = [f'{head}{rank}"' for rank in range(len(views))]
    out: list[str] = []
    for family in FAMILIES:
        out.append(f"# HELP {family.name} {family.help}\n# TYPE {family.name} gauge\n")
        name, get = family.name, family.samples
        out.extend(f"{name}{{{labels[rank]}{extra}}} {_fmt(value)}\n"
                   for rank, v in enumerate(views) for extra, value in get(v))
    return "".join(out)
