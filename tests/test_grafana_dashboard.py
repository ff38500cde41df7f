"""deploy/grafana/aegis-flow.json: every panel's query names only metrics the master exports,
every exported metric family has a panel, and a planted wrong name is caught."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aegis_flow.master.metrics import MasterMetrics, exported_names

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "aegis-flow.json"
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan"}
_IDENT = re.compile(r"(?<![A-Za-z0-9_:$.])[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> list[str]:
    """The metric names a PromQL expression selects (functions, labels, keywords excluded)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", "", s)
    s = re.sub(r"\[[^\]]*\]", "", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", s)
    label_values = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,.*\)\s*", s)
    if label_values:
        return [label_values.group(1)]
    names = []
    for m in _IDENT.finditer(s):
        if s[m.end():].lstrip().startswith("(") or m.group().lower() in KEYWORDS:
            continue
        names.append(m.group())
    return names


def queries(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, query) for every panel target (rows' panels included) and templating query."""
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for p in panels:
            for t in p.get("targets") or []:
                yield f"panel {p.get('title')!r} {t.get('refId')}", str(t.get("expr", ""))
            yield from walk(p.get("panels") or [])

    yield from walk(doc.get("panels") or [])
    for v in (doc.get("templating") or {}).get("list") or []:
        if v.get("type") == "query":
            q = v.get("query")
            yield f"variable {v.get('name')!r}", str(q.get("query") if isinstance(q, dict) else q)


def problems(doc: dict[str, Any], exported: frozenset[str]) -> list[str]:
    out = []
    for where, q in queries(doc):
        names = metric_names(q)
        if not names:
            out.append(f"{where}: names no metric: {q!r}")
        out += [f"{where}: {n!r} is not a metric we export" for n in names if n not in exported]
    return out


def load() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def test_every_panel_query_names_an_exported_metric() -> None:
    doc = load()
    assert sum(1 for _ in queries(doc)) > 20  # the walk found the queries at all
    assert problems(doc, exported_names()) == []


def test_every_exported_metric_family_is_on_the_dashboard() -> None:
    used = {n for _, q in queries(load()) for n in metric_names(q)}
    families = {f.name for f in MasterMetrics().registry.collect()}
    missing = {f for f in families if not any(u.startswith(f) for u in used)}
    assert missing == set()


@pytest.mark.parametrize("bad", ["aegis_check_duraton_seconds_bucket", "node_cpu_seconds_total",
                                 "aegis_restarts"])
def test_a_planted_wrong_metric_name_is_caught(bad: str) -> None:
    doc = copy.deepcopy(load())
    target = doc["panels"][1]["targets"][0]
    good = metric_names(target["expr"])[0]
    target["expr"] = target["expr"].replace(good, bad)
    found = problems(doc, exported_names())
    assert len(found) == 1 and repr(bad) in found[0], found


def test_a_query_without_a_metric_is_caught() -> None:
    doc = copy.deepcopy(load())
    doc["panels"][1]["targets"][0]["expr"] = "vector(1)"
    assert problems(doc, exported_names()) == [
        f"panel {doc['panels'][1]['title']!r} A: names no metric: 'vector(1)'"]


@pytest.mark.parametrize("expr,names", [
    ('histogram_quantile(0.99, sum by (le, check_type) (rate(x_bucket{a=~"$v", b="1"}'
     '[$__rate_interval])))', ["x_bucket"]),
    ("sum(increase(a_total[1d])) / clamp_min(sum(increase(b_total[1d] offset 1h)), 1)",
     ["a_total", "b_total"]),
    ("max by (job) (g) == 1 and on (job) h", ["g", "h"]),
    ("label_values(m_count, gpu_type)", ["m_count"]),
    ('up{job="by"}', ["up"]),
])
def test_metric_names_reads_promql(expr: str, names: list[str]) -> None:
    assert metric_names(expr) == names


def test_exported_names_include_the_series_suffixes() -> None:
    names = exported_names()
    assert {"aegis_check_duration_seconds_bucket", "aegis_check_duration_seconds_count",
            "aegis_restarts_total", "aegis_job_phase"} <= names
    assert "aegis_restarts" not in names and "aegis_check_duration_seconds" not in names
