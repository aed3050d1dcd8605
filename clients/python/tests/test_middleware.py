"""WSGI and ASGI middleware through real HTTP servers and real requests."""

import asyncio
import json
import os
import tempfile
import threading
import unittest
import urllib.error
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

import logging
import socketserver
from wsgiref.simple_server import WSGIServer

from rldtest import Daemon, env, poll, rld, unique

RATE_HEADERS = ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit")


def get(url, headers=None):
    """GETs url; returns (status, headers, body), whatever the status."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers, e.read()


def hello_wsgi(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("X-App", "hello")])
    return [b"hello\n"]


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class Server:
    """A wsgiref server on 127.0.0.1:0, serving in a thread."""

    def __init__(self, app):
        self.httpd = make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


class Sequence:
    """The checks both middlewares must pass, given a base URL."""

    def assert_limit_sequence(self, base):
        key = unique()
        statuses = []
        for i in range(5):
            # Query strings and doubled slashes are the same endpoint.
            path = ("/limited", "//limited", "/limited?x=1", "/limited//", "///limited?a=b")[i]
            status, h, body = get(base + path, {"X-API-Key": key})
            statuses.append(status)
            self.assertEqual(body, b"hello\n")
            self.assertEqual(h["X-App"], "hello")
            self.assertEqual(h["X-RateLimit-Limit"], "5")
            self.assertEqual(h["X-RateLimit-Remaining"], str(4 - i))
            # A fixed window: t is the time left in the window.
            self.assertRegex(h["RateLimit"], f'^"five";r={4 - i};t=[0-9]+$')
            self.assertLessEqual(int(h["RateLimit"].rsplit("=", 1)[1]), 3600)
            self.assertEqual(h["RateLimit-Policy"], '"five";q=5;w=3600')
            self.assertIsNone(h["Retry-After"])
        self.assertEqual(statuses, [200] * 5)
        status, h, body = get(base + "/limited", {"X-API-Key": key})
        self.assertEqual(status, 429)
        for name in RATE_HEADERS:
            self.assertIsNotNone(h[name], name)
        self.assertEqual(h["X-RateLimit-Remaining"], "0")
        self.assertGreaterEqual(int(h["Retry-After"]), 1)
        self.assertEqual(h["RateLimit"], f'"five";r=0;t={h["Retry-After"]}')
        self.assertEqual(h["Content-Type"], "application/json")
        doc = json.loads(body)
        self.assertEqual(doc["error"]["code"], "RATE_LIMIT_EXCEEDED")
        self.assertEqual(doc["error"]["details"]["rule"], "five")
        self.assertEqual(doc["error"]["details"]["retry_after_seconds"], int(h["Retry-After"]))
        # Another key is not limited.
        self.assertEqual(get(base + "/limited", {"X-API-Key": unique()})[0], 200)

    def assert_blocked(self, base):
        status, h, body = get(base + "/anything", {"X-API-Key": "blocked-" + unique()})
        self.assertEqual(status, 403)
        self.assertEqual(json.loads(body)["error"]["code"], "BLOCKED")
        self.assertIsNone(h["X-App"])

    def assert_unlimited(self, base):
        status, h, body = get(base + "/free")
        self.assertEqual((status, body), (200, b"hello\n"))
        for name in RATE_HEADERS:
            self.assertIsNone(h[name], "no rule applied: no rate-limit header")


class WSGITest(unittest.TestCase, Sequence):
    def serve(self, client, **kw):
        s = Server(rld.WSGIMiddleware(hello_wsgi, client, **kw))
        self.addCleanup(s.close)
        return s.url

    def test_sequence_blocked_unlimited(self):
        c = rld.Client(env("RLD_TEST_SOCKET"), timeout=5)
        self.addCleanup(c.close)
        base = self.serve(c)
        self.assert_limit_sequence(base)
        self.assert_blocked(base)
        self.assert_unlimited(base)

    def test_api_key_header_is_configurable(self):
        c = rld.Client(env("RLD_TEST_SOCKET"), timeout=5)
        self.addCleanup(c.close)
        base = self.serve(c, api_key_header="Authorization-Key")
        key = unique()
        self.assertEqual(get(base + "/limited", {"Authorization-Key": key})[1]["X-RateLimit-Remaining"], "4")
        self.assertEqual(get(base + "/limited", {"X-API-Key": key})[1]["X-RateLimit-Remaining"], None)

    def test_fail_open_and_closed(self):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        nobody = os.path.join(d.name, "nobody.sock")
        with self.assertLogs("rld"):
            status, h, body = get(self.serve(rld.Client(nobody)) + "/limited", {"X-API-Key": "k"})
        self.assertEqual((status, body), (200, b"hello\n"))
        self.assertIsNone(h["X-RateLimit-Limit"])
        with self.assertLogs("rld"):
            status, _, body = get(self.serve(rld.Client(nobody, fail_open=False)) + "/limited", {"X-API-Key": "k"})
        self.assertEqual(status, 503)
        self.assertEqual(json.loads(body)["error"]["code"], "UNAVAILABLE")


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class KillUnderLoadTest(unittest.TestCase):
    def test_no_5xx_when_rld_is_killed_and_back(self):
        # Requests in a loop from 4 threads while rld is killed and started
        # again: every answer is 200; with rate-limit headers while rld
        # answers, without while it is down, with them again once it is back.
        d = Daemon()
        self.addCleanup(d.close)
        c = rld.Client(d.socket, timeout=0.5, retry_interval=0.01, log_interval=3600)
        self.addCleanup(c.close)
        app = rld.WSGIMiddleware(hello_wsgi, c, extra=lambda env: [("group", "a"), ("k", unique())])
        httpd = make_server("127.0.0.1", 0, app, server_class=ThreadingWSGIServer, handler_class=QuietHandler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        self.addCleanup(httpd.server_close)
        self.addCleanup(httpd.shutdown)
        url = f"http://127.0.0.1:{httpd.server_port}/v1/anything"
        stop = threading.Event()
        seen = {"limited": 0, "open": 0}
        bad = []
        lock = threading.Lock()

        def worker():
            while not stop.is_set():
                try:
                    status, h, _ = get(url)
                except OSError as e:  # a refused HTTP connection is a failure too
                    status, h = repr(e), {}
                with lock:
                    if status != 200:
                        bad.append(status)
                    elif h.get("X-RateLimit-Limit") == "1000":
                        seen["limited"] += 1
                    else:
                        seen["open"] += 1

        logging.getLogger("rld").disabled = True
        self.addCleanup(setattr, logging.getLogger("rld"), "disabled", False)
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            poll(lambda: seen["limited"] >= 50, "answers checked by rld")
            d.kill()
            poll(lambda: seen["open"] >= 50, "answers while rld is down")
            d.start()
            before = seen["limited"]
            poll(lambda: seen["limited"] >= before + 50, "answers checked by the restarted rld")
        finally:
            stop.set()
            for t in threads:
                t.join()
        self.assertEqual(bad, [])


class DescriptorsTest(unittest.TestCase):
    def test_wsgi_descriptors(self):
        m = rld.WSGIMiddleware(hello_wsgi, None, trusted_proxies=["10.0.0.0/8"],
                               extra=lambda env: [("tenant", env.get("HTTP_X_TENANT", "none"))])
        env_ = {"REMOTE_ADDR": "10.1.2.3", "HTTP_X_FORWARDED_FOR": "198.51.100.7, 10.9.9.9",
                "PATH_INFO": "//v1//search/", "REQUEST_METHOD": "POST", "HTTP_X_API_KEY": "sk_1", "HTTP_X_TENANT": "acme"}
        self.assertEqual(m.descriptors(env_), [("ip", b"198.51.100.7"), ("api_key", b"sk_1"), ("endpoint", b"/v1/search/"),
                                               ("method", b"POST"), ("tenant", b"acme")])
        # An untrusted peer cannot choose its address.
        env_["REMOTE_ADDR"] = "203.0.113.9"
        self.assertEqual(m.descriptors(env_)[0], ("ip", b"203.0.113.9"))
        # Values are cut to the protocol's 1024 bytes.
        env_["HTTP_X_API_KEY"] = "k" * 5000
        env_["HTTP_X_TENANT"] = "t" * 2000
        self.assertEqual(len(dict(m.descriptors(env_))["api_key"]), 1024)
        self.assertEqual(dict(m.descriptors(env_))["tenant"], b"t" * 1024, "extra values too")

    def test_normalize_path(self):
        for path, want in (("/", "/"), ("", "/"), ("//a///b", "/a/b"), ("/a?b=//c", "/a"), ("a/b/", "/a/b/")):
            self.assertEqual(rld.normalize_path(path), want)


class ASGIServer:
    """A minimal HTTP/1.1 server driving an ASGI app: one request per
    connection, as the ASGI spec's http scope describes it."""

    def __init__(self, app):
        self.app = app

    async def start(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = "http://127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    async def handle(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            if line:
                k, v = line.split(":", 1)
                headers.append((k.strip().lower().encode("latin-1"), v.strip().encode("latin-1")))
        path, _, query = target.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
                 "root_path": "", "headers": headers, "client": writer.get_extra_info("peername"),
                 "server": writer.get_extra_info("sockname")}
        out = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            out.append(message)

        await self.app(scope, receive, send)
        start = out[0]
        body = b"".join(m.get("body", b"") for m in out[1:])
        resp = [f"HTTP/1.1 {start['status']} X"]
        resp += [f"{k.decode('latin-1')}: {v.decode('latin-1')}" for k, v in start["headers"]]
        resp += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        writer.write("\r\n".join(resp).encode("latin-1") + body)
        await writer.drain()
        writer.close()


