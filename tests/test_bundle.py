"""The supervisor bundle: wheel tags (pure), and the real ``.pyz`` run by a Python that has none
of our dependencies, against a real nats-server and a real master."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from aegis_flow.bundle import boot
from aegis_flow.bundle.build import (
    BundleError,
    NativeSet,
    WheelName,
    build,
    pair_wheels,
    platform_glibc,
)
from aegis_flow.local.natsserver import EmbeddedNats
from tests.jobs import assert_nothing_left

CFFI = "cffi-2.1.1-{py}-{py}-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
NACL = "pynacl-1.6.2-cp38-abi3-manylinux_2_34_x86_64.whl"


def test_wheel_names_and_glibc_floors() -> None:
    w = WheelName.parse(CFFI.format(py="cp312"))
    assert (w.dist, w.python, w.abi) == ("cffi", ("cp312",), ("cp312",))
    assert platform_glibc("manylinux_2_28_aarch64") == ("aarch64", (2, 28))
    assert platform_glibc("manylinux2014_x86_64") == ("x86_64", (2, 17))
    assert platform_glibc("musllinux_1_2_x86_64") is None
    with pytest.raises(BundleError, match="not a wheel file name"):
        WheelName.parse("cffi-2.1.1.tar.gz")


def test_each_cffi_wheel_pairs_with_pynacl_at_the_newer_glibc_floor() -> None:
    names = [WheelName.parse(n) for n in (
        CFFI.format(py="cp310"), CFFI.format(py="cp313"), NACL,
        "pynacl-1.6.2-cp38-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "cffi-2.1.1-cp312-cp312-musllinux_1_2_x86_64.whl",
        "cffi-2.1.1-cp311-cp311-manylinux_2_17_aarch64.whl")]  # no PyNaCl for aarch64 here
    sets = [ns for ns, _, _ in pair_wheels(names)]
    assert sets == [
        NativeSet("cp310", "x86_64", (2, 17),
                  ("nacl-x86_64-glibc2.17", "cffi-cp310-x86_64-glibc2.17")),
        NativeSet("cp313", "x86_64", (2, 17),
                  ("nacl-x86_64-glibc2.17", "cffi-cp313-x86_64-glibc2.17"))]  # PyNaCl shared
    only_new = pair_wheels([WheelName.parse(CFFI.format(py="cp311")), WheelName.parse(NACL)])
    assert only_new[0][0].name == "cp311-x86_64-glibc2.34"


def test_the_boot_picks_the_set_for_this_python_machine_and_glibc() -> None:
    sets = [NativeSet("cp311", "x86_64", (2, 34)).manifest(),
            NativeSet("cp312", "x86_64", (2, 17)).manifest()]
    pick = boot.choose_native
    assert pick(sets, python_tag="cp311", machine="x86_64", glibc=(2, 36)) == \
        "cp311-x86_64-glibc2.34"
    assert pick(sets, python_tag="cp311", machine="x86_64", glibc=(2, 31)) is None  # too old
    assert pick(sets, python_tag="cp311", machine="aarch64", glibc=(2, 36)) is None
    assert pick(sets, python_tag="cp310", machine="x86_64", glibc=(2, 36)) is None
    assert pick(sets, python_tag="cp312", machine="x86_64", glibc=None) is None  # musl


def test_a_directory_without_pairing_wheels_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no PyNaCl abi3 \\+ cffi"):
        build(tmp_path / "b.pyz", native_wheels=tmp_path)


# -- the real bundle, under a clean Python ----------------------------------------------------

@pytest.fixture(scope="module")
def clean_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh venv without pip, from the base interpreter: none of our dependencies."""
    where = tmp_path_factory.mktemp("clean") / "venv"
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(where)], check=True)
    py = str(where / "bin" / "python")
    probe = subprocess.run(
        [py, "-I", "-c", "import importlib.util as u; print([m for m in ('nats', 'nkeys', "
         "'nacl', 'aegis_flow', 'pydantic', 'torch') if u.find_spec(m)])"],
        capture_output=True, text=True, check=True, cwd=str(where))
    assert probe.stdout.strip() == "[]", probe.stdout  # the premise of every test below
    return py


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("bundle") / "aegis-supervisor.pyz").path


def _nkey_user() -> tuple[str, bytes]:
    import nkeys
    from nacl.signing import SigningKey

    seed = nkeys.encode_seed(bytes(SigningKey.generate()), nkeys.PREFIX_BYTE_USER)
    return nkeys.from_seed(seed).public_key.decode(), seed


BASE = str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}")


