"""WSGI and ASGI middleware through real HTTP servers and real requests."""

import asyncio
import json
import os
import tempfile
import threading
import unittest
import urllib.error
import urllib.parse
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

import logging
import socketserver
from wsgiref.simple_server import WSGIServer

import hashlib
import time

from rldtest import Daemon, WebServer, env, jwt, poll, random_peer, rld, send, unique

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
    """The checks every server must pass, through the middleware and the
    daemon's derivation ([request] in rld-test.toml). self.server is a
    rldtest.WebServer."""

    def send(self, target, headers=(), **kw):
        return send(self.server.addr, target, headers, **kw)

    def test_limit_sequence(self):
        # Five per hour per API key on /limited*: the paths the daemon
        # normalises to /limited are one endpoint, one bucket.
        key = unique()
        paths = ("/limited", "//limited", "/limited?x=1", "/./limited/", "/x/../limited;p=1")
        for i, path in enumerate(paths):
            status, h, body = self.send(path, [("X-API-Key", key)])
            self.assertEqual((status, body), (200, b"hello\n"), path)
            self.assertEqual(h["X-App"], "hello")
            self.assertEqual(h["X-RateLimit-Limit"], "5")
            self.assertEqual(h["X-RateLimit-Remaining"], str(4 - i), path)
            self.assertRegex(h["RateLimit"], f'^"five";r={4 - i};t=[0-9]+$')
            self.assertEqual(h["RateLimit-Policy"], '"five";q=5;w=3600')
            self.assertIsNone(h["Retry-After"])
        status, h, body = self.send("/limited", [("X-API-Key", key)])
        self.assertEqual(status, 429)
        for name in RATE_HEADERS:
            self.assertIsNotNone(h[name], name)
        self.assertGreaterEqual(int(h["Retry-After"]), 1)
        self.assertEqual(h["Content-Type"], "application/json")
        doc = json.loads(body)
        self.assertEqual(doc["error"]["code"], "RATE_LIMIT_EXCEEDED")
        self.assertEqual(doc["error"]["details"]["rule"], "five")
        self.assertIsNone(h["X-App"])
        # Another key is not limited; nor is the same key over IPv6 on
        # another endpoint.
        self.assertEqual(self.send("/limited", [("X-API-Key", unique())])[0], 200)
        status, h, _ = send(self.server.addr6, "/limited", [("X-API-Key", unique())], peer="::1")
        self.assertEqual((status, h["X-RateLimit-Remaining"]), (200, "4"), "served on ::1")

    def test_blocked(self):
        status, h, body = self.send("/anything", [("X-API-Key", "blocked-" + unique())])
        self.assertEqual(status, 403)
        self.assertEqual(json.loads(body)["error"]["code"], "BLOCKED")
        self.assertIsNone(h["X-App"])

    def test_unlimited(self):
        status, h, body = self.send("/free")
        self.assertEqual((status, body), (200, b"hello\n"))
        for name in RATE_HEADERS:
            self.assertIsNone(h[name], "no rule applied: no rate-limit header")

    def test_long_api_key_is_digested_not_failed_open(self):
        # A 5000-byte key (over the 4096 of a header) is sent as its
        # digest: the daemon answers (headers present), the same key is
        # one bucket, and its sixth request is refused.
        key = unique() + "k" * 5000
        for i in range(5):
            status, h, _ = self.send("/limited", [("X-API-Key", key)])
            self.assertEqual((status, h["X-RateLimit-Remaining"]), (200, str(4 - i)))
        self.assertEqual(self.send("/limited", [("X-API-Key", key)])[0], 429)
        # A key that differs only past the first 4096 bytes is another key.
        other = key[:-1] + "j"
        self.assertEqual(self.send("/limited", [("X-API-Key", other)])[1]["X-RateLimit-Remaining"], "4")

    def test_abuser_stays_refused(self):
        # An address refused by a per-IP rule stays refused whatever it
        # adds to the request.
        peer = random_peer()
        for _ in range(2):
            self.assertEqual(self.send("/abuse", peer=peer)[0], 200)
        self.assertEqual(self.send("/abuse", peer=peer)[0], 429)
        now = int(time.time())
        tries = [
            ("/abuse", [("X-API-Key", "k" * 2048)]),
            ("/abuse", [("X-API-Key", "k" * 100 * 1024)]),
            ("//abuse", []), ("///abuse/", []), ("/./abuse", []), ("/x/../abuse", []), ("/%2e%2e/abuse", []),
            ("/%61buse", []), ("/%2Fabuse", []), ("/abuse%2F", []), ("/abuse;jsessionid=x", []),
            ("/abuse?page=2", []), ("/ABUSE/..//abuse", []),
            ("/abuse", [("X-Forwarded-For", "198.51.100.7")]),
            ("/abuse", [("X-Forwarded-For", "198.51.100.7, 127.0.0.1")]),
            ("/abuse", [("X-Real-IP", "198.51.100.8")]),
            ("/abuse", [("Forwarded", "for=198.51.100.9")]),
            ("/abuse", [("X-Forwarded-For", "1." * 3000 + "1")]),
            ("/abuse", [("Authorization", "Bearer " + jwt({"sub": "root"}, secret=b"forged"))]),
            ("/abuse", [("Authorization", "Bearer " + jwt({"sub": "root", "exp": now - 3600}))]),
            ("/abuse", [("Authorization", "Bearer " + jwt({"sub": "root", "exp": now + 3600}))]),
            ("/abuse", [("Authorization", "Bearer not.a.token")]),
            ("/abuse", [("Cookie", "sid=" + "c" * 10000)]),
        ]
        for target, headers in tries:
            with self.subTest(target=target, headers=[(k, v[:40]) for k, v in headers]):
                try:
                    status, h, _ = self.send(target, headers, peer=peer)
                except ConnectionError:  # the server refused a large request by closing: not served
                    self.assertGreater(sum(len(v) for _, v in headers), 8190)
                    continue
                self.assertFalse(200 <= status < 300, f"served {status}")
                self.assertGreaterEqual(status, 400)
                if status == 429:
                    self.assertEqual(json.loads(_)["error"]["details"]["rule"], "per-ip")
        # The trusted proxy (127.0.0.1) names the client: another address
        # behind it is not refused.
        self.assertEqual(self.send("/abuse", [("X-Forwarded-For", random_peer())])[0], 200)

    def test_keyless_requests_share_no_bucket(self):
        # No API key (or an empty one) derives no api_key: the keyed rule
        # does not apply, and keyless requests from any address are never
        # counted together.
        for i in range(7):
            headers = [] if i % 2 else [("X-API-Key", " " if i % 4 else "")]
            status, h, _ = self.send("/limited", headers, peer=random_peer() if i % 3 else "127.0.0.1")
            self.assertEqual(status, 200, i)
            self.assertIsNone(h["X-RateLimit-Limit"], "no rule applied")

    def test_jwt_subject(self):
        # A verified token's subject is counted per user; a forged or an
        # expired one names nobody.
        sub, now = unique(), int(time.time())
        good = "Bearer " + jwt({"sub": sub, "exp": now + 3600})
        for i in range(2):
            status, h, _ = self.send("/user", [("Authorization", good)], peer=random_peer())
            self.assertEqual((status, h["X-RateLimit-Remaining"]), (200, str(1 - i)))
        self.assertEqual(self.send("/user", [("Authorization", good)], peer=random_peer())[0], 429)
        for token in (jwt({"sub": sub}, secret=b"forged"), jwt({"sub": sub, "exp": now - 3600})):
            status, h, _ = self.send("/user", [("Authorization", "Bearer " + token)])
            self.assertEqual(status, 200)
            self.assertIsNone(h["X-RateLimit-Limit"], "not counted as the user")


