"""Session lifecycle, capacity, isolation of pooled sandboxes, bad input, churn, auth."""

import asyncio
import json
import os
import shutil
import subprocess
import tempfile

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conftest import engine_binary, mounts_under, start_server
from envfactory import ServerError, Session


def ws(server):
    return server.url.replace("http://", "ws://") + "/ws"


async def call(sock, msg):
    await sock.send(msg if isinstance(msg, str) else json.dumps(msg))
    return json.loads(await sock.recv())


def test_a_pooled_sandbox_keeps_nothing_of_its_last_session(state_dir):
    with start_server(state_dir, "--max-sessions", "1", "--pool", "1") as srv:
        with Session(srv.url) as a:
            a.reset(task="archive-logs", seed=4)
            a.step("echo top-secret > /root/secret; echo x > /tmp/t; (sleep 1000 &) ; true")
            r = a.step("cat /root/secret; pgrep -x sleep >/dev/null && echo running")
            assert r.observation["stdout"].split() == ["top-secret", "running"]
        assert srv.wait_idle()["pooled_envs"] == 1
        with Session(srv.url) as b:
            # The pooled environment's episode was the last session's: not steppable.
            with pytest.raises(ServerError) as e:
                b.step("cat /root/secret")
            assert e.value.code == "EXECUTION_ERROR" and "before reset" in str(e.value)
            assert b.state()["started"] is False
            b.reset(task="archive-logs", seed=4)
            r = b.step("cat /root/secret /tmp/t; pgrep -x sleep || echo none")
            assert "top-secret" not in r.observation["stdout"]
            assert "none" in r.observation["stdout"]


def test_the_step_limit_is_per_reset_and_not_kept_by_the_pool(state_dir):
    with start_server(state_dir, "--max-sessions", "1", "--pool", "1") as srv:
        with Session(srv.url) as a:
            default = a.reset(task="archive-logs", seed=4).observation["max_steps"]
            assert default > 2
            r = a.reset(task="archive-logs", seed=4, max_steps=2)
            assert r.observation["max_steps"] == 2
            assert not a.step("true").truncated
            r = a.step("true")
            assert r.truncated and not r.terminated and r.done
            for bad in (0, -1, 10**7, "3"):
                with pytest.raises(ServerError) as e:
                    a.reset(task="archive-logs", seed=4, max_steps=bad)
                assert e.value.code == "VALIDATION_ERROR" and "max_steps" in str(e.value)
        assert srv.wait_idle()["pooled_envs"] == 1
        with Session(srv.url) as b:
            # The same pooled environment: the last session's limit is gone.
            assert b.reset(task="archive-logs", seed=4).observation["max_steps"] == default


def test_capacity_is_refused_with_its_code(state_dir):
    async def main(url):
        a = await connect(url)
        b = await connect(url)
        c = await connect(url)
        reply = json.loads(await c.recv())
        assert reply["type"] == "error" and reply["data"]["code"] == "CAPACITY_REACHED"
        assert reply["data"]["max_sessions"] == 2
        with pytest.raises(ConnectionClosed):
            await c.recv()
        st = await call(a, {"type": "state"})
        assert st["type"] == "state"
        await a.close()
        await b.close()

    with start_server(state_dir, "--max-sessions", "2") as srv:
        asyncio.run(main(ws(srv)))
        srv.wait_idle()
        # After the others left, a new session gets in.
        with Session(srv.url) as s:
            assert s.state()["started"] is False