@pytest.mark.parametrize("flags", [["-I"], ["-I", "-S"]], ids=["venv -I", "base -I -S"])
def test_bundle_info_under_a_clean_python(clean_python: str, bundle: Path, tmp_path: Path,
                                          flags: list[str]) -> None:
    python = clean_python if "-S" not in flags else BASE  # -S: not even the base's site dirs
    out = subprocess.run([python, *flags, str(bundle), "--bundle-info"],
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ["PATH"], "AEGIS_BUNDLE_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert info["native_set"] is not None and info["native_set"].startswith(tag)
    assert (info["nats"], info["nkeys"]) == ("ok", "ok")  # signed and verified a nonce
    assert Path(info["unpacked"]).parent == tmp_path
    with zipfile.ZipFile(bundle) as zf:
        names = zf.namelist()
    assert "payload/aegis_flow/supervisor/agent.py" in names
    assert not any(n.startswith("payload/aegis_flow/templates/") for n in names)  # worker side


def test_a_real_job_runs_through_the_bundle_with_nkey_auth(
        clean_python: str, bundle: Path, tmp_path: Path) -> None:
    """nats-server requiring an nkey for workers; a real master; two ranks whose supervisor is
    the bundle run by the clean Python; each writes its outcome files at exit."""
    public, seed = _nkey_user()
    seed_file = tmp_path / "worker.nk"
    seed_file.write_bytes(seed)
    conf = tmp_path / "nats.conf"
    conf.write_text("authorization {\n  users = [\n    {user: master, password: unused-x9}\n"
                    f"    {{nkey: {public}}}\n  ]\n}}\nno_auth_user: master\n")
    with EmbeddedNats(tmp_path / "nats", config_file=conf) as server:
        master = subprocess.Popen(
            [sys.executable, "-m", "aegis_flow.master", "--job", "bundled", "--workers", "2",
             "--max-retry", "1", "--nats-url", server.url, "--linger", "0.5",
             "--metrics-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        env = {"PATH": os.environ["PATH"], "AEGIS_BUNDLE_CACHE": str(tmp_path / "cache")}
        hello = tmp_path / "hello.py"
        hello.write_text("import os, sys, aegis_flow.progress\nprint('hello from rank', "
                         "os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n"
                         "print('forked from the pre-warmed interpreter:', 'runpy' in "
                         "sys.modules)\n")
        commands = [  # rank 0: a shell; rank 1: Python, forked from the pre-warmed
            # interpreter, importing aegis_flow (on PYTHONPATH from the bundle) itself
            ["--no-prewarm", "--", "sh", "-c", 'echo "hello from rank $RANK of $WORLD_SIZE"'],
            ["--", clean_python, str(hello)]]
        workers = [subprocess.Popen(
            [clean_python, "-I", str(bundle), "--job", "bundled", "--rank", str(r),
             "--world-size", "2", "--nats-url", server.url, "--nkey-seed", str(seed_file),
             "--node", f"node-{r}", "--work-dir", str(tmp_path),
             "--outcome-dir", str(tmp_path / f"out{r}"), *commands[r]],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            for r in range(2)]
        try:
            outs = [w.communicate(timeout=150)[0] for w in workers]
            master_out = master.communicate(timeout=60)[0]
        finally:
            for proc in (*workers, master):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    for r, (w, out) in enumerate(zip(workers, outs, strict=True)):
        assert w.returncode == 0, out + master_out
        assert f"hello from rank {r} of 2" in out
        assert "FAULT TOLERANCE IS OFF" not in out  # it really talked to the master
        if r == 1:  # a plain `python script.py` never imports runpy; the zygote's fork does
            assert "forked from the pre-warmed interpreter: True" in out, out
        assert (tmp_path / f"out{r}" / "outcome").read_text() == "succeeded"
        assert (tmp_path / f"out{r}" / "node").read_text() == f"node-{r}"
        assert not [p.name for p in (tmp_path / f"out{r}").iterdir() if p.name.startswith(".")]
    assert master.returncode == 0, master_out
    assert_nothing_left(str(tmp_path))


def test_a_seed_the_server_does_not_know_is_rejected(
        clean_python: str, bundle: Path, tmp_path: Path) -> None:
    """The seed is really presented: an unknown user is refused, and the worker falls back."""
    known, _ = _nkey_user()
    _, stranger = _nkey_user()
    (tmp_path / "stranger.nk").write_bytes(stranger)
    conf = tmp_path / "nats.conf"
    conf.write_text(f"authorization {{ users = [ {{nkey: {known}}} ] }}\n")
    with EmbeddedNats(tmp_path / "nats", config_file=conf) as server:
        out = subprocess.run(
            [clean_python, "-I", str(bundle), "--job", "j", "--rank", "0", "--world-size", "1",
             "--nats-url", server.url, "--nkey-seed", str(tmp_path / "stranger.nk"),
             "--connect-timeout", "3", "--no-prewarm", "--outcome-dir", str(tmp_path / "o"),
             "--", "sh", "-c", "exit 3"],
            capture_output=True, text=True, timeout=60,
            env={"PATH": os.environ["PATH"], "AEGIS_BUNDLE_CACHE": str(tmp_path / "c")})
    assert out.returncode == 3, out.stderr  # RunIndependent: the command's own code
    assert "FAULT TOLERANCE IS OFF" in out.stderr
    assert "authorization" in out.stderr.lower()
    assert (tmp_path / "o" / "outcome").read_text() == "failed"


def test_without_a_native_set_an_nkey_is_refused_clearly(
        clean_python: str, tmp_path: Path) -> None:
    pure = build(tmp_path / "pure.pyz", native_from_env=False).path
    (tmp_path / "any.nk").write_text("SUAAAA")
    out = subprocess.run(
        [clean_python, "-I", str(pure), "--job", "j", "--rank", "0", "--world-size", "1",
         "--nats-url", "nats://127.0.0.1:1", "--nkey-seed", str(tmp_path / "any.nk"),
         "--no-prewarm", "--outcome-dir", str(tmp_path / "o"), "--", "sh", "-c", "exit 0"],
        capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ["PATH"], "AEGIS_BUNDLE_CACHE": str(tmp_path / "c")})
    assert out.returncode == 0, out.stderr
    assert "need nkeys and PyNaCl" in out.stderr and "Traceback" not in out.stderr
    assert (tmp_path / "o" / "outcome").read_text() == "succeeded"


def test_check_pods_run_the_checks_from_the_bundle(clean_python: str, bundle: Path,
                                                   tmp_path: Path) -> None:
    out = subprocess.run(
        [clean_python, "-I", str(bundle), "check", "env,runtime", "--json",
         "--out", str(tmp_path / "r.json"), "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
        env={"PATH": os.environ["PATH"], "AEGIS_BUNDLE_CACHE": str(tmp_path / "c")})
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads((tmp_path / "r.json").read_text())
    assert {r["check_type"] for r in results} == {"env", "runtime"}


OPTIONAL = {"torch", "numpy", "pynvml", "tomli", "py_spy"}  # the checks import them lazily


def unbundled_imports(files: dict[str, str]) -> set[tuple[str, str]]:
    """(file, module) for every import of a bundled file that the bundle cannot satisfy."""
    import ast

    bundled = {n.removeprefix("payload/").removesuffix(".py").removesuffix("/__init__")
               .replace("/", ".") for n in files}
    packages = {n.removeprefix("payload/").removesuffix("/__init__.py").replace("/", ".")
                for n in files if n.endswith("/__init__.py")}
    missing = set()
    for name, text in files.items():
        for node in ast.walk(ast.parse(text, name)):
            wanted: list[str] = []
            if isinstance(node, ast.Import):
                wanted = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                wanted = [node.module]
                if node.module in packages:  # from package import X: a submodule, or a
                    init = files["payload/" + node.module.replace(".", "/") + "/__init__.py"]
                    wanted += [f"{node.module}.{a.name}" for a in node.names  # name in __init__
                               if not re.search(rf"\b{a.name}\b", init)]
            for mod in wanted:
                root = mod.split(".")[0]
                if root == "aegis_flow" and mod not in bundled:
                    missing.add((name, mod))
                elif root != "aegis_flow" and root not in sys.stdlib_module_names and \
                        root not in ("nats", "nkeys", *OPTIONAL):
                    missing.add((name, mod))
    return missing


def test_every_module_the_payload_imports_is_in_the_payload(bundle: Path) -> None:
    """Drift guard: a new import in the supervisor of a module the bundle leaves out would only
    fail in a user's image. Every ``aegis_flow`` module a bundled file imports is bundled;
    every third-party one is nats or nkeys (or one the checks import lazily)."""
    with zipfile.ZipFile(bundle) as zf:
        files = {n: zf.read(n).decode() for n in zf.namelist()
                 if n.startswith("payload/") and n.endswith(".py")}
    assert unbundled_imports(files) == set()
    planted = {**files, "payload/aegis_flow/supervisor/planted.py":
               "from aegis_flow import workflow\nimport aegis_flow.k8s.client\nimport yaml\n"}
    assert unbundled_imports(planted) == {
        ("payload/aegis_flow/supervisor/planted.py", "aegis_flow.workflow"),
        ("payload/aegis_flow/supervisor/planted.py", "aegis_flow.k8s.client"),
        ("payload/aegis_flow/supervisor/planted.py", "yaml")}
