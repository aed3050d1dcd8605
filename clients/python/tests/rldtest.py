"""Helpers of the Python client's tests: where the daemon is, and a daemon
of a test's own that it may kill and start again.

clients/python/python_test.go sets, for `make test`:
  RLD_TEST_SOCKET  the socket of a running rld on rld-test.toml
  RLD_TEST_BINARY  the rld binary, for tests that start their own daemon
  RLD_TEST_REQUIRE 1: a test that lacks these fails instead of being skipped
"""

import os
import re
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
        log = open(os.path.join(self.dir.name, "rld.log"), "wb")
        self.proc = subprocess.Popen([self.binary, "serve", "-config", CONFIG, "-socket", self.socket,
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