class RealServer(Sequence):
    kind = ""

    @classmethod
    def setUpClass(cls):
        cls.server = WebServer(cls.kind, env("RLD_TEST_SOCKET"))

    @classmethod
    def tearDownClass(cls):
        cls.server.close()


class WSGIRefTest(RealServer, unittest.TestCase):
    kind = "wsgiref"


class GunicornTest(RealServer, unittest.TestCase):
    kind = "gunicorn"


class UvicornTest(RealServer, unittest.TestCase):
    kind = "uvicorn"


class WSGITest(unittest.TestCase):
    def serve(self, client, **kw):
        s = Server(rld.WSGIMiddleware(hello_wsgi, client, **kw))
        self.addCleanup(s.close)
        return s.url

    def test_by_hand_descriptors_with_attributes(self):
        # extra's descriptors go in the same frame; a derived one (endpoint)
        # overrides the by-hand one of the same name.
        c = rld.Client(env("RLD_TEST_SOCKET"), timeout=5)
        self.addCleanup(c.close)
        key = unique()
        base = self.serve(c, extra=lambda e: [("endpoint", "/free"), ("group", "a"), ("k", key)])
        status, h, _ = get(base + "/limited", {"X-API-Key": key})
        self.assertEqual((status, h["X-RateLimit-Remaining"]), (200, "4"))
        self.assertRegex(h["RateLimit"], '^"five";')
        self.assertEqual(c.peek({"group": "a", "k": key}).remaining, 998, "match-a counted it too")

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

    def test_headers_option(self):
        # Only the headers named are sent: with x-api-key left out, the
        # daemon derives no api_key.
        c = rld.Client(env("RLD_TEST_SOCKET"), timeout=5)
        self.addCleanup(c.close)
        base = self.serve(c, headers=["authorization"])
        status, h, _ = get(base + "/limited", {"X-API-Key": unique()})
        self.assertEqual(status, 200)
        self.assertIsNone(h["X-RateLimit-Limit"])

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


