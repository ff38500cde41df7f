"""Pre-warmed interpreter ("zygote") for fast in-place restarts. Runs as a standalone script.

Started by the supervisor with the user's own Python (``python zygote.py``), it imports torch,
``torch._dynamo``, ``torch.nn.parallel`` and ``torch.distributed`` once (never touching CUDA),
then forks one training process per request: the fork skips the ~2 s of ``import torch`` and the
~1 s lazy dynamo import of the first DDP step. Self-contained on purpose (standard library
only, torch optional): it must run in an image where aegis-flow itself is not installed.

Protocol on the inherited Unix socket (fd in AEGIS_ZYGOTE_FD), JSON lines:
  zygote → "ready" (or "ready-without-checks": aegis-flow's checks cannot be imported in this
  interpreter, so the supervisor runs them in its own; or {"refused": why} and it exits: what it
  imported initialised CUDA, which no forked child could use); request {id, argv, env, cwd} with the
  child's stdout fd (SCM_RIGHTS) →
  {"id": id, "pid": N} or {"id": id, "error": "..."} (the request's id, echoed: the supervisor
  matches a reply to its request, so a reply to a cancelled request never answers a later
  one); later {"exit": N, "code": C, "signal": S|null}.
Side effects: forks processes, sends signals to them when the supervisor goes away, rewrites
its own and each child's command line (what ``ps`` shows: :func:`set_title`).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

PRELOAD = ("torch", "torch._dynamo", "torch.nn.parallel", "torch.distributed")
# the checks run in a fork of this process too: keep their modules warm when importable
CHECK_MODULES = ("aegis_flow.steps.cli", "aegis_flow.steps.collective",
                 "aegis_flow.steps.runtime", "aegis_flow.steps.io", "aegis_flow.steps.gpu",
                 "aegis_flow.steps.rdma", "aegis_flow.steps.env")


TITLE_ROOM = 512  # bytes of command line the supervisor reserves for set_title (prewarm.py)


def set_title(title: str, name: str = "") -> bool:
    """Make ``ps`` show ``title`` as this process's command line (and ``name``, cut to 15
    bytes, as the name ``top`` and ``ps -o comm`` show), in place, as setproctitle does
    without a C extension: the kernel reads the command line from the process's original argv
    memory (``arg_start``..``arg_end`` of ``/proc/self/stat``), which Python copied at startup
    and never reads again. A title longer than that memory is cut. False where that cannot
    be done."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48, 49: arg_start, arg_end
    except (OSError, IndexError, ValueError):
        return False
    room = end - start
    if room < 2:
        return False
    data = title.encode(errors="replace")[:room - 1]
    ctypes.memmove(start, data + b"\0" * (room - len(data)), room)
    if name:
        try:
            ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        except (OSError, AttributeError):
            pass
    return True


def _send(sock: socket.socket, obj: object) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _arm_exit_injection(env: dict[str, str]) -> None:
    spec = env.pop("AEGIS_INJECT_EXIT", "")
    marker = env.pop("AEGIS_INJECT_MARKER", "")
    for name in ("AEGIS_INJECT_EXIT", "AEGIS_INJECT_MARKER"):
        os.environ.pop(name, None)
    if not spec:
        return
    code, _, after = spec.partition(":")

    def fire() -> None:
        if marker:  # tells aegis-flow run that the fault fired
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_WRONLY, 0o644))
            except OSError:
                pass
        sys.stderr.write(f"[aegis-flow inject] exiting with code {code}\n")
        sys.stderr.flush()
        os._exit(int(code))

    timer = threading.Timer(float(after or 0), fire)
    timer.daemon = True
    timer.start()


AUTO_PERIOD = 0.5  # seconds between two automatic progress reports (only when changed)


