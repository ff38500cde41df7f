"""``aegis-flow rehearse``'s pictures of a Workflow status (``view``) and its ``argosay`` stand-in.

The expected rows follow Argo v4.0.5's ``argo get`` (cmd/argo/commands/common/get.go and its
get_test.go); the argosay expectations are what the v2 image's script (dash, GNU tools, C
locale) does, checked against the script itself when these files were written.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from aegis_flow.argo.rehearse import argosay, view

WF = "retry-demo-x7k2p"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SVG = "{http://www.w3.org/2000/svg}"


def ts(hms: str) -> str:
    return f"2026-12-01T{hms}Z"


def node(name: str, display: str, kind: str, phase: str, start: str, finish: str | None,
         *, template: str = "say", boundary: str = WF, children: tuple[str, ...] = (),
         **extra: Any) -> dict[str, Any]:
    nid = view.node_id(WF, name)
    n: dict[str, Any] = {"id": nid, "name": name, "displayName": display, "type": kind,
                         "templateName": template, "phase": phase, "startedAt": ts(start),
                         "boundaryID": boundary, "children": [view.node_id(WF, c)
                                                              for c in children], **extra}
    if finish is not None:
        n["finishedAt"] = ts(finish)
    if not boundary:
        del n["boundaryID"]
    return n


def demo_status() -> dict[str, Any]:
    """Two step groups: ``hello``; then ``flaky`` (a Retry: attempt 0 failed, attempt 1 passed)
    beside ``skipme`` (``when`` false); and an exit handler. Laid out as Argo's controller
    does: the next StepGroup hangs off the previous group's outbound node."""
    nodes = [
        node(WF, WF, "Steps", "Succeeded", "10:00:00", "10:01:10", template="main", boundary="",
             children=(f"{WF}[0]",)),
        node(f"{WF}[0]", "[0]", "StepGroup", "Succeeded", "10:00:00", "10:00:05",
             template="main", children=(f"{WF}[0].hello",)),
        node(f"{WF}[0].hello", "hello", "Pod", "Succeeded", "10:00:00", "10:00:05",
             children=(f"{WF}[1]",), hostNodeName="local", podIP="10.0.0.5",
             outputs={"parameters": [{"name": "greeting", "value": "hi"}], "exitCode": "0"}),
        node(f"{WF}[1]", "[1]", "StepGroup", "Succeeded", "10:00:06", "10:01:10",
             template="main", children=(f"{WF}[1].flaky", f"{WF}[1].skipme")),
        node(f"{WF}[1].flaky", "flaky", "Retry", "Succeeded", "10:00:06", "10:01:10",
             children=(f"{WF}[1].flaky(0)", f"{WF}[1].flaky(1)")),
        node(f"{WF}[1].flaky(0)", "flaky(0)", "Pod", "Failed", "10:00:06", "10:00:16",
             message="Error (exit code 1)", outputs={"exitCode": "1"}),
        node(f"{WF}[1].flaky(1)", "flaky(1)", "Pod", "Succeeded", "10:00:26", "10:01:10",
             outputs={"exitCode": "0"}),
        node(f"{WF}[1].skipme", "skipme", "Skipped", "Skipped", "10:00:06", "10:00:06",
             message="when 'false' evaluated false"),
        node(f"{WF}.onExit", f"{WF}.onExit", "Pod", "Succeeded", "10:01:11", "10:01:13",
             template="exit-handler", boundary="", outputs={"exitCode": "0"}),
    ]
    return {"phase": "Succeeded", "startedAt": ts("10:00:00"), "finishedAt": ts("10:01:14"),
            "progress": "3/4", "message": "", "nodes": {n["id"]: n for n in nodes}}


def pod(name: str, template: str = "say") -> str:
    return view.pod_name(WF, name, template)


# ---- argo get ----------------------------------------------------------------------------