async def hello_asgi(scope, receive, send):
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"x-app", b"hello")]})
    await send({"type": "http.response.body", "body": b"hello\n"})


class ASGITest(unittest.TestCase, Sequence):
    def run_against(self, client, check):
        async def main():
            srv = ASGIServer(rld.ASGIMiddleware(hello_asgi, client))
            await srv.start()
            try:
                await asyncio.get_running_loop().run_in_executor(None, check, srv.url)
            finally:
                srv.server.close()
                await srv.server.wait_closed()
                await client.close()

        asyncio.run(main())

    def test_sequence_blocked_unlimited(self):
        def check(base):
            self.assert_limit_sequence(base)
            self.assert_blocked(base)
            self.assert_unlimited(base)

        self.run_against(rld.AsyncClient(env("RLD_TEST_SOCKET"), timeout=5), check)

    def test_fail_open_and_closed(self):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        nobody = os.path.join(d.name, "nobody.sock")
        got = {}
        with self.assertLogs("rld"):
            self.run_against(rld.AsyncClient(nobody), lambda base: got.setdefault("open", get(base + "/limited")))
            self.run_against(rld.AsyncClient(nobody, fail_open=False),
                             lambda base: got.setdefault("closed", get(base + "/limited")))
        self.assertEqual((got["open"][0], got["open"][2]), (200, b"hello\n"))
        self.assertEqual(got["closed"][0], 503)

    def test_other_scopes_pass_through(self):
        seen = []

        async def app(scope, receive, send):
            seen.append(scope["type"])

        async def main():
            m = rld.ASGIMiddleware(app, rld.AsyncClient("/nonexistent"))
            await m({"type": "lifespan"}, None, None)

        asyncio.run(main())
        self.assertEqual(seen, ["lifespan"])


if __name__ == "__main__":
    unittest.main()
