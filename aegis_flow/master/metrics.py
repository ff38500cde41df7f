"""The master's Prometheus metrics: every name we export, defined once.

Side effects: none at import. A :class:`MasterMetrics` owns its own ``CollectorRegistry``
(never the process-global one), so tests and benchmarks can build as many as they like; the
HTTP server (``http.py``) serves it and ``observer.py`` records into it.

Labels: ``gpu_type`` × ``worker_num`` on everything an operator aggregates across jobs ("P99 of
the io check on A800×64 jobs"); ``aegis_job``/``aegis_namespace`` on the per-job gauges
(``job`` is Prometheus' own target label, so it is not used here).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from aegis_flow.master import model as m
from aegis_flow.master.beatmetrics import NAMES as BEAT_NAMES

# budgets run from ms (runtime) to 182 s (allreduce performance): buckets cover both ends
CHECK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                 120.0, 180.0, 300.0, 600.0)
DETECT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
                  300.0, 900.0)
RECOVER_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                   1800.0)

CHECK_LABELS = ("check_type", "gpu_type", "worker_num", "round", "outcome")
JOB_LABELS = ("aegis_job", "aegis_namespace")
WORKER_LABELS = ("aegis_job", "aegis_namespace", "rank")


class MasterMetrics:
    """The metric families of one master process, in their own registry."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # one job: no *_created
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.check_duration = Histogram(
            "aegis_check_duration_seconds", "Duration of one check on one worker, by check "
            "type, GPU type, job size, recovery round (0 = bootcheck) and outcome "
            "(pass/fail/timeout/not_applicable)", CHECK_LABELS, buckets=CHECK_BUCKETS,
            registry=r)
        self.check_round = Histogram(
            "aegis_check_round_seconds", "Wall time of a whole bootcheck or troubleshoot round "
            "(every worker), by kind and outcome (pass: the job went on to run)",
            ("kind", "gpu_type", "worker_num", "outcome"), buckets=CHECK_BUCKETS, registry=r)
        self.time_to_detect = Histogram(
            "aegis_time_to_detect_seconds", "From a fault (process death, last heartbeat, last "
            "progress) to the master handling it, by kind (error/lost/hang)",
            ("kind", "gpu_type", "worker_num"), buckets=DETECT_BUCKETS, registry=r)
        self.time_to_recover = Histogram(
            "aegis_time_to_recover_seconds", "From leaving RunCommand on a failure to running "
            "again, by recovery level (L1 process, L2 container, L3 node)",
            ("level", "gpu_type", "worker_num"), buckets=RECOVER_BUCKETS, registry=r)
        self.restarts = Counter(
            "aegis_restarts", "Completed recoveries (the job ran again), by the cause that "
            "started them and the level they needed", ("cause", "level"), registry=r)
        self.replacements = Counter(
            "aegis_worker_replacements", "Workers told to leave so that they are replaced: "
            "L2 container restart, L3 node fault (rescheduled elsewhere)", ("level",),
            registry=r)
        self.invariant_violations = Counter(
            "aegis_invariant_violations", "Live transitions that broke an invariant of the "
            "model checker (the runtime monitor, master/monitor.py), by invariant", ("name",),
            registry=r)
        self.reports = Counter(
            "aegis_reports", "Worker reports the master processed (duplicates and stale ones "
            "excluded), by type", ("type",), registry=r)
        self.heartbeats = Counter(
            "aegis_heartbeats", "Heartbeats the master took, by kind: full (JSON, every field) "
            "or keepalive (the short form of one that says nothing new)", ("kind",),
            registry=r)
        labels = ("gpu_type", "worker_num")
        self.jobs_created = Counter("aegis_jobs_created", "Jobs whose workers all connected "
                                    "(or that fell back to plain runs)", labels, registry=r)
        self.jobs_succeeded = Counter("aegis_jobs_succeeded", "Jobs that succeeded", labels,
                                      registry=r)
        self.jobs_failed = Counter("aegis_jobs_failed", "Jobs that failed (retries exhausted "
                                   "or stopped)", labels, registry=r)
        self.jobs_independent = Counter("aegis_jobs_independent", "Jobs that ran without "
                                        "fault tolerance (T15)", labels, registry=r)
        self.phase = Gauge("aegis_job_phase", "1 for the job's current phase, 0 for the others",
                           (*JOB_LABELS, "phase"), registry=r)
        self.recover_count = Gauge("aegis_job_recover_count", "recoverCount of the job",
                                   JOB_LABELS, registry=r)
        self.max_retry = Gauge("aegis_job_max_retry", "max-retry of the job", JOB_LABELS,
                               registry=r)
        self.quarantined = Gauge("aegis_job_quarantined_nodes", "Nodes this job quarantined",
                                 JOB_LABELS, registry=r)
        self.retries = Gauge("aegis_worker_retries", "Counted failures of each worker",
                             WORKER_LABELS, registry=r)
        self.slow = Gauge("aegis_worker_slow", "1 while the rank is marked slow (T13s): it is "
                          "evicted right after the next checkpoint (T13e)", WORKER_LABELS,
                          registry=r)
        # the numbers every heartbeat carries (the supervisor's, the resource sample's) are
        # rendered from the observer's views at each scrape (beatmetrics.py), not kept here
        gpu_labels = (*WORKER_LABELS, "gpu")
        self.gpu_xid = Counter("aegis_gpu_xid_events", "XID errors NVML reported, by code",
                               (*gpu_labels, "xid"), registry=r)
        self.anomalies = Counter(
            "aegis_anomalies", "Anomaly-rule findings (master/anomaly.py: gpu_idle, "
            "rss_growth, net_low): early evidence, never acted on alone", (*JOB_LABELS,
                                                                           "rule"), registry=r)
        self.credential_refusals = Gauge(
            "aegis_credential_refusals", "Credential requests this master refused or ignored "
            "since it started, by reason: new_keys (a rank registering keys in a loop), "
            "foreign_reply (a renewal whose reply subject is outside the rank's inbox)",
            ("reason",), registry=r)
        self.revocations = Gauge(
            "aegis_credential_revocations", "Keys on the account's revocation list after this "
            "master's last push (pruned after the JWT lifetime)", registry=r)

    def render(self, beats: str = "") -> bytes:
        """The registry in Prometheus' text format, followed by ``beats``: the per-rank
        heartbeat families (``beatmetrics.render``)."""
        return bytes(generate_latest(self.registry)) + beats.encode()


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
             "gauge": ("",), "summary": ("_sum", "_count", ""), "info": ("_info",)}


def exported_names(metrics: MasterMetrics | None = None) -> frozenset[str]:
    """Every series name a scrape can contain (``_bucket``/``_sum``/``_count``/``_total``)."""
    registry = (metrics or MasterMetrics()).registry
    names: set[str] = set(BEAT_NAMES)
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return frozenset(names)


PHASES = tuple(ph.value for ph in m.Phase)