def test_the_tree_has_argo_gets_rows_in_order_with_its_joints_and_icons() -> None:
    text = view.tree_text(WF, demo_status())
    head, table = text.split("\n\n", 1)
    assert head.splitlines() == [
        f"Name:                {WF}",
        "Status:              Succeeded",
        "Duration:            1 minute 14 seconds",
        "Progress:            3/4"]
    a0, a1, hello = pod(f"{WF}[1].flaky(0)"), pod(f"{WF}[1].flaky(1)"), pod(f"{WF}[0].hello")
    exit_pod = pod(f"{WF}.onExit", "exit-handler")
    rows = [r.rstrip() for r in table.splitlines()]
    w = len(f" ✔ {WF}.onExit") + 2  # the STEP column: its longest cell plus Go's padding
    t = len("exit-handler") + 2
    p = len(exit_pod) + 2
    assert rows == [
        "STEP".ljust(w) + "TEMPLATE".ljust(t) + "PODNAME".ljust(p) + "DURATION  MESSAGE",
        f" ✔ {WF}".ljust(w) + "main",
        " ├───✔ hello".ljust(w) + "say".ljust(t) + hello.ljust(p) + "5s",
        " └─┬─✔ flaky".ljust(w) + "say",
        "   │ ├─✖ flaky(0)".ljust(w) + "say".ljust(t) + a0.ljust(p) + "10s".ljust(10)
        + "Error (exit code 1)",
        "   │ └─✔ flaky(1)".ljust(w) + "say".ljust(t) + a1.ljust(p) + "44s",
        "   └─○ skipme".ljust(w) + "say".ljust(t) + " " * (p + 10)
        + "when 'false' evaluated false",
        "",
        f" ✔ {WF}.onExit".ljust(w) + "exit-handler".ljust(t) + exit_pod.ljust(p) + "2s",
    ]


def test_rows_keep_gos_tabwriter_padding_and_the_header_does_not() -> None:
    table = view.tree_text(WF, demo_status()).split("\n\n", 1)[1]
    header, first = table.splitlines()[:2]
    assert header.endswith("MESSAGE")  # the last cell of a line is never padded
    message_width = len("when 'false' evaluated false") + 2
    assert first.endswith(" " * message_width)  # an empty, tab-terminated MESSAGE cell is
    assert len(set(map(len, table.splitlines()[1:3]))) == 1


def test_colour_wraps_icons_in_ansi_and_keeps_the_columns_aligned() -> None:
    plain = view.tree_text(WF, demo_status())
    coloured = view.tree_text(WF, demo_status(), color=True)
    assert "\x1b[32m✔\x1b[0m hello" in coloured and "\x1b[31m✖\x1b[0m flaky(0)" in coloured
    assert "\x1b[39mSTEP\x1b[0m" in coloured
    # Go pads the onExit tree's empty separator row to the wider coloured column too
    assert [r.rstrip() for r in ANSI.sub("", coloured).splitlines()] == [
        r.rstrip() for r in plain.splitlines()]


def test_the_go_helpers_match_argo() -> None:
    # get_test.go "IndexOrdering": node many-items-z26lj-2619926859's pod
    name = "many-items-z26lj[0].sleep(9:nine)"
    assert view.node_id("many-items-z26lj", name) == "many-items-z26lj-2619926859"
    assert view.pod_name("many-items-z26lj", name, "sleep") == "many-items-z26lj-sleep-2619926859"
    assert view.pod_name(WF, WF, "main") == WF
    assert [view.recover_index(n) for n in ("s(10:ten)", "s(x:y)", "s", "a:b(c")] == [
        10, -1, -1, -1]
    short = [view.short_duration(0, s * view._NS, None)
             for s in (0, 1, 59, 61, 119, 120, 3599, 3600, 7200, 86400, 864000)]
    assert short == ["0s", "1s", "59s", "1m", "1m", "2m", "59m", "1h", "2h", "1d", "10d"]
    long = [view.long_duration(s * view._NS) for s in (0, 1, 5, 74, 3 * 3600 + 300,
                                                        2 * 86400 + 3 * 3600)]
    assert long == ["0 seconds", "1 second", "5 seconds", "1 minute 14 seconds",
                    "3 hours 5 minutes", "2 days 3 hours"]


def test_siblings_go_by_start_time_then_item_index_not_by_name() -> None:
    nodes = [node(WF, WF, "Steps", "Running", "10:00:00", None, template="main", boundary="",
                  children=(f"{WF}[0]",)),
             node(f"{WF}[0]", "[0]", "StepGroup", "Running", "10:00:00", None,
                  children=tuple(f"{WF}[0].s({i}:{v})" for i, v in ((10, "ten"), (2, "two"),
                                                                    (1, "one")))),
             node(f"{WF}[0].s(10:ten)", "s(10:ten)", "Pod", "Succeeded", "10:00:01", "10:00:04"),
             node(f"{WF}[0].s(2:two)", "s(2:two)", "Pod", "Running", "10:00:01", None),
             node(f"{WF}[0].s(1:one)", "s(1:one)", "Pod", "Pending", "10:00:02", None)]
    status = {"phase": "Running", "startedAt": ts("10:00:00"),
              "nodes": {n["id"]: n for n in nodes}}
    rows = view.tree_text(WF, status, now=ts("10:02:30")).split("\n\n", 1)[1].splitlines()
    steps = [r.split()[:3] for r in rows[2:]]
    assert steps == [["└─┬─●", "s(2:two)", "say"], ["├─✔", "s(10:ten)", "say"],
                     ["└─◷", "s(1:one)", "say"]]
    assert rows[2].split()[-1] == "2m"  # running: measured up to `now`
    assert "Duration:            2 minutes 30 seconds" in view.tree_text(WF, status,
                                                                         now=ts("10:02:30"))