def _arm_progress(env: dict[str, str]) -> bool:
    """Count the training process's progress with no change to its code: every optimizer step
    (torch's global optimizer-step hook) and every outermost module forward (torch's global
    module hooks), and the time those forwards take. A daemon thread sends the counts to the
    supervisor's progress socket (``$AEGIS_PROGRESS_SOCKET``) every ``AUTO_PERIOD`` s when they
    changed, as one datagram ``a <optimizer steps> <forwards> <last activity, epoch s>
    <mean forward ms since the last report>`` — the thread runs while the main thread is
    blocked in a collective, so the last count always gets out. False (nothing armed) when
    torch was not pre-imported, there is no socket, or ``AEGIS_AUTO_PROGRESS=0``."""
    path = env.get("AEGIS_PROGRESS_SOCKET", "")
    if not path or "torch" not in sys.modules or env.get("AEGIS_AUTO_PROGRESS", "1") == "0":
        return False
    try:  # by name: this script imports no torch of its own (only what PRELOAD warmed)
        tmodule = importlib.import_module("torch.nn.modules.module")
        toptim = importlib.import_module("torch.optim.optimizer")
    except Exception:  # noqa: BLE001 - an unusual torch: no automatic progress
        return False
    state = {"steps": 0, "forwards": 0, "last": time.time(), "depth": 0, "began": 0.0,
             "fwd_s": 0.0, "fwd_n": 0}

    def stepped(*_: object) -> None:
        state["steps"] += 1
        state["last"] = time.time()

    def before(*_: object) -> None:
        if state["depth"] == 0:
            state["began"] = time.perf_counter()
        state["depth"] += 1

    def after(*_: object) -> None:
        state["depth"] = max(0, state["depth"] - 1)
        if state["depth"] == 0:
            state["fwd_s"] += time.perf_counter() - state["began"]
            state["fwd_n"] += 1
            state["forwards"] += 1
            state["last"] = time.time()

    try:
        toptim.register_optimizer_step_post_hook(stepped)
        tmodule.register_module_forward_pre_hook(before)
        tmodule.register_module_forward_hook(after, always_call=True)
    except Exception:  # noqa: BLE001
        return False

    def send() -> None:
        out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        out.setblocking(False)
        # nothing until the first forward or step: before that, output counts
        sent: tuple[float, float] = (0, 0)
        while True:
            time.sleep(AUTO_PERIOD)
            now = (state["steps"], state["forwards"])
            if now == sent:
                continue
            n = state["fwd_n"]
            mean_ms = 1000.0 * state["fwd_s"] / n if n else -1.0
            state["fwd_s"], state["fwd_n"] = 0.0, 0
            try:
                out.sendto(b"a %d %d %.3f %.3f" % (now[0], now[1], state["last"], mean_ms), path)
                sent = now
            except OSError:
                pass  # the supervisor is busy or gone: training must never notice

    threading.Thread(target=send, name="aegis-progress", daemon=True).start()
    return True


# The script's globals (and an exception's frames) are kept until os._exit: freeing them when
# runpy returns ran the destructors of a DDP model there, and ~ProcessGroupGloo joined a gloo
# thread that was waiting for the GIL the destructor held — a process that never exited
# (seen with py-spy, torch 2.13). The child ends with os._exit: never freeing them loses
# nothing.
_KEEP: list[object] = []


