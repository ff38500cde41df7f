"""aegis_flow.templates: pure Hera builders, one per phase (never submit).

``master`` (daemon), ``checks`` (bootcheck, troubleshoot, the single checks), ``run`` (worker
pods and the verdict), ``recovery`` (quarantine, resume, give-up, report); ``contract`` is the
exit-code/outcome contract (standard library only). ``aegis_flow.workflow`` assembles them.
Importing this package loads nothing heavy; the builder modules import Hera.
"""