def test_a_lone_retry_attempt_and_an_omitted_node_are_not_rows() -> None:
    status = demo_status()
    flaky = status["nodes"][view.node_id(WF, f"{WF}[1].flaky")]
    flaky["children"] = flaky["children"][1:]
    del status["nodes"][view.node_id(WF, f"{WF}[1].flaky(0)")]
    status["nodes"][view.node_id(WF, f"{WF}[1].skipme")]["phase"] = "Omitted"
    rows = [r.rstrip() for r in view.tree_text(WF, status).splitlines()]
    assert any(r.startswith(" └─┬─✔ flaky(1)") for r in rows)  # in the Retry's place
    assert not any("skipme" in r or r.endswith(" flaky") for r in rows)


def test_unknown_phases_types_and_junk_do_not_crash() -> None:
    status = demo_status()
    hello = status["nodes"][view.node_id(WF, f"{WF}[0].hello")]
    hello["phase"], hello["type"] = "Bizarre", "Pod"
    status["nodes"]["odd"] = {"id": "odd", "type": "Container", "phase": "???",
                              "children": ["nowhere", 7], "startedAt": "yesterday"}
    status["nodes"]["loop"] = {"id": "loop", "type": "Retry", "children": ["loop"]}
    text = view.tree_text(WF, status)
    assert "   hello" in text.replace("├───", "   ")  # no icon for a phase Argo has none for
    assert "odd" not in text
    root = ET.fromstring(view.svg_text(WF, status))
    fills = {g.get("data-id"): g.find(f"{SVG}rect").get("fill")  # type: ignore[union-attr]
             for g in root.iter(f"{SVG}g") if g.get("class") == "node"}
    assert fills["odd"] == fills[hello["id"]] == view.UNKNOWN_COLOUR
    for junk in ({}, {"nodes": None}, {"nodes": {WF: {"type": "Steps", "boundaryID": "x"}}}):
        assert view.tree_text(WF, junk).startswith(f"Name:                {WF}\n")
        ET.fromstring(view.svg_text(WF, junk))


# ---- the graph ---------------------------------------------------------------------------

def test_the_svg_has_a_box_per_node_circles_for_step_groups_and_the_uis_colours(
        tmp_path: Path) -> None:
    status = demo_status()
    path = tmp_path / "graph.svg"
    view.write_svg(WF, status, path)
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    boxes = {g.get("data-id"): g for g in root.iter(f"{SVG}g") if g.get("class") == "node"}
    circles = [c.get("data-id", "") for c in root.iter(f"{SVG}circle")]
    nodes = status["nodes"]
    assert set(boxes) == {i for i, n in nodes.items() if n["type"] != "StepGroup"}
    assert sorted(circles) == sorted(view.node_id(WF, f"{WF}[{i}]") for i in (0, 1))

    def fill(name: str) -> str | None:
        rect = boxes[view.node_id(WF, name)].find(f"{SVG}rect")
        assert rect is not None and rect.get("rx")
        return rect.get("fill")

    assert fill(f"{WF}[0].hello") == fill(WF) == "#18BE94"
    assert fill(f"{WF}[1].flaky(0)") == "#E96D76"
    assert fill(f"{WF}[1].skipme") == view.PHASE_COLOURS["Skipped"]
    labels = {i: [t.text for t in g.iter(f"{SVG}text")] for i, g in boxes.items()}
    assert labels[view.node_id(WF, f"{WF}[1].flaky(0)")] == ["flaky(0)", "Error (exit code 1)"]
    assert labels[view.node_id(WF, f"{WF}[1].flaky(1)")] == ["flaky(1)", "exit code 0"]
    edges = {(e.get("data-from"), e.get("data-to")) for e in root.iter(f"{SVG}path")}
    assert edges == {(i, c) for i, n in nodes.items() for c in n["children"]}


