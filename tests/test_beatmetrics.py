"""The per-rank heartbeat series, rendered from the observer's views at each scrape: valid
Prometheus text with the families, labels and values the labelled gauges had, nothing for a
value the last heartbeat lacked, and a real Observer fed real heartbeat bytes shows them."""

from __future__ import annotations

import math
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from aegis_flow import protocol as p
from aegis_flow.master import beatmetrics
from aegis_flow.master.metrics import MasterMetrics, exported_names
from aegis_flow.master.observer import Observer, WorkerView


def parsed(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def key(name: str, rank: int, **extra: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = {"aegis_job": "j", "aegis_namespace": "ns", "rank": str(rank), **extra}
    return name, tuple(sorted(labels.items()))


SAMPLE: dict[str, Any] = {
    "procs": [{"pid": 1, "cpu": 50.0, "rss": 100}, {"pid": 2, "cpu": 25.5, "rss": 28},
              {"pid": 3}],
    "net": {"rx": 10, "tx": 20}, "ib": {"rx": 3},
    "gpus": [{"i": 0, "util": 97, "mem": 5e9, "temp": 61, "ecc": 0},
             {"i": 1, "util": "high", "temp": 70}, "junk", {"util": 3}]}


def test_every_family_with_the_gauges_labels_and_values() -> None:
    beat = WorkerView(last_beat=1.0, child_restarts=2, beat_lag=0.03, delay=0.004,
                      step_rate=None, step=41, up=True, known=True, resources=SAMPLE)
    silent = WorkerView()  # never beat: no series at all
    down = WorkerView(known=True)  # found lost before it ever beat: up 0 only
    got = parsed(beatmetrics.render("j", "ns", [beat, silent, down]))
    assert got == {
        key("aegis_worker_child_restarts", 0): 2, key("aegis_worker_heartbeat_lag_seconds", 0):
        0.03, key("aegis_worker_heartbeat_delay_seconds", 0): 0.004,
        key("aegis_worker_step_rate", 0): 0.0, key("aegis_worker_step", 0): 41,
        key("aegis_worker_up", 0): 1, key("aegis_worker_up", 2): 0,
        key("aegis_worker_cpu_percent", 0): 75.5, key("aegis_worker_rss_bytes", 0): 128,
        key("aegis_worker_network_bytes_per_second", 0, link="net", direction="rx"): 10,
        key("aegis_worker_network_bytes_per_second", 0, link="net", direction="tx"): 20,
        key("aegis_worker_network_bytes_per_second", 0, link="ib", direction="rx"): 3,
        key("aegis_gpu_utilization_percent", 0, gpu="0"): 97,
        key("aegis_gpu_memory_used_bytes", 0, gpu="0"): 5e9,
        key("aegis_gpu_temperature_celsius", 0, gpu="0"): 61,
        key("aegis_gpu_temperature_celsius", 0, gpu="1"): 70,
        key("aegis_gpu_ecc_uncorrected", 0, gpu="0"): 0}


def test_non_finite_and_non_numbers_are_left_out() -> None:
    assert beatmetrics.number(math.nan) is None and beatmetrics.number(math.inf) is None
    assert beatmetrics.number(True) is None and beatmetrics.number("3") is None
    assert beatmetrics.number(3) == 3.0


def test_the_families_are_exported_names_and_no_registry_gauge_repeats_one() -> None:
    names = exported_names()
    assert beatmetrics.NAMES <= names
    registry = {fam.name for fam in MasterMetrics().registry.collect()}
    assert not registry & beatmetrics.NAMES  # a family twice would be an invalid scrape


def test_a_real_heartbeat_reaches_the_scrape() -> None:
    obs = Observer(job="j", namespace="ns", workers=2, metrics=MasterMetrics())
    data = {"node": "n0", "pod_ip": "10.0.0.1", "step": 7, "step_rate": 1.5, "beat_lag": 0.01,
            "child_restarts": 0, "resources": SAMPLE}
    msg = p.decode(p.Message(job="j", namespace="ns", pod_name="j-worker-1", type=p.MsgType.ACK,
                             rank=1, seq=0, incarnation="a", data=data,
                             timestamp=time.time()).encode())
    obs.message(msg, p.to_event(msg), time.time())
    got = parsed(obs.render().decode())
    assert got[key("aegis_worker_step", 1)] == 7 and got[key("aegis_worker_up", 1)] == 1
    assert got[key("aegis_gpu_utilization_percent", 1, gpu="0")] == 97
    assert not any(k[0] == "aegis_worker_up" and ("rank", "0") in k[1] for k in got)
