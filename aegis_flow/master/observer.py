"""What the master runtime sees, recorded as Prometheus metrics and fault log lines.

The pure machine knows nothing of this. The runtime calls four hooks: :meth:`Observer.loaded`
once the status is loaded, :meth:`Observer.message` for every decoded worker message (the
heartbeat numbers, and the data a report carries), :meth:`Observer.transition` after every
``step`` with the status before and after and the effects, and :meth:`Observer.close` at the
end. Side effects: sets metrics in a :class:`~aegis_flow.master.metrics.MasterMetrics`
registry, appends to a :class:`~aegis_flow.master.faultlog.FaultLog`, writes a final metrics
snapshot (``metrics.prom``) beside the fault log. The helpers at the top are pure.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aegis_flow import protocol as p
from aegis_flow.master import beatmetrics
from aegis_flow.master import model as m
from aegis_flow.master.faultlog import FaultLog, record
from aegis_flow.master.metrics import PHASES, MasterMetrics
from aegis_flow.settings import env_value
from aegis_flow.vocab import LEVEL_OF, Level

#: a slow mark is no recovery level in the metrics' labels
LEVEL_OF_FAULT = {f: ("" if lv is Level.MARK else lv.value) for f, lv in LEVEL_OF.items()}
LEVEL_OF_EXIT = {m.ExitCode.NODE_FAULT: LEVEL_OF[m.FaultClass.HARDWARE].value,
                 m.ExitCode.CONTAINER_RESTART: LEVEL_OF[m.FaultClass.CONTAINER].value,
                 m.ExitCode.SLOW_NODE_EVICTED: LEVEL_OF[m.FaultClass.HARDWARE].value}
RECOVERY = (m.Phase.TROUBLESHOOTING, m.Phase.RESTARTING)
CHECKING = {m.Phase.BOOTCHECKING: "bootcheck", m.Phase.TROUBLESHOOTING: "troubleshoot"}


def higher(a: str, b: str) -> str:
    """The higher of two recovery levels ("" < L1 < L2 < L3)."""
    return max(a, b)


_num = beatmetrics.number  # a finite JSON number, else None


def shown_phase(pod: m.PodInfo) -> m.Phase:
    """A worker's phase as people see it: Restarting while it is being replaced (pure)."""
    return m.Phase.RESTARTING if pod.restarting else pod.phase


