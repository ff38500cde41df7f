"""Where the master's HTTP endpoints live: one place for the CLI, Argo templates and docs.

PURE constants, no imports: the Argo builders import this for the master's readiness probe
(``READINESS_PROBE.path`` on ``READINESS_PROBE.port``) without pulling in prometheus-client.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the master's HTTP port in a pod (``--metrics-port``; 0 picks a free port, locally)
DEFAULT_METRICS_PORT = 9464
METRICS_PATH = "/metrics"  # Prometheus text format
HEALTH_PATH = "/healthz"  # 200 while the process serves at all (liveness)
READINESS_PATH = "/readyz"  # 200 once connected to NATS and the status is loaded, else 503
PROGRESS_PATH = "/progress"  # JSON: phase, restarts, per-rank step rate (``aegis-flow run``)


@dataclass(frozen=True)
class HttpProbe:
    path: str
    port: int


#: the Argo master template's readiness probe
READINESS_PROBE = HttpProbe(path=READINESS_PATH, port=DEFAULT_METRICS_PORT)
#: the Argo master template's liveness probe
LIVENESS_PROBE = HttpProbe(path=HEALTH_PATH, port=DEFAULT_METRICS_PORT)
