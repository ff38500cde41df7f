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
        self.child_restarts = Gauge(
            "aegis_worker_child_restarts", "Times the supervisor started the training process "
            "again (from its heartbeat)", WORKER_LABELS, registry=r)
        self.heartbeat_lag = Gauge(
            "aegis_worker_heartbeat_lag_seconds", "How late the supervisor's last heartbeat "
            "fired against its schedule (a busy or starved supervisor)", WORKER_LABELS,
            registry=r)
        self.heartbeat_delay = Gauge(
            "aegis_worker_heartbeat_delay_seconds", "Sent-to-handled delay of the last "
            "heartbeat (clock skew included)", WORKER_LABELS, registry=r)
        self.step_rate = Gauge("aegis_worker_step_rate", "Training steps per second of each "
                               "rank (progress API), 0 when not training", WORKER_LABELS,
                               registry=r)
        self.step = Gauge("aegis_worker_step", "Last training step each rank reported",
                          WORKER_LABELS, registry=r)
        self.up = Gauge("aegis_worker_up", "1 while the worker's heartbeats arrive",
                        WORKER_LABELS, registry=r)
        self.slow = Gauge("aegis_worker_slow", "1 while the rank is marked slow (T13s): it is "
                          "evicted right after the next checkpoint (T13e)", WORKER_LABELS,
                          registry=r)
        # the resource samples heartbeats carry (supervisor/resources.py)
        self.cpu = Gauge("aegis_worker_cpu_percent", "CPU of the rank's training process "
                         "(100 = one core busy)", WORKER_LABELS, registry=r)
        self.rss = Gauge("aegis_worker_rss_bytes", "Resident memory of the rank's training "
                         "process", WORKER_LABELS, registry=r)
        self.net = Gauge("aegis_worker_network_bytes_per_second", "The rank's node's network "
                         "throughput (every interface but lo; link ib: InfiniBand ports)",
                         (*WORKER_LABELS, "link", "direction"), registry=r)
        gpu_labels = (*WORKER_LABELS, "gpu")
        self.gpu_util = Gauge("aegis_gpu_utilization_percent", "GPU utilisation (NVML)",
                              gpu_labels, registry=r)
        self.gpu_mem = Gauge("aegis_gpu_memory_used_bytes", "GPU memory used (NVML)",
                             gpu_labels, registry=r)
        self.gpu_temp = Gauge("aegis_gpu_temperature_celsius", "GPU temperature (NVML)",
                              gpu_labels, registry=r)
        self.gpu_ecc = Gauge("aegis_gpu_ecc_uncorrected", "Volatile uncorrected ECC errors "
                             "since the driver loaded (NVML)", gpu_labels, registry=r)
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

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return bytes(generate_latest(self.registry))


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
             "gauge": ("",), "summary": ("_sum", "_count", ""), "info": ("_info",)}


def exported_names(metrics: MasterMetrics | None = None) -> frozenset[str]:
    """Every series name a scrape can contain (``_bucket``/``_sum``/``_count``/``_total``)."""
    registry = (metrics or MasterMetrics()).registry
    names: set[str] = set()
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return frozenset(names)


PHASES = tuple(ph.value for ph in m.Phase)
