"""Fixtures: `engine serve` started on a free loopback port, stopped (SIGTERM) afterwards."""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def engine_binary() -> str:
    explicit = os.environ.get("ENVFACTORY_ENGINE")
    if explicit:
        return explicit
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return str(target / "debug" / "engine")


@pytest.fixture(scope="session")
def state_dir():
    """A private state dir (instance cache, runtime state), reaped at the end."""
    d = os.environ.get("ENVFACTORY_STATE")
    own = d is None
    if own:
        d = tempfile.mkdtemp(prefix="envfactory-py-")
    yield d
    if own:
        subprocess.run([engine_binary(), "reap", "--cache"], env={**os.environ, "ENVFACTORY_STATE": d}, check=False)
        shutil.rmtree(d, ignore_errors=True)


class Server:
    def __init__(self, proc, url):
        self.proc = proc
        self.url = url

    def get(self, path, headers=None):
        req = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def post(self, path, body, headers=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def counts(self):
        return self.get("/metadata")["capacity"]

    def wait_idle(self, timeout=30.0):
        """Until no session is open (closing is asynchronous to the client's disconnect)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            c = self.counts()
            if c["active_sessions"] == 0:
                return c
            time.sleep(0.05)
        raise AssertionError(f"sessions still open: {self.counts()}")


@contextlib.contextmanager
def start_server(state_dir, *args, bind="127.0.0.1:0", headers=None):
    env = {**os.environ, "ENVFACTORY_STATE": state_dir}
    # The server's log goes to a file (a pipe nobody reads would fill and block the server).
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(
        [engine_binary(), "serve", "--bind", bind, "--templates", str(REPO / "templates"), *args],
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            proc.wait(timeout=10)
            log.seek(0)
            raise RuntimeError(f"engine serve did not start: {line!r} {log.read()}")
        url = line.split()[-1].replace("0.0.0.0", "127.0.0.1")
        yield Server(proc, url)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def server(state_dir):
    with start_server(state_dir, "--max-sessions", "32", "--pool", "8") as s:
        yield s


def _descends_from(pid, root):
    """Whether process `pid` is `root` or one of its descendants (by the ppid chain)."""
    for _ in range(64):
        if pid == root:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def mounts_under(path, server_pid=None):
    """Mounts whose mount point or source lies under `path`, in this process's mount namespace
    and, with `server_pid`, in those of that server's processes (each namespace counted once):
    its live sandboxes'. Since host masks live in the mask store (`/dev/shm`), a server mounts
    nothing in the host's namespace for its sandboxes; their overlays, side trees and bind
    mounts are in their own namespaces. Sandboxes of other servers are not counted (each holds
    a copy of the host's mount table from when it was made)."""
    def count(pid):
        with open(f"/proc/{pid}/mountinfo") as f:
            return sum(1 for line in f if path in line.split()[4] or path in line.split(" - ")[-1])

    seen = {os.readlink("/proc/self/ns/mnt")}
    total = count("self")
    if server_pid is None:
        return total
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or not _descends_from(int(pid), server_pid):
            continue
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
            if ns in seen:
                continue
            n = count(pid)
        except OSError:
            continue  # the process ended meanwhile
        seen.add(ns)
        total += n
    return total