def test_the_graph_is_layered_top_down_children_in_order_and_onexit_last() -> None:
    layers = view.graph_layers(WF, demo_status())
    name = {view.node_id(WF, n): n.removeprefix(WF) or WF for n in
            (WF, f"{WF}[0]", f"{WF}[0].hello", f"{WF}[1]", f"{WF}[1].flaky",
             f"{WF}[1].skipme", f"{WF}[1].flaky(0)", f"{WF}[1].flaky(1)", f"{WF}.onExit")}
    assert [[name[i] for i in layer] for layer in layers] == [
        [WF], ["[0]"], ["[0].hello"], ["[1]"], ["[1].flaky", "[1].skipme"],
        ["[1].flaky(0)", "[1].flaky(1)"], [".onExit"]]


# ---- argosay -----------------------------------------------------------------------------

def say(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "aegis_flow.argo.rehearse.argosay", *args],
                          cwd=cwd, capture_output=True, timeout=30, check=False)


@pytest.mark.parametrize(("args", "rc", "out", "err"), [
    ((), 0, b"hello argo\n", b""),
    (("",), 0, b"hello argo\n", b""),
    (("echo",), 0, b"hello argo\n", b""),
    (("echo", "hello"), 0, b"hello\n", b""),
    (("echo", r"a\tb\0101\c-cut"), 0, b"a\tbA", b""),  # dash's echo: escapes, \c ends it
    (("echo", "-n"), 0, b"", b""),
    (("echo", "a", "b", "c"), 0, b"", b""),  # the script's `default)` never matches
    (("exit",), 0, b"", b""),
    (("exit", "3"), 3, b"", b""),
    (("exit", "256"), 0, b"", b""),
    (("exit", "foo"), 2, b"", b"/argosay: 28: exit: Illegal number: foo\n"),
    (("sleep", "0.05s"), 0, b"", b""),
    (("sleep", "500ms"), 1, b"", b"sleep: invalid time interval '500ms'\n"
     b"Try 'sleep --help' for more information.\n"),
    (("sleep",), 2, b"", b"/argosay: 31: 2: parameter not set\n"),
    (("cat",), 2, b"", b"/argosay: 12: 2: parameter not set\n"),
    (("cat", "no such"), 1, b"", b"cat: 'no such': No such file or directory\n"),
    (("assert_contains", "f"), 2, b"", b"/argosay: 9: 3: parameter not set\n"),
    (("assert_contains", "missing", "x"), 2, b"", b"grep: missing: No such file or directory\n"),
    # planted errors: real argosay v2 exits 1, silently, for a sub-command it does not have
    (("bogus",), 1, b"", b""),
    (("assert_exists", "f"), 1, b"", b""),
])
def test_argosay_matches_the_v2_script(tmp_path: Path, args: tuple[str, ...], rc: int,
                                       out: bytes, err: bytes) -> None:
    done = say(*args, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (rc, out, err)


def test_argosay_echo_to_a_file_makes_its_directory_then_cat_and_assert_read_it(
        tmp_path: Path) -> None:
    target = tmp_path / "out" / "deep" / "x"
    done = say("echo", "hello", str(target), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, b"")
    assert target.read_bytes() == b"hello\n"
    assert say("cat", str(target), cwd=tmp_path).stdout == b"hello\n"
    found = say("assert_contains", str(target), "ell", cwd=tmp_path)
    assert (found.returncode, found.stdout) == (0, b"hello\n")
    assert say("assert_contains", str(target), "bye", cwd=tmp_path).returncode == 1


def test_argosay_sleeps_and_runs_sh(tmp_path: Path) -> None:
    began = time.monotonic()
    assert say("sleep", "0.3", cwd=tmp_path).returncode == 0
    assert time.monotonic() - began >= 0.3
    (tmp_path / "s.sh").write_text("echo from-script\nexit 4\n")
    done = say("sh", "s.sh", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (4, b"from-script\n")


def test_argosay_pure_helpers() -> None:
    assert argosay.dash_echo(b"x\\qy\\") == b"x\\qy\\\n"
    assert argosay.dash_echo(b"\\1234") == b"S4\n"
    assert [argosay.sleep_seconds(a) for a in ("5", "2s", "0.5m", "1h", "1d", ".5", "1e1")] == [
        5.0, 2.0, 30.0, 3600.0, 86400.0, 0.5, 10.0]
    assert [argosay.sleep_seconds(a) for a in ("500ms", "1m30s", "x", "", "1 ")] == [None] * 5
    assert [argosay.gnu_dirname(p) for p in ("a", "/a", "/a/b/", "a//b", "", "/")] == [
        ".", "/", "/a", "a", ".", "/"]