def test_bad_frames_get_protocol_errors_and_the_session_goes_on(server):
    async def main():
        async with connect(ws(server), max_size=None) as s:
            cases = [
                ("{not json", "INVALID_JSON"),
                ("[1, 2]", "VALIDATION_ERROR"),
                ({"type": "jump"}, "UNKNOWN_TYPE"),
                ({"type": 7}, "VALIDATION_ERROR"),
                ({"type": "step"}, "VALIDATION_ERROR"),
                ({"type": "step", "data": {"index": "three"}}, "VALIDATION_ERROR"),
                ({"type": "step", "data": {"command": 5}}, "VALIDATION_ERROR"),
                ({"type": "step", "data": {"command": "ls", "index": 1}}, "VALIDATION_ERROR"),
                ({"type": "step", "data": {"index": -1}}, "VALIDATION_ERROR"),
                ({"type": "step", "data": {"command": "ls"}}, "EXECUTION_ERROR"),
                ({"type": "reset", "data": {"task": "no-such-task"}}, "VALIDATION_ERROR"),
                ({"type": "reset", "data": {"perturbations": ["no-such-fault"]}}, "VALIDATION_ERROR"),
                ({"type": "reset", "data": {"perturbations": ["disk-fill:free_pct=lots"]}}, "VALIDATION_ERROR"),
                ({"type": "reset", "data": {"template": "../../etc/passwd"}}, "VALIDATION_ERROR"),
                ({"type": "reset", "data": {"seed": -4}}, "VALIDATION_ERROR"),
                ({"type": "reset", "data": {"colour": "red"}}, "VALIDATION_ERROR"),
                ({"type": "state", "extra": 1}, "VALIDATION_ERROR"),
            ]
            for msg, code in cases:
                r = await call(s, msg)
                assert r["type"] == "error", (msg, r)
                assert r["data"]["code"] == code, (msg, r)
                assert r["data"]["message"]
            r = await call(s, {"type": "reset", "data": {"task": "archive-logs", "seed": 1}})
            assert r["type"] == "observation"
            r = await call(s, {"type": "step", "data": {"index": 10_000}})
            assert r["data"]["code"] == "VALIDATION_ERROR" and "out of range" in r["data"]["message"]
            r = await call(s, {"type": "step", "data": {"command": "echo still-here"}})
            assert r["data"]["observation"]["stdout"].strip() == "still-here"
            # A frame past the stated limit closes the socket with 1009.
            limit = server.get("/metadata")["max_frame_bytes"]
            await s.send(json.dumps({"type": "step", "data": {"command": "x" * (limit + 10)}}))
            with pytest.raises(ConnectionClosed) as e:
                await s.recv()
            assert e.value.rcvd is not None and e.value.rcvd.code == 1009

    asyncio.run(main())
    server.wait_idle()


def test_a_client_that_disappears_mid_step_leaks_nothing(server):
    before = server.wait_idle()

    async def main():
        s = await connect(ws(server))
        await call(s, {"type": "reset", "data": {"task": "archive-logs", "seed": 1}})
        await s.send(json.dumps({"type": "step", "data": {"command": "sleep 2; echo done"}}))
        await asyncio.sleep(0.3)
        s.transport.abort()  # no close frame: the client is gone

    asyncio.run(main())
    after = server.wait_idle()
    assert after["pooled_envs"] <= max(before["pooled_envs"], 1) + 1
    # Another session is unaffected and gets a working sandbox.
    with Session(server.url) as s:
        s.reset(task="archive-logs", seed=1)
        assert s.step("echo ok").observation["stdout"].strip() == "ok"


def test_ten_thousand_connections_opened_and_dropped(server):
    before = server.wait_idle()

    async def churn(n, width):
        url = ws(server)
        sem = asyncio.Semaphore(width)
        outcomes = {"ok": 0, "refused": 0}

        async def one(i):
            async with sem:
                s = await connect(url)
                try:
                    if i % 3 == 0:
                        s.transport.abort()
                    elif i % 3 == 1:
                        r = await call(s, "{garbage")
                        # Either the protocol's answer, or (past capacity) the refusal.
                        assert r["data"]["code"] in ("INVALID_JSON", "CAPACITY_REACHED"), r
                        outcomes["ok" if r["data"]["code"] == "INVALID_JSON" else "refused"] += 1
                        await s.close()
                    else:
                        await s.close()
                except ConnectionClosed:
                    outcomes["refused"] += 1

        await asyncio.gather(*(one(i) for i in range(n)))
        return outcomes

    outcomes = asyncio.run(churn(10_000, 64))
    assert outcomes["ok"] > 0
    after = server.wait_idle(60)
    assert after["pooled_envs"] == before["pooled_envs"]
    assert server.get("/health")["status"] == "healthy"


