"""aegis_flow.verify: an explicit-state model checker over the real ``master.machine.step``.

PURE except ``verify/cli.py`` (prints, writes the dump). See docs/verification.md.
"""

from __future__ import annotations

from .environment import Kind, events
from .explorer import Config, Exploration, TraceStep, canonical, explore
from .properties import Verdict, evaluate
from .report import Report, render_text, to_json, verify

__all__ = [
    "Config", "Exploration", "Kind", "Report", "TraceStep", "Verdict", "canonical", "evaluate",
    "events", "explore", "render_text", "to_json", "verify",
]