def check_samples(data: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(check_type, outcome, seconds) of every check result a Finish carries (pure)."""
    out = []
    for r in data.get("results") or []:
        if not isinstance(r, dict):
            continue
        duration = _num(r.get("duration"))
        if duration is None or duration < 0:
            continue
        out.append((str(r.get("check_type", "unknown"))[:40],
                    str(r.get("status", "unknown"))[:20], duration))
    return out


def failure_cause(event: m.Event, data: dict[str, Any]) -> str:
    """A short, bounded cause label for a failure event (pure)."""
    if isinstance(event, m.Error):
        code = data.get("cause_code")
        if isinstance(code, str) and code and code != "unknown":
            return code[:40]
        sig, status = data.get("signal"), data.get("code")
        if isinstance(sig, int) and not isinstance(sig, bool):
            try:
                return signal.Signals(sig).name.lower()
            except ValueError:
                return f"signal{sig}"
        if isinstance(sig, str) and sig:
            return sig.lower()[:20]
        if isinstance(status, int) and not isinstance(status, bool):
            return f"exit{status}"
        return "error"
    if isinstance(event, m.HangWithQuit):
        return "hang"
    if isinstance(event, m.Lost):
        return "lost"
    if isinstance(event, m.Ack):
        return "new_incarnation"
    if isinstance(event, m.Finish) and event.fault is not None:
        return event.fault.value
    return type(event).__name__.lower()


def resource_summary(res: dict[str, Any] | None) -> dict[str, Any]:
    """A rank's resource sample in a few numbers for ``/progress`` and ``status`` (pure):
    ``cpu`` % and ``rss`` bytes of its processes, ``gpu_util`` (the mean over its GPUs, %),
    ``net`` bytes/s (rx+tx, every link). Keys absent when the sample has nothing for them."""
    if not isinstance(res, dict):
        return {}
    out: dict[str, Any] = {}
    procs = [p for p in res.get("procs") or [] if isinstance(p, dict)]
    cpu = [c for p in procs if (c := _num(p.get("cpu"))) is not None]
    rss = [b for p in procs if (b := _num(p.get("rss"))) is not None]
    if cpu:
        out["cpu"] = round(sum(cpu), 1)
    if rss:
        out["rss"] = int(sum(rss))
    utils = [u for g in res.get("gpus") or [] if isinstance(g, dict)
             and (u := _num(g.get("util"))) is not None]
    if utils:
        out["gpu_util"] = round(sum(utils) / len(utils), 1)
    rates = [v for link in ("net", "ib") if isinstance(res.get(link), dict)
             for d in ("rx", "tx") if (v := _num(res[link].get(d))) is not None]
    if rates:
        out["net"] = int(sum(rates))
    return out


@dataclass
class WorkerView:
    """What the observer remembers of one rank (the shell's own, mutable)."""

    pod: str = ""
    pod_ip: str = ""
    node: str = ""
    node_ip: str = ""
    gpu_type: str = ""
    last_beat: float = 0.0
    phase_since: float = 0.0
    step_rate: float | None = None
    step: int | None = None
    child_restarts: int = 0
    doing: str = ""  # what the supervisor says it is busy with (display only)
    doing_for: float = 0.0
    mark: tuple[int, str] = (-1, "")  # (seq, frame): where it was when the job was marked hung
    resources: dict[str, Any] | None = None  # the last heartbeat's resource sample
    beat_lag: float | None = None  # how late the supervisor says its last beat was
    delay: float = 0.0  # sent → handled of the last beat
    up: bool = False  # what aegis_worker_up says of it
    known: bool = False  # it has beaten, or was found down: aegis_worker_up has a value
    where: tuple[Any, ...] = ()  # the last heartbeat's pod, addresses and gpu type, as sent


class Observer:
    def __init__(self, *, job: str, namespace: str, workers: int, gpu_type: str = "",
                 metrics: MasterMetrics | None = None, faults: FaultLog | None = None,
                 master_pod: str = "master", master_ip: str = "", master_node: str = "") -> None:
        self.job, self.namespace, self.n = job, namespace, workers
        self.worker_num = str(workers)
        self.configured_gpu = gpu_type
        self.metrics, self.faults = metrics, faults
        self.master = (master_pod, master_ip, master_node)
        self.views = [WorkerView(pod=f"{job}-worker-{r}") for r in range(workers)]
        self.status: m.Status | None = None
        self.phase_since = 0.0
        self.round_since = 0.0
        self.recovery: tuple[float, str, str] | None = None  # (since, cause, level)
        self._gpu_frozen = ""
        self._gpu_seen: str | None = None  # the most common gpu type (None: count again)
        self._gpu_counts: Counter[str] = Counter()  # ranks per reported gpu type, kept current
        self._msg: p.Message | None = None
        self._msg_event: m.Event | None = None
        self._beat_gauges: dict[int, tuple[Any, ...]] = {}
        self._pending: list[dict[str, Any]] = []  # this transition's fault log lines
        # heartbeats taken, full and keep-alive (the counters' children, looked up once)
        self._beats_in = ((metrics.heartbeats.labels("full"), metrics.heartbeats.labels(
            "keepalive")) if metrics is not None else None)

    # -- labels -----------------------------------------------------------------------------
    @property
    def gpu_type(self) -> str:
        """--gpu-type if given, else what most workers report, else "unknown"."""
        if self.configured_gpu:
            return self.configured_gpu
        if self._gpu_frozen:
            return self._gpu_frozen
        if self._gpu_seen is None:  # looked up again only when a rank's type changed, in
            seen = self._gpu_counts     # the counts kept per type (O(types), not O(N): every
            #                             rank's first report changes its type)
            self._gpu_seen = seen.most_common(1)[0][0] if seen else "unknown"
        return self._gpu_seen

    def _line(self, kind: str, now: float, phase: str, message: str, *, rank: int | None = None,
              cause: str = "", level: str = "") -> None:
        if self.faults is None:
            return
        if rank is None:
            pod, ip, node = self.master
            node_ip = ip
        else:
            v = self.views[rank]
            pod, ip, node, node_ip = v.pod, v.pod_ip, v.node, v.node_ip
        self._pending.append(record(kind, now=now, phase=phase, message=message, pod=pod,
                                    pod_ip=ip, node=node, node_ip=node_ip, cause=cause,
                                    level=level, rank=rank))

    def _flush(self) -> None:
        if self.faults is not None and self._pending:
            self.faults.write_many(self._pending)
            self._pending.clear()

    # -- hooks ------------------------------------------------------------------------------
    def loaded(self, status: m.Status, *, resumed: bool, now: float) -> None:
        self.status = status
        self.phase_since = self.round_since = now
        how = "resumed" if resumed else "started"
        self._line("phase_start", now, status.phase.value, f"job {how} in {status.phase.value}")
        for pod in status.workers:
            v = self.views[pod.rank]
            v.phase_since = now
            v.node, v.pod_ip = pod.node or v.node, pod.pod_ip or v.pod_ip
            self._line("phase_start", now, shown_phase(pod).value,
                       f"{shown_phase(pod).value} ({how})", rank=pod.rank)
        if status.phase is not m.Phase.PENDING:
            self._gpu_frozen = self.gpu_type
        self._gauges(None, status)
        self._flush()

    def message(self, msg: p.Message, event: m.Event, now: float) -> None:
        """Before ``step``: remember the message; take the heartbeat's numbers."""
        self._msg, self._msg_event = msg, event
        gate = msg.data.get("gate") if isinstance(event, m.CheckpointDone) else None
        if isinstance(gate, list) and 0 <= msg.rank < self.n:  # the integrity gate's findings
            phase = self.status.phase.value if self.status is not None else ""
            for line in gate[:8]:
                self._line("report", now, phase, f"checkpoint gate: {str(line)[:300]}",
                           rank=msg.rank, cause="checkpoint", level="warning")
        if not isinstance(event, m.Ack) or not 0 <= msg.rank < self.n:
            return
        v, d = self.views[msg.rank], msg.data
        if self._beats_in is not None:
            self._beats_in[0].inc()
        where = (msg.pod_name, d.get("pod_ip"), d.get("node"), d.get("node_ip"),
                 d.get("gpu_type"))
        if where != v.where:  # (the same as last beat, nearly always: nothing to convert)
            v.where = where
            self._where(v, msg, d)
        v.last_beat = now
        rate, step = _num(d.get("step_rate")), _num(d.get("step"))
        v.step_rate = rate
        v.step = int(step) if step is not None else None
        v.doing = str(d.get("doing") or "")[:120]
        v.doing_for = _num(d.get("doing_for")) or 0.0
        restarts = _num(d.get("child_restarts"))
        v.child_restarts = int(restarts) if restarts is not None else v.child_restarts
        res = d.get("resources")
        if isinstance(res, dict):
            v.resources = res  # rendered at each scrape (beatmetrics.py)
            if self.metrics is not None and '"xid"' in str(res.get("gpus")):
                self._xids(msg.rank, res)
        mark = d.get("hang_mark")
        if isinstance(mark, dict) and v.mark[0] != msg.seq:  # the first beat after the mark
            frame = str(mark.get("frame") or "")[:200]
            v.mark = (msg.seq, frame)
            phase = self.status.phase.value if self.status is not None else ""
            self._line("report", now, phase, "the job is marked hung; this rank is in "
                       f"{frame or 'a frame py-spy could not read'}", rank=msg.rank,
                       cause="hang_mark")
        lag = _num(d.get("beat_lag"))
        v.beat_lag = lag if lag is not None else v.beat_lag  # (the gauge keeps the last one)
        v.delay = max(0.0, now - msg.timestamp)
        v.up = v.known = True

    def keepalive(self, rank: int, ka: p.KeepAlive, now: float) -> None:
        """A keep-alive's numbers (runtime, before any ``step``): what a full heartbeat's
        would have set; the rest stays as the last full heartbeat left it."""
        v = self.views[rank]
        if self._beats_in is not None:
            self._beats_in[1].inc()
        v.last_beat = now
        v.step_rate, v.step = ka.step_rate, ka.step
        if ka.doing_for is not None:
            v.doing_for = ka.doing_for
        if ka.beat_lag is not None:
            v.beat_lag = ka.beat_lag
        v.delay = max(0.0, now - ka.timestamp)
        v.up = v.known = True

    def _where(self, v: WorkerView, msg: p.Message, d: dict[str, Any]) -> None:
        """The pod, addresses and gpu type a rank's heartbeat names, when they changed."""
        v.pod = msg.pod_name or v.pod
        v.pod_ip = str(d.get("pod_ip") or v.pod_ip)
        v.node = str(d.get("node") or v.node)
        v.node_ip = str(d.get("node_ip") or v.node_ip or v.pod_ip)
        gpu = str(d.get("gpu_type") or v.gpu_type)[:60]
        if gpu != v.gpu_type:
            if v.gpu_type:
                self._gpu_counts[v.gpu_type] -= 1
                if not self._gpu_counts[v.gpu_type]:
                    del self._gpu_counts[v.gpu_type]
            if gpu:
                self._gpu_counts[gpu] += 1
            v.gpu_type, self._gpu_seen = gpu, None

    def _down(self, rank: int) -> None:
        """aegis_worker_up of ``rank`` is 0 (lost, or the job ended) until it beats again."""
        v = self.views[rank]
        v.up, v.known = False, True

    def _xids(self, rank: int, res: dict[str, Any]) -> None:
        """The XID errors a resource sample names, counted per GPU and code (rare: a heartbeat
        has them only when the driver reported some since the last sample)."""
        mt = self.metrics
        assert mt is not None
        for gpu in [g for g in res.get("gpus") or [] if isinstance(g, dict)][:16]:
            index = _num(gpu.get("i"))
            xids = gpu.get("xid")
            if index is None or not isinstance(xids, list):
                continue
            for xid in xids[:4]:
                if isinstance(xid, int) and not isinstance(xid, bool):
                    mt.gpu_xid.labels(self.job, self.namespace, str(rank), str(int(index)),
                                      str(xid)).inc()

    def anomaly(self, rank: int, rule: str, detail: str, now: float) -> None:
        """An anomaly rule fired (runtime, anomaly.py): a fault-log line and a metric."""
        if self.metrics is not None:
            self.metrics.anomalies.labels(self.job, self.namespace, rule).inc()
        phase = self.status.phase.value if self.status is not None else ""
        self._line("report", now, phase, f"early evidence ({rule}): {detail}; not acted on "
                   "alone", rank=rank, cause=f"anomaly_{rule}", level="warning")
        self._flush()

    def violation(self, name: str, event: m.Event, phase: str, now: float) -> None:
        """The runtime monitor found a broken invariant (master/monitor.py)."""
        if self.metrics is not None:
            self.metrics.invariant_violations.labels(name).inc()
        self._line("report", now, phase, f"invariant {name} broken by {type(event).__name__}",
                   cause="invariant")
        self._flush()

    def transition(self, before: m.Status, after: m.Status, event: m.Event,
                   effects: list[m.Effect], now: float) -> None:
        """After ``step``: reports, phase starts/ends, recoveries, counters and gauges."""
        msg = self._msg if self._msg_event is event else None
        self._msg = self._msg_event = None
        self.status = after
        try:
            self._transition(before, after, event, effects, msg.data if msg else {}, now)
        finally:
            self._flush()

    def _transition(self, before: m.Status, after: m.Status, event: m.Event,
                    effects: list[m.Effect], data: dict[str, Any], now: float) -> None:
        if after.outage != before.outage:  # T6n / T6b (or an outage outlasted): not a report
            self._line("outage", now, before.phase.value,
                       "control-plane outage: every worker silent at once or NATS unreachable; "
                       "nothing counted or restarted (T6n)" if after.outage else
                       "control plane back: nothing was counted (T6b)"
                       if isinstance(event, m.ControlPlaneBack) else
                       "the silence outlasted the outage limit: the workers are lost",
                       cause="outage" if after.outage else "outage_end")
            if after.outage or isinstance(event, m.ControlPlaneBack):
                return
        ignored = any(isinstance(e, m.Log) and e.ignored is not None for e in effects)
        if not ignored and not (isinstance(event, m.Ack) and after is before):
            self._report(before, after, event, data, now)
        for e in effects:
            if isinstance(e, m.ExitWorker):
                level = LEVEL_OF_EXIT.get(e.code, "")
                if self.metrics is not None and level:
                    self.metrics.replacements.labels(level).inc()
                if self.recovery is not None:
                    self.recovery = (*self.recovery[:2], higher(self.recovery[2], level))
            elif isinstance(e, m.Quarantine):
                self._line("quarantine", now, after.phase.value, f"node {e.node} quarantined "
                           f"({e.reason}); rank {e.rank} is rescheduled elsewhere", rank=e.rank,
                           cause=e.reason, level="L3")
        if after is before:
            return
        touched = m.touched(before.workers, after.workers)  # O(changed) below, not O(N)
        for b, a in ((before.workers[r], after.workers[r]) for r in touched):
            old, new = shown_phase(b), shown_phase(a)
            if old is not new:
                v = self.views[a.rank]
                self._line("phase_end", now, old.value, f"{old.value} ended after "
                           f"{now - v.phase_since:.3f} s", rank=a.rank)
                self._line("phase_start", now, new.value, new.value, rank=a.rank)
                v.phase_since = now
        if before.phase is not after.phase:
            self._phase_change(before, after, event, data, now)
        self._gauges(before, after, touched)

    def close(self, summary: str, now: float, *, stopped: bool = False) -> None:
        """The job's end: the summary line, and a final metrics snapshot beside the log.
        ``stopped``: the master was stopped (a signal) in a live phase, which ends here."""
        phase = self.status.phase.value if self.status is not None else ""
        if stopped:
            self._line("phase_end", now, phase, f"job {phase} ended: the master was stopped")
        self._line("summary", now, phase, summary)
        self._flush()
        if self.faults is not None:
            if self.metrics is not None:  # the last heartbeats' numbers are in the final metrics
                tmp = self.faults.directory / "metrics.prom.tmp"
                tmp.write_bytes(self.render())
                os.replace(tmp, self.faults.directory / "metrics.prom")
            self.faults.close()

    def render(self) -> bytes:
        """``/metrics``: the registry and every rank's heartbeat numbers (read on the HTTP
        thread: it reads each view's values, it decides nothing)."""
        if self.metrics is None:
            return b""
        return self.metrics.render(beatmetrics.render(self.job, self.namespace, self.views))

    def progress(self) -> dict[str, Any]:
        """A snapshot for ``/progress`` (read from the HTTP thread; values only)."""
        st = self.status
        if st is None:
            return {"phase": "Loading", "workers": []}
        return {
            "phase": st.phase.value, "recover_count": st.recover_count,
            "max_retry": st.max_retry, "seq": st.seq, "error_nodes": sorted(st.error_nodes),
            "workers": [{"rank": pod.rank, "phase": pod.phase.value, "retries": pod.retries,
                         "node": pod.node, "step_rate": v.step_rate, "step": v.step,
                         "child_restarts": v.child_restarts, "doing": v.doing,
                         "doing_for": v.doing_for,
                         "frame": v.mark[1] if v.mark[0] == st.seq else "",
                         **resource_summary(v.resources)}
                        for pod, v in zip(st.workers, self.views, strict=True)]}

    # -- the parts of transition ------------------------------------------------------------
    def _report(self, before: m.Status, after: m.Status, event: m.Event, data: dict[str, Any],
                now: float) -> None:
        mt, gpu = self.metrics, self.gpu_type
        if isinstance(event, m.Ack):
            old = before.workers[event.rank].incarnation
            if old == event.incarnation:
                return  # a heartbeat
            text = ("connected" if old is None else
                    f"came back as a new incarnation ({old} → {event.incarnation})")
            self._line("connected", now, before.workers[event.rank].phase.value,
                       f"{text}; incarnation {event.incarnation}", rank=event.rank,
                       cause="" if old is None else "new_incarnation")
            return
        if isinstance(event, m.Finish | m.Error | m.Hang | m.HangWithQuit | m.Lost):
            rank = event.rank
            phase = before.workers[rank].phase
            level, cause = "", ""
            if mt is not None and not isinstance(event, m.Lost):
                mt.reports.labels(type(event).__name__).inc()
            if isinstance(event, m.Finish):
                samples = check_samples(data) if phase in CHECKING else []
                if mt is not None:
                    rnd = str(before.recover_count)
                    for check, outcome, seconds in samples:
                        mt.check_duration.labels(check, gpu, self.worker_num, rnd,
                                                 outcome).observe(seconds)
                if event.ok:
                    text = (f"checks passed ({len(samples)})" if phase in CHECKING
                            else "command exited 0")
                else:
                    cause = failure_cause(event, data)
                    level = LEVEL_OF_FAULT.get(event.fault, "") if event.fault else ""
                    text = f"checks failed: {event.detail[:300]}"
            else:
                cause = failure_cause(event, data)
                text, detect = self._detection(event, data, now)
                if isinstance(event, m.Lost):
                    self._down(rank)
                if detect is not None and mt is not None:
                    kind = {"Error": "error", "Lost": "lost"}.get(type(event).__name__, "hang")
                    mt.time_to_detect.labels(kind, gpu, self.worker_num).observe(detect)
            self._line("report", now, phase.value, f"{type(event).__name__} (seq "
                       f"{getattr(event, 'seq', before.seq)}): {text}", rank=rank, cause=cause,
                       level=level)
        elif isinstance(event, m.Slow):  # T13s: marked (evicted right after a checkpoint)
            detail = f": {event.detail}" if event.detail else ""
            self._line("report", now, before.phase.value, f"slow{detail}; evicted right after "
                       "the next checkpoint", rank=event.rank,
                       cause="slow", level="warning")
        elif isinstance(event, m.Stop | m.ConnectTimeout):
            reason = event.reason if isinstance(event, m.Stop) else (
                "not every worker connected in time: every worker runs on its own")
            self._line("report", now, before.phase.value, reason,
                       cause="stopped" if isinstance(event, m.Stop) else "connect_timeout")

    def _detection(self, event: m.Event, data: dict[str, Any],
                   now: float) -> tuple[str, float | None]:
        """A report's text and how long the fault took to reach the master (if known)."""
        if isinstance(event, m.Error):
            ended = _num(data.get("ended_at"))
            detect = now - ended if ended is not None and 0 <= now - ended < 3600 else None
            return event.cause[:300], detect
        if isinstance(event, m.Lost):
            seen = self.views[event.rank].last_beat
            silent = now - seen if seen else None
            return (f"heartbeats stopped {silent:.1f} s ago" if silent is not None
                    else "heartbeats stopped"), silent
        idle = _num(data.get("idle"))
        what = "no progress" + (f" for {idle:.0f} s" if idle is not None else "")
        if isinstance(event, m.Hang):
            return f"{what} (marked, kept running)", None
        return f"{what}: restart", idle

    def _phase_change(self, before: m.Status, after: m.Status, event: m.Event,
                      data: dict[str, Any], now: float) -> None:
        mt, gpu, wn = self.metrics, self.gpu_type, self.worker_num
        b, a = before.phase, after.phase
        self._line("phase_end", now, b.value, f"job {b.value} ended after "
                   f"{now - self.phase_since:.3f} s")
        self._line("phase_start", now, a.value, f"job {a.value}")
        self.phase_since = now
        if b is m.Phase.PENDING:
            self._gpu_frozen = gpu
            if mt is not None:
                mt.jobs_created.labels(gpu, wn).inc()
        if b in CHECKING and mt is not None:
            outcome = "pass" if a is m.Phase.RUNCOMMAND else "fail"
            mt.check_round.labels(CHECKING[b], gpu, wn, outcome).observe(now - self.round_since)
        if a in CHECKING:
            self.round_since = now
        if b is m.Phase.RUNCOMMAND and a in RECOVERY:
            # an in-place restart unless the failure already replaced a worker (T6); an exit
            # ordered later in the recovery raises it (LEVEL_OF_EXIT above)
            level = Level.L2.value if a is m.Phase.RESTARTING else Level.L1.value
            self.recovery = (now, failure_cause(event, data), level)
        if a is m.Phase.RUNCOMMAND and self.recovery is not None:
            since, cause, level = self.recovery
            self.recovery = None
            if mt is not None:
                mt.time_to_recover.labels(level, gpu, wn).observe(now - since)
                mt.restarts.labels(cause, level).inc()
            self._line("recovered", now, a.value, f"running again {now - since:.3f} s after "
                       f"the failure (recoverCount {after.recover_count})", cause=cause,
                       level=level)
        if a.terminal:
            self.recovery = None
            if mt is not None:
                {m.Phase.SUCCEED: mt.jobs_succeeded, m.Phase.FAILED: mt.jobs_failed,
                 m.Phase.INDEPENDENT: mt.jobs_independent}[a].labels(gpu, wn).inc()

    def _gauges(self, before: m.Status | None, after: m.Status,
                touched: list[int] | None = None) -> None:
        mt = self.metrics
        if mt is None:
            return
        job = (self.job, self.namespace)
        if before is None or before.phase is not after.phase:
            for ph in PHASES:
                mt.phase.labels(*job, ph).set(1 if ph == after.phase.value else 0)
        if before is None or before.recover_count != after.recover_count:
            mt.recover_count.labels(*job).set(after.recover_count)
            mt.max_retry.labels(*job).set(after.max_retry)
        if before is None or before.error_nodes != after.error_nodes:
            mt.quarantined.labels(*job).set(len(after.error_nodes))
        if touched is None and before is not None:
            touched = m.replaced(before.workers, after.workers)
        changed = (after.workers if before is None or touched is None else
                   [after.workers[r] for r in touched])
        for pod in changed:  # O(ranks that changed), not O(N), per transition
            old = None if before is None else before.workers[pod.rank]
            if old is None or old.retries != pod.retries:
                mt.retries.labels(*job, str(pod.rank)).set(pod.retries)
            if old is None or old.slow != pod.slow:
                mt.slow.labels(*job, str(pod.rank)).set(int(pod.slow))
        if after.phase.terminal:
            for rank in range(self.n):
                self._down(rank)


def make_observer(*, job: str, namespace: str, workers: int, gpu_type: str = "",
                  log_dir: str = "", metrics: bool = True) -> Observer:
    """The observer a master runs with: metrics always, a fault log when ``log_dir`` is set."""
    return Observer(
        job=job, namespace=namespace, workers=workers, gpu_type=gpu_type,
        metrics=MasterMetrics() if metrics else None,
        faults=FaultLog(Path(log_dir)) if log_dir else None,
        master_pod=env_value("AEGIS_POD_NAME", "master"),
        master_ip=env_value("AEGIS_POD_IP", ""),
        master_node=env_value("AEGIS_NODE_NAME", ""))