def test_idle_sessions_are_reaped(state_dir):
    async def main(url):
        s = await connect(url)
        await call(s, {"type": "reset", "data": {"task": "archive-logs", "seed": 1}})
        r = json.loads(await asyncio.wait_for(s.recv(), 20))
        assert r["type"] == "error" and r["data"]["code"] == "SESSION_ERROR"
        assert "idle" in r["data"]["message"]

    with start_server(state_dir, "--idle-timeout", "1", "--pool", "1") as srv:
        asyncio.run(main(ws(srv)))
        c = srv.wait_idle()
        assert c["pooled_envs"] == 1


def test_websocket_keepalive_pings_and_drops_a_silent_client(state_dir):
    import base64
    import socket

    def frames(sock, until):
        """Opcodes of the frames the server sends until it closes (or `until` seconds)."""
        sock.settimeout(until)
        buf, ops = b"", []
        try:
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    return ops, True
                buf += chunk
                while len(buf) >= 2:
                    n = buf[1] & 0x7F
                    if len(buf) < 2 + n:
                        break
                    ops.append(buf[0] & 0x0F)
                    buf = buf[2 + n:]
                    if ops[-1] == 0x8:
                        return ops, True
        except socket.timeout:
            return ops, False

    with start_server(state_dir, "--keepalive", "0.3", "--idle-timeout", "60") as srv:
        host, port = srv.url.split("//")[1].split(":")
        sock = socket.create_connection((host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert b" 101 " in head.split(b"\r\n")[0]
        assert srv.counts()["active_sessions"] == 1
        # The server pings; a client that never answers (no pong, no frame) is dropped after
        # three intervals, and its session closed.
        ops, closed = frames(sock, 10)
        sock.close()
        assert ops.count(0x9) >= 2, ops
        assert closed, ops
        srv.wait_idle()

    async def answering(url):
        # A client that answers pings (the library does) keeps its session past many intervals.
        s = await connect(url, ping_interval=None)
        await asyncio.sleep(2)
        assert (await call(s, {"type": "state"}))["type"] == "state"
        await s.close()

    with start_server(state_dir, "--keepalive", "0.3", "--idle-timeout", "60") as srv:
        asyncio.run(answering(ws(srv)))


def test_non_loopback_needs_a_token(state_dir, tmp_path):
    r = subprocess.run(
        [engine_binary(), "serve", "--bind", "0.0.0.0:0"],
        capture_output=True, text=True, env={**os.environ, "ENVFACTORY_STATE": state_dir}, timeout=30,
    )
    assert r.returncode == 2 and "token" in r.stderr
    loose = tmp_path / "loose"
    loose.write_text("a" * 32)
    loose.chmod(0o644)
    r = subprocess.run(
        [engine_binary(), "serve", "--bind", "0.0.0.0:0", "--token-file", str(loose)],
        capture_output=True, text=True, env={**os.environ, "ENVFACTORY_STATE": state_dir}, timeout=30,
    )
    assert r.returncode == 2 and "readable by group or others" in r.stderr

    token = "t0k3n-" + "x" * 26
    f = tmp_path / "token"
    f.write_text(token + "\n")
    f.chmod(0o600)
    with start_server(state_dir, "--token-file", str(f), bind="0.0.0.0:0") as srv:
        import urllib.error
        import urllib.request
        with pytest.raises(urllib.error.HTTPError) as e:
            srv.get("/health")
        assert e.value.code == 401
        with pytest.raises(urllib.error.HTTPError):
            srv.get("/health", headers={"Authorization": "Bearer " + token[:-1] + "y"})
        assert srv.get("/health", headers={"Authorization": "Bearer " + token})["status"] == "healthy"

        async def refused():
            with pytest.raises(Exception):
                await connect(ws(srv))

        asyncio.run(refused())
        with Session(srv.url, token=token) as s:
            s.reset(task="archive-logs", seed=1)
            assert s.step("echo authed").observation["stdout"].strip() == "authed"


def test_http_and_mcp_sessions(server):
    st, r = server.post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert st == 200 and {t["name"] for t in r["result"]["tools"]} >= {"reset", "run_command", "catalogue_action", "state"}
    st, r = server.post("/mcp", b"{oops")
    assert r["error"]["code"] == -32700
    st, r = server.post("/mcp", {"jsonrpc": "2.0", "id": 2, "method": "nope"})
    assert r["error"]["code"] == -32601
    st, r = server.post("/mcp", {"jsonrpc": "2.0", "id": 3, "method": "openenv/session/create"})
    sid = r["result"]["session_id"]
    st, r = server.post("/mcp", {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                                 "params": {"session_id": sid, "name": "reset", "arguments": {"task": "archive-logs", "seed": 1}}})
    assert r["result"]["isError"] is False and "catalogue" in r["result"]["structuredContent"]["observation"]
    st, r = server.post("/mcp", {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                 "params": {"session_id": sid, "name": "run_command", "arguments": {"command": "echo via-mcp"}}})
    assert r["result"]["structuredContent"]["observation"]["stdout"].strip() == "via-mcp"
    st, r = server.post("/step", {"session_id": sid, "action": {"command": "echo via-http"}})
    assert st == 200 and r["observation"]["stdout"].strip() == "via-http"
    assert server.get(f"/state?session_id={sid}")["step_count"] == 2
    st, r = server.post("/step", {"action": {"command": "true"}})
    assert st == 422
    st, r = server.post("/step", {"session_id": "0" * 32, "action": {"command": "true"}})
    assert st == 404 and r["detail"]["code"] == "SESSION_ERROR"
    # A stateless reset runs in a session of its own.
    st, r = server.post("/reset", {"task": "archive-logs", "seed": 2})
    assert st == 200 and r["done"] is False and r["observation"]["catalogue"]
    st, r = server.post("/reset", {"task": "nope"})
    assert st == 422 and r["detail"]["code"] == "VALIDATION_ERROR"
    st, r = server.post("/mcp", {"jsonrpc": "2.0", "id": 6, "method": "openenv/session/close", "params": {"session_id": sid}})
    assert r["result"]["closed"] is True
    st, r = server.post("/mcp", {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                 "params": {"session_id": sid, "name": "state", "arguments": {}}})
    assert "error" in r
    server.wait_idle()


def test_the_server_leaves_no_mounts():
    # A state directory of its own: no other server's sandboxes are counted.
    own = tempfile.mkdtemp(prefix="envfactory-py-mounts-")
    env = {**os.environ, "ENVFACTORY_STATE": own}
    try:
        assert mounts_under(own) == 0
        with start_server(own, "--pool", "4") as srv:
            with Session(srv.url) as s:
                s.reset(task="archive-logs", seed=1)
                s.step("true")
                live = mounts_under(own, srv.proc.pid)
                assert live > 1, "a live session's sandbox has its mounts (overlay, side trees)"
            pid = srv.proc.pid
        # The server and its sandboxes are gone: no process of it holds a mount any more, and
        # only the instance cache's tmpfs may stay (it outlives servers; `reap --cache` removes it).
        assert mounts_under(own, pid) <= 1
        subprocess.run([engine_binary(), "reap", "--cache"], env=env, check=True, stdout=subprocess.DEVNULL)
        assert mounts_under(own) == 0
    finally:
        subprocess.run([engine_binary(), "reap", "--cache"], env=env, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(own, ignore_errors=True)