class AttributesTest(unittest.TestCase):
    """What the middleware sends, request by request (no daemon needed)."""

    def test_wsgi_attributes(self):
        m = rld.WSGIMiddleware(hello_wsgi, None, extra=lambda e: [("tenant", e.get("HTTP_X_TENANT", "none"))])
        env_ = {"REMOTE_ADDR": "10.1.2.3", "HTTP_X_FORWARDED_FOR": "198.51.100.7,10.9.9.9", "HTTP_HOST": "Api.Example:8080",
                "SCRIPT_NAME": "", "PATH_INFO": "//v1//search/", "QUERY_STRING": "q=%2F", "REQUEST_METHOD": "POST",
                "HTTP_X_API_KEY": "sk_1", "HTTP_X_TENANT": "acme", "HTTP_COOKIE": "sid=1"}
        self.assertEqual(m.attributes(env_), [
            (b":peer", b"10.1.2.3"), (b":method", b"POST"), (b":host", b"Api.Example:8080"),
            (b":target", b"//v1//search/?q=%2F"), (b":h:x-api-key", b"sk_1"),
            (b":h:x-forwarded-for", b"198.51.100.7,10.9.9.9"), (b":h:cookie", b"sid=1"), ("tenant", "acme")])
        # The server's raw target when it gives one.
        env_["RAW_URI"] = "/v1/a%2Fb?q=1"
        self.assertEqual(dict(m.attributes(env_))[b":target"], b"/v1/a%2Fb?q=1")
        del env_["RAW_URI"]
        env_["REQUEST_URI"] = "/v1/%2e%2e/x"
        self.assertEqual(dict(m.attributes(env_))[b":target"], b"/v1/%2e%2e/x")

    def test_wsgi_target_requoting(self):
        # PATH_INFO is decoded, as latin-1 characters of the raw bytes.
        for script, path, query, want in (
                ("", "/", "", b"/"), ("", "", "", b"/"), ("/app", "/a b", "x=1", b"/app/a%20b?x=1"),
                ("", "/caf\xc3\xa9", "", b"/caf%C3%A9"), ("", "/a/b", "", b"/a/b"),  # a decoded %2F is a /
                ("", "/a?b#c", "", b"/a%3Fb%23c"), ("", "/;=,~!$&'()*+:@", "", b"/;=,~!$&'()*+:@"),
                ("", "/%zz", "", b"/%25zz"), ("", "/\x00\xff", "", b"/%00%FF")):
            env_ = {"SCRIPT_NAME": script, "PATH_INFO": path, "QUERY_STRING": query}
            self.assertEqual(rld.wsgi_target(env_), want, (script, path, query))

    def test_asgi_attributes(self):
        m = rld.ASGIMiddleware(hello_asgi, None, headers=["X-API-Key", "x-forwarded-for"])
        scope = {"type": "http", "method": "GET", "client": ("::1", 5000), "path": "/a/b", "raw_path": b"/a%2Fb",
                 "query_string": b"x=%20", "headers": [(b"host", b"h"), (b"x-forwarded-for", b"1.1.1.1"),
                                                       (b"cookie", b"c=1"), (b"x-forwarded-for", b"2.2.2.2"),
                                                       (b"x-api-key", b"k")]}
        self.assertEqual(m.attributes(scope), [
            (b":peer", b"::1"), (b":method", b"GET"), (b":host", b"h"), (b":target", b"/a%2Fb?x=%20"),
            (b":h:x-api-key", b"k"), (b":h:x-forwarded-for", b"1.1.1.1, 2.2.2.2")])
        # No raw_path: the path re-quoted; no host, no client: not sent.
        del scope["raw_path"]
        scope["headers"], scope["client"], scope["query_string"] = [], None, b""
        self.assertEqual(m.attributes(scope), [(b":method", b"GET"), (b":target", b"/a/b")])

    def test_headers_option_checked(self):
        for bad in (["x"] * 0 + ["a b"], ["x-" + "a" * 62], [f"h{i}" for i in range(9)], "x-api-key", [""]):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                rld.WSGIMiddleware(hello_wsgi, None, headers=bad)
        m = rld.WSGIMiddleware(hello_wsgi, None, headers=["Content-Type", "X-A", "x-a"])
        self.assertEqual(m.attributes({"CONTENT_TYPE": "text/plain", "HTTP_X_A": "1", "PATH_INFO": "/"})[2:],
                         [(b":h:content-type", b"text/plain"), (b":h:x-a", b"1")])

    def test_long_values_are_digested(self):
        # The one rule: a value over its limit is "sha256:" + hex of the
        # whole value's SHA-256; at the limit it is sent as it is.
        def digest(v):
            return b"sha256:" + hashlib.sha256(v).hexdigest().encode()

        for name, limit in ((b":target", 16384), (b":h:x-api-key", 4096), (b":h:cookie", 4096), (b":peer", 1024),
                            (b":method", 1024), (b":host", 1024), (b"api_key", 1024), (b"tenant", 1024)):
            at, over = b"v" * limit, b"v" * (limit + 1)
            with self.subTest(name=name):
                self.assertEqual(rld.fit(name, at), at)
                self.assertEqual(rld.fit(name, over), digest(over))
                self.assertEqual(rld.fit_descriptors([(name, at), (name, over.decode())]),
                                 [(name, at), (name, digest(over))])
        # The largest request: 8 headers of the longest names, every value
        # at its limit, and 11 by-hand descriptors of 64-byte names and
        # 1024-byte values still fit in one frame; a 12th does not.
        names = [f"x-{i}-" + "h" * 57 for i in range(8)]  # 61 characters: ":h:" + 61 is 64
        extras = [((f"d{i}-" + "n" * 64)[:64], "v" * 1024) for i in range(12)]
        env_ = {"REMOTE_ADDR": "p" * 1024, "REQUEST_METHOD": "M" * 1024, "HTTP_HOST": "h" * 1024,
                "RAW_URI": "/" + "a" * 16383}
        env_.update({"HTTP_" + n.upper().replace("-", "_"): "x" * 4096 for n in names})
        for n, fits in ((11, True), (12, False)):
            m = rld.WSGIMiddleware(hello_wsgi, None, headers=names, extra=lambda e: extras[:n])
            attrs = m.attributes(env_)
            self.assertEqual(len(attrs), 12 + n)
            if fits:
                frame = rld.encode_request(rld.OP_CHECK, 1, 1, rld.fit_descriptors(attrs))
                self.assertGreater(len(frame), rld.MAX_FRAME - 1100)
                self.assertLessEqual(len(frame), rld.MAX_FRAME)
            else:
                with self.assertRaises(rld.EncodeError):
                    rld.encode_request(rld.OP_CHECK, 1, 1, rld.fit_descriptors(attrs))
        # Longer values than that are digested: the frame shrinks.
        env_["RAW_URI"] = "/" + "a" * 70000
        m = rld.WSGIMiddleware(hello_wsgi, None, headers=names, extra=lambda e: extras[:11])
        frame = rld.encode_request(rld.OP_CHECK, 1, 1, rld.fit_descriptors(m.attributes(env_)))
        self.assertIn(digest(b"/" + b"a" * 70000), frame)


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
                 "scheme": "http", "path": urllib.parse.unquote(path), "raw_path": path.encode(),
                 "query_string": query.encode(),
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


class ASGITest(unittest.TestCase):
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