def _child(req: dict[str, object], out_fd: int, sock: socket.socket) -> None:
    """In the forked child: become the training process. Never returns."""
    code = 1
    try:
        os.setsid()
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # die with the zygote
        except Exception:  # noqa: BLE001
            pass
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        sock.close()
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        env = {str(k): str(v) for k, v in dict(req["env"]).items()}  # type: ignore[call-overload]
        _arm_exit_injection(env)
        _arm_progress(env)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(str(req["cwd"]))
        argv = [str(a) for a in req["argv"]]  # type: ignore[attr-defined]
        set_title(f"{' '.join(argv)} [aegis-flow rank {env.get('RANK', '?')} · "
                  f"{env.get('AEGIS_WORK_DIR', '')}]",
                  os.path.basename(argv[2] if argv[1] == "-m" else argv[1]))
        import runpy

        if argv[1] == "-m":
            sys.argv = [argv[2], *argv[3:]]
            # as in a cold `python -m`: the module itself runs fresh as __main__ (a copy warmed
            # here would make runpy warn); what it imports stays warm
            sys.modules.pop(argv[2], None)
            _KEEP.append(runpy.run_module(argv[2], run_name="__main__", alter_sys=True))
        else:
            sys.argv = argv[1:]
            sys.path[0] = os.path.dirname(os.path.abspath(argv[1]))
            _KEEP.append(runpy.run_path(argv[1], run_name="__main__"))
        code = 0
    except SystemExit as exc:
        _KEEP.append(exc)
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            sys.stderr.write(f"{exc.code}\n")
            code = 1
    except BaseException as exc:  # noqa: BLE001 - report like the interpreter would
        _KEEP.append(exc)
        sys.stderr.write(user_traceback(exc))
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def user_traceback(exc: BaseException) -> str:
    """The traceback as ``python script.py`` would print it: the frames of this pre-warmed
    interpreter and of ``runpy`` that lead into the user's code are left out (a user reading
    them would think aegis-flow crashed)."""
    import runpy

    te = traceback.TracebackException.from_exception(exc)
    ours = {os.path.abspath(__file__), "<frozen runpy>", getattr(runpy, "__file__", "")}
    frames = list(te.stack)
    while frames and frames[0].filename in ours:
        frames.pop(0)
    te.stack = traceback.StackSummary.from_list(frames)
    return "".join(te.format())


def cuda_initialised() -> bool:
    """Has this interpreter initialised CUDA? A forked child cannot use its parent's CUDA
    context (torch raises "Cannot re-initialize CUDA in forked subprocess"), so a fork server
    that has one must not fork training processes. Never initialises CUDA itself."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without cuda support: it has none
        return False


CUDA_REFUSAL = ("the pre-warmed interpreter initialised CUDA while importing {what}: a forked "
                "child cannot use its parent's CUDA context, so every rank starts cold (keep "
                "CUDA calls out of import time, or set AEGIS_PRELOAD to modules that do not "
                "touch it)")


def main() -> int:
    sock = socket.socket(fileno=int(os.environ.pop("AEGIS_ZYGOTE_FD")))
    # the same command line, without the room kept for the children's titles
    set_title(" ".join([sys.executable, *(a for a in sys.argv if a.strip())]), "aegis-zygote")
    preload = os.environ.get("AEGIS_PRELOAD")
    names = PRELOAD if preload is None else tuple(filter(None, preload.split(",")))
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - torch is optional: then only Python is warm
            break
    checks = True  # can the checks run in a fork of this interpreter?
    for name in CHECK_MODULES if preload is None else ():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - aegis-flow may not be installed in this image
            checks = False
    wake_r, wake_w = os.pipe()  # SIGCHLD wakes the select below: no polling
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    if checks and preload is not None:  # nothing pre-imported: can it find them at all?
        checks = importlib.util.find_spec("aegis_flow") is not None
    if cuda_initialised():  # a preloaded module touched CUDA: this process must not fork
        _send(sock, {"refused": CUDA_REFUSAL.format(what=", ".join(names) or "nothing")})
        return 0
    _send(sock, "ready" if checks else "ready-without-checks")
    children: set[int] = set()
    buf = b""
    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [], 5.0)
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        while children:  # reap and report
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status), "signal": sig})
        if sock.fileno() not in ready:
            continue
        data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
        if not data:  # the supervisor is gone: so are we, and our children
            for pid in children:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return 0
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            rid = req.get("id")  # echoed: the supervisor matches replies to requests by it
            if not fds:
                _send(sock, {"id": rid, "error": "request without an output fd"})
                continue
            out_fd = fds.pop(0)
            if cuda_initialised():  # never fork a CUDA context (checked before every fork)
                os.close(out_fd)
                _send(sock, {"id": rid, "error": CUDA_REFUSAL.format(what="its modules")})
                continue
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                _child(req, out_fd, sock)
            os.close(out_fd)
            children.add(pid)
            _send(sock, {"id": rid, "pid": pid, "at": time.time()})


if __name__ == "__main__":
    sys.exit(main())
