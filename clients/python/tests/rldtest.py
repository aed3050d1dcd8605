"""Helpers of the Python client's tests: where the daemon is, and a daemon
of a test's own that it may kill and start again.

clients/python/python_test.go sets, for `make test`:
  RLD_TEST_SOCKET  the socket of a running rld on rld-test.toml
  RLD_TEST_BINARY  the rld binary, for tests that start their own daemon
  RLD_TEST_REQUIRE 1: a test that lacks these fails instead of being skipped
"""

import base64
import hashlib
import hmac
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import rld  # noqa: E402

CONFIG = os.path.join(HERE, "rld-test.toml")
DEADLINE = 10.0  # seconds to wait for a condition before failing
#: The Python with Debian's gunicorn and uvicorn (scripts/deps.sh installs them).
SYSTEM_PYTHON = "/usr/bin/python3"
#: The secret of jwt-keys.json's key, for signing tokens the daemon verifies.
JWT_SECRET = b"rld-python-tests-hs256-secret-32by"


def config_text():
    """Returns rld-test.toml with @TESTS@ filled in."""
    with open(CONFIG) as f:
        return f.read().replace("@TESTS@", HERE)


def jwt(claims, secret=JWT_SECRET, kid="py-test"):
    """Returns an HS256 token of claims, signed with secret."""
    def b64(b):
        return base64.urlsafe_b64encode(b).rstrip(b"=")
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = b64(json.dumps(claims).encode())
    sig = b64(hmac.new(secret, head + b"." + body, hashlib.sha256).digest())
    return (head + b"." + body + b"." + sig).decode()


def random_peer():
    """Returns a loopback address no other test uses: 127.x.y.z, not 127.0.0.1."""
    return "127.%d.%d.%d" % (random.randint(1, 254), random.randint(0, 255), random.randint(1, 254))


def send(addr, target, headers=(), method="GET", peer="127.0.0.1", host="localhost"):
    """Writes one raw HTTP/1.1 request to addr ("host:port", "[::1]:port")
    from the address peer, exactly as given (target and header values are
    str or bytes, sent as they are), and returns (status, headers, body)."""
    h, _, port = addr.rpartition(":")
    h = h.strip("[]")
    family = socket.AF_INET6 if ":" in h else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(DEADLINE)
    try:
        s.bind((peer, 0))
        s.connect((h, int(port)))
        raw = b"%s %s HTTP/1.1\r\n" % (method.encode(), target if isinstance(target, bytes) else target.encode())
        if host is not None:
            raw += b"Host: " + host.encode() + b"\r\n"
        for k, v in headers:
            raw += k.encode() + b": " + (v if isinstance(v, bytes) else v.encode("latin-1")) + b"\r\n"
        raw += b"Connection: close\r\n\r\n"
        try:
            s.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a server that refuses a large request may close before reading it: its answer follows
        r = http.client.HTTPResponse(s)
        r.begin()
        return r.status, r.headers, r.read()
    finally:
        s.close()


class WebServer:
    """A real HTTP server (wsgiref, gunicorn or uvicorn, through serve.py)
    serving a hello app behind rld's middleware, on 127.0.0.1 and ::1."""

    def __init__(self, kind, socket_path, headers=None):
        if kind != "wsgiref" and not os.path.exists(SYSTEM_PYTHON):
            raise AssertionError(f"{SYSTEM_PYTHON} is missing (make deps)")
        self.kind = kind
        args = [SYSTEM_PYTHON if kind != "wsgiref" else sys.executable, os.path.join(HERE, "serve.py"), kind,
                socket_path]
        if headers is not None:
            args.append(",".join(headers))
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, start_new_session=True)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening "):
            self.close()
            raise AssertionError(f"{kind} did not start: {line!r} {self.logs()}")
        _, self.addr, self.addr6 = line.split()

    def logs(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


def env(name):
    """Returns the environment variable, skipping (or failing, with
    RLD_TEST_REQUIRE=1) the test when it is not set."""
    v = os.environ.get(name)
    if not v:
        msg = f"{name} is not set (run through go test ./clients/python)"
        if os.environ.get("RLD_TEST_REQUIRE") == "1":
            raise AssertionError(msg)
        raise unittest.SkipTest(msg)
    return v


def unique(prefix="t"):
    """Returns a key no other test run has used."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def poll(cond, what, deadline=DEADLINE):
    """Calls cond until it returns a true value, which it returns; fails
    after deadline seconds."""
    end = time.monotonic() + deadline
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}")
        time.sleep(0.01)


class Daemon:
    """An rld process of the test's own, on rld-test.toml, on a socket in a
    temporary directory; with http=True it serves HTTP on a free port."""

    def __init__(self, http=False):
        self.binary = env("RLD_TEST_BINARY")
        self.dir = tempfile.TemporaryDirectory(prefix="rld-py")
        self.socket = os.path.join(self.dir.name, "rld.sock")
        self.http_flag = "127.0.0.1:0" if http else "off"
        self.http = None
        self.proc = None
        self.start()

    def start(self):
        config = os.path.join(self.dir.name, "rld.toml")
        with open(config, "w") as f:
            f.write(config_text())
        log = open(os.path.join(self.dir.name, "rld.log"), "wb")
        self.proc = subprocess.Popen([self.binary, "serve", "-config", config, "-socket", self.socket,
                                      "-http", self.http_flag], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        c = rld.Client(self.socket, timeout=1)
        try:
            poll(lambda: self.proc.poll() is not None or c.ping(), "rld to answer a PING")
        finally:
            c.close()
        if self.proc.poll() is not None:
            raise AssertionError(f"rld exited: {self.logs()}")
        if self.http_flag != "off":
            m = re.search(r"http=(127\.0\.0\.1:\d+)", self.logs())
            assert m, self.logs()
            self.http = m.group(1)

    def logs(self):
        with open(os.path.join(self.dir.name, "rld.log"), errors="replace") as f:
            return f.read()

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            self.kill()
        self.dir.cleanup()
