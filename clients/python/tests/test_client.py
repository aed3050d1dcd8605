"""Client and AsyncClient against a real rld daemon."""

import asyncio
import hashlib
import logging
import os
import socket
import struct
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

from rldtest import Daemon, env, poll, rld, unique

LIMITS = {"a": ("match-a", 1000), "b": ("match-b", 2000)}


def request(i, j, run):
    """The descriptors and cost of request j of worker i, and the answer's
    rule and remaining it must get: every request has its own fresh key."""
    group = "ab"[(i + j) % 2]
    cost = 1 + (i * 7 + j) % 50
    rule, limit = LIMITS[group]
    return [("group", group), ("k", f"{run}-{i}-{j}")], cost, (rule, limit - cost, limit)


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.socket = env("RLD_TEST_SOCKET")
        self.client = rld.Client(self.socket, timeout=10)
        self.addCleanup(self.client.close)

    def test_ping(self):
        self.assertTrue(self.client.ping())

    def test_check_and_peek(self):
        key = unique()
        r = self.client.peek({"group": "a", "k": key}, cost=3)
        self.assertEqual((r.decision, r.rule, r.limit, r.remaining), ("allowed", "match-a", 1000, 997))
        r = self.client.check([("group", "a"), ("k", key)], cost=3)
        self.assertEqual((r.decision, r.allowed, r.rule, r.limit, r.remaining, r.window), ("allowed", True, "match-a", 1000, 997, 3600.0))
        self.assertFalse(r.failed or r.degraded)
        r = self.client.check({b"group": b"b", "k": key})
        self.assertEqual((r.rule, r.remaining), ("match-b", 1999))

    def test_no_rule(self):
        r = self.client.check({"nothing": "matches"})
        self.assertEqual((r.decision, r.rule, r.limit), ("allowed", "", 0))
        self.assertEqual(r.headers(), [])

    def test_limit_then_limited(self):
        key = unique()
        d = {"endpoint": "/limited", "api_key": key}
        results = [self.client.check(d) for _ in range(6)]
        self.assertEqual([r.decision for r in results], ["allowed"] * 5 + ["limited"])
        self.assertEqual([r.remaining for r in results], [4, 3, 2, 1, 0, 0])
        last = results[-1]
        self.assertEqual((last.rule, last.limit, last.allowed), ("five", 5, False))
        self.assertGreater(last.retry_after_ms, 0)
        h = dict(last.headers())
        self.assertEqual(h["X-RateLimit-Limit"], "5")
        self.assertEqual(h["X-RateLimit-Remaining"], "0")
        self.assertGreaterEqual(int(h["Retry-After"]), 1)
        self.assertEqual(h["RateLimit"], f'"five";r=0;t={h["Retry-After"]}')
        self.assertEqual(h["RateLimit-Policy"], '"five";q=5;w=3600')

    def test_blocked(self):
        r = self.client.check({"api_key": "blocked-" + unique()})
        self.assertEqual((r.decision, r.allowed, r.rule), ("blocked", False, "deny"))

    def test_daemon_error_answer(self):
        # cost_too_large says the request is wrong: it is never allowed,
        # whatever the fail mode.
        r = self.client.check({"endpoint": "/limited", "api_key": unique()}, cost=6)
        self.assertEqual((r.decision, r.allowed, r.error, r.failed), ("error", False, "cost_too_large", False))

    def test_long_value_is_digested(self):
        # A value over its limit is sent as its digest, never refused: the
        # daemon answers, and the same long value is the same key.
        key = "k" * 5000 + unique()
        r = self.client.check({"group": "a", "k": key})
        self.assertEqual((r.decision, r.rule, r.remaining, r.failed), ("allowed", "match-a", 999, False))
        r = self.client.check([("group", "a"), ("k", key.encode())])
        self.assertEqual(r.remaining, 998, "the same digest")
        r = self.client.check({"group": "a", "k": "sha256:" + hashlib.sha256(key.encode()).hexdigest()})
        self.assertEqual(r.remaining, 997, "the digest the rule names")

    def test_encode_error_raises(self):
        with self.assertRaises(rld.EncodeError):
            self.client.check([("k%d" % i, "v") for i in range(33)])
        with self.assertRaises(rld.EncodeError):
            self.client.check({"": "v"})
        with self.assertRaises(rld.EncodeError):
            self.client.check({"k": 1})
        self.assertTrue(self.client.ping())  # the connection is unharmed

    def test_threads_answers_match_requests(self):
        # 50 threads share one client (one connection); every answer must
        # be its own request's: the rule and remaining identify it.
        run = unique()
        errors = []
        mismatches = []
        barrier = threading.Barrier(50)

        def worker(i):
            try:
                barrier.wait()
                for j in range(40):
                    d, cost, want = request(i, j, run)
                    r = self.client.check(d, cost)
                    if (r.rule, r.remaining, r.limit) != want or r.failed:
                        mismatches.append((i, j, r, want))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(mismatches, [])
        self.assertEqual(self.client.failures, 0)

    def test_forked_child_opens_its_own_connection(self):
        # A forking server's worker must not read its parent's answers.
        key = unique()
        self.assertEqual(self.client.check({"group": "a", "k": key}).remaining, 999)
        pid = os.fork()
        if pid == 0:
            r = self.client.check({"group": "a", "k": key}, timeout=5)
            os._exit(0 if (r.rule, r.remaining, r.failed) == ("match-a", 998, False) else 1)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertEqual(self.client.check({"group": "a", "k": key}).remaining, 997)

    def test_check_many_pipelined(self):
        run = unique()
        reqs = [request(0, j, run) for j in range(64)]
        # check_many takes one cost: group the requests by cost.
        by_cost = {}
        for d, cost, want in reqs:
            by_cost.setdefault(cost, []).append((d, want))
        for cost, items in by_cost.items():
            results = self.client.check_many([d for d, _ in items], cost)
            self.assertEqual([(r.rule, r.remaining, r.limit) for r in results], [w for _, w in items])
        key = unique()
        results = self.client.check_many([{"endpoint": "/limited", "api_key": key}] * 7)
        self.assertEqual(sorted(r.decision for r in results), ["allowed"] * 5 + ["limited"] * 2)


class AsyncClientTest(unittest.TestCase):
    def setUp(self):
        self.socket = env("RLD_TEST_SOCKET")

    def test_tasks_answers_match_requests(self):
        # 500 tasks share one AsyncClient (one connection).
        run = unique()

        async def main():
            async with rld.AsyncClient(self.socket, timeout=10) as c:
                self.assertTrue(await c.ping())

                async def task(i):
                    out = []
                    for j in range(4):
                        d, cost, want = request(i, j, run)
                        r = await c.check(d, cost)
                        out.append(((r.rule, r.remaining, r.limit), want, r.failed))
                    return out

                results = await asyncio.gather(*(task(i) for i in range(500)))
                return results, c.failures

        results, failures = asyncio.run(main())
        bad = [x for out in results for x in out if x[0] != x[1] or x[2]]
        self.assertEqual(len(results), 500)
        self.assertEqual(bad, [])
        self.assertEqual(failures, 0)

    def test_limit_blocked_and_many(self):
        key = unique()

        async def main():
            async with rld.AsyncClient(self.socket, timeout=10) as c:
                seq = [await c.check({"endpoint": "/limited", "api_key": key}) for _ in range(6)]
                peek = await c.peek({"endpoint": "/limited", "api_key": key})
                blocked = await c.check({"api_key": "blocked-x"})
                many = await c.check_many([{"group": "a", "k": unique()} for _ in range(64)], cost=2)
                return seq, peek, blocked, many

        seq, peek, blocked, many = asyncio.run(main())
        self.assertEqual([r.decision for r in seq], ["allowed"] * 5 + ["limited"])
        self.assertGreater(seq[-1].retry_after_ms, 0)
        self.assertEqual(peek.decision, "limited")
        self.assertEqual(blocked.decision, "blocked")
        self.assertEqual({(r.rule, r.remaining) for r in many}, {("match-a", 998)})
        self.assertEqual(len(many), 64)


# The rules of rld-test.toml named hdr-ALGORITHM: 3 per hour per k, the
# bucket ones with a burst of 5.
HEADER_ALGORITHMS = ("token_bucket", "gcra", "sliding_log", "sliding_counter", "fixed_window")
HEADER_FIELDS = ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit",
                 "Retry-After")


class HeadersTest(unittest.TestCase):
    def http_fields(self, url):
        try:
            resp = urllib.request.urlopen(url, timeout=10)
        except urllib.error.HTTPError as e:
            resp = e
        resp.close()
        return resp.getcode(), {k: resp.headers[k] for k in HEADER_FIELDS if resp.headers[k] is not None}

    def test_headers_as_the_http_endpoint(self):
        # For every algorithm, allowed and limited: the same answer asked
        # over the socket (peek) and over the same daemon's HTTP endpoint
        # (peek) gives the same header fields, rendered from the frame
        # alone. X-RateLimit-Reset is a point in time, and t, r and reset
        # move on while the two are asked: a pair that straddles a second
        # is asked again (a wrong rendering differs every time).
        d = Daemon(http=True)
        self.addCleanup(d.close)
        c = rld.Client(d.socket, timeout=10)
        self.addCleanup(c.close)
        for alg in HEADER_ALGORITHMS:
            key = unique()
            desc = {"group": "hdr-" + alg, "k": key}
            url = f"http://{d.http}/v1/check?group=hdr-{alg}&k={key}&peek=1"
            seen = set()
            for i in range(8):
                with self.subTest(algorithm=alg, check=i):
                    for _ in range(3):
                        r = c.peek(desc)
                        status, http = self.http_fields(url)
                        mine = dict(r.headers())
                        if mine == http:
                            break
                    self.assertEqual(status, 200 if r.allowed else 429)
                    self.assertEqual(mine, http, f"{alg}: {r!r}")
                    self.assertIn("RateLimit-Policy", mine)
                    self.assertEqual(mine["RateLimit-Policy"], f'"hdr-{alg}";q={2 if alg == "sliding_counter" else 3};w=3600')
                    if not r.allowed:
                        self.assertIn(";t=", mine["RateLimit"])
                    seen.add(r.decision)
                c.check(desc)
            self.assertEqual(seen, {"allowed", "limited"}, alg)
            # The burst is the capacity, not the quota.
            self.assertEqual(r.limit, 5 if alg in ("token_bucket", "gcra") else 3)


class FakeDaemon:
    """A Unix socket server that answers the CHECKs whose first descriptor
    value starts with "answer", in reverse order of each read, with
    remaining = the request's cost; it never answers the others."""

    def __init__(self, path):
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn):
        fb = rld.FrameBuffer()
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                out = []
                for f in fb.feed(data):
                    rid, cost, vlen = int.from_bytes(f[8:12], "big"), int.from_bytes(f[12:16], "big"), f[17]
                    value = f[18 + vlen + 2:]
                    if value.startswith(b"answer"):
                        out.append(struct.pack(">IBBHIBQQIIIQIIB4sHH", 8 + 50 + 4, 1, 0x81, 0, rid, 0, 100, cost,
                                               1000, 0, 1000, 100, 1000, 10, 4, b"fake", 0, 0))
                conn.sendall(b"".join(reversed(out)))

    def close(self):
        self.srv.close()


class MixedAnswersTest(unittest.TestCase):
    def test_answers_and_timeouts_mixed(self):
        # 20 threads share a client; half their calls are never answered.
        # Each answered call gets its own answer, each other one times out
        # (fails open) without holding up the rest.
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        path = os.path.join(d.name, "fake.sock")
        fake = FakeDaemon(path)
        self.addCleanup(fake.close)
        c = rld.Client(path, timeout=0.3, log_interval=3600)
        self.addCleanup(c.close)
        bad = []

        def worker(i):
            for j in range(10):
                cost = 1 + i * 10 + j
                answered = (i + j) % 2 == 0
                start = time.monotonic()
                r = c.check([("v", "answer" if answered else "ignore")], cost)
                took = time.monotonic() - start
                if answered and (r.failed or r.rule != "fake" or r.remaining != cost):
                    bad.append(("answered", i, j, r))
                if not answered and not (r.failed_open and "no answer" in r.message):
                    bad.append(("ignored", i, j, r))
                if took > 5:
                    bad.append(("slow", i, j, took))

        logging.getLogger("rld").disabled = True
        self.addCleanup(setattr, logging.getLogger("rld"), "disabled", False)
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(bad, [])
        rs = c.check_many([[("v", "answer")]] * 5 + [[("v", "ignore")]] * 5, cost=7)
        self.assertEqual([(r.failed, r.remaining) for r in rs], [(False, 7)] * 5 + [(True, 0)] * 5)

        async def tasks():
            ac = rld.AsyncClient(path, timeout=0.3, log_interval=3600)
            try:
                async def one(i):
                    r = await ac.check([("v", "answer" if i % 2 else "ignore")], i + 1)
                    return i, r

                return await asyncio.gather(*(one(i) for i in range(200)))
            finally:
                await ac.close()

        for i, r in asyncio.run(tasks()):
            if i % 2:
                self.assertEqual((r.failed, r.rule, r.remaining), (False, "fake", i + 1))
            else:
                self.assertEqual((r.failed_open, r.remaining), (True, 0))


class FailModeTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.nobody = os.path.join(self.dir.name, "nobody.sock")

    def test_fail_open_when_unreachable(self):
        c = rld.Client(self.nobody)
        with self.assertLogs("rld", logging.WARNING) as logs:
            results = [c.check({"k": "v"}) for _ in range(5)]
        for r in results:
            self.assertEqual((r.allowed, r.failed, r.failed_open, r.error), (True, True, True, "unavailable"))
            self.assertEqual(r.headers(), [])
        self.assertEqual(c.failures, 5)
        self.assertEqual(len(logs.records), 1, "logged once per interval")
        self.assertFalse(c.ping())

    def test_fail_closed_when_unreachable(self):
        c = rld.Client(self.nobody, fail_open=False, log_interval=3600)
        with self.assertLogs("rld", logging.WARNING):
            r = c.check({"k": "v"})
        self.assertEqual((r.allowed, r.decision, r.failed, r.failed_open, r.error), (False, "error", True, False, "unavailable"))

    def test_raise_errors(self):
        c = rld.Client(self.nobody, raise_errors=True)
        with self.assertRaises(rld.Unavailable):
            c.check({"k": "v"})

    def test_async_fail_open_and_closed(self):
        async def main():
            with self.assertLogs("rld", logging.WARNING):
                o = await rld.AsyncClient(self.nobody).check({"k": "v"})
                c = await rld.AsyncClient(self.nobody, fail_open=False).check({"k": "v"})
            return o, c

        o, c = asyncio.run(main())
        self.assertEqual((o.allowed, o.failed_open), (True, True))
        self.assertEqual((c.allowed, c.decision), (False, "error"))

    def test_slow_daemon_times_out(self):
        # A socket that accepts and never answers: the call gives up after
        # its timeout and fails open.
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(self.nobody)
        srv.listen(8)
        self.addCleanup(srv.close)
        c = rld.Client(self.nobody, timeout=0.05, log_interval=3600)
        self.addCleanup(c.close)
        with self.assertLogs("rld", logging.WARNING):
            r = c.check({"k": "v"})
        self.assertEqual((r.allowed, r.failed_open), (True, True))
        self.assertIn("no answer within 50 ms", r.message)

        async def main():
            ac = rld.AsyncClient(self.nobody, timeout=0.05, fail_open=False, log_interval=3600)
            try:
                return await ac.check_many([{"k": "v"}] * 3)
            finally:
                await ac.close()

        with self.assertLogs("rld", logging.WARNING):
            rs = asyncio.run(main())
        self.assertEqual([(r.decision, r.failed) for r in rs], [("error", True)] * 3)

    def test_daemon_killed_mid_run_and_back(self):
        # Threads and tasks check in a loop while the daemon is killed: no
        # call raises, every answer is the daemon's or fails open; once the
        # daemon is back the limits apply again on the same clients.
        d = Daemon()
        self.addCleanup(d.close)
        c = rld.Client(d.socket, timeout=0.5, retry_interval=0.01, log_interval=3600)
        ac = rld.AsyncClient(d.socket, timeout=0.5, retry_interval=0.01, log_interval=3600)
        self.addCleanup(c.close)
        stop = threading.Event()
        seen = {"daemon": 0, "failed_open": 0}
        errors = []
        lock = threading.Lock()

        def record(r):
            with lock:
                if r.failed:
                    if not (r.allowed and r.failed_open):
                        errors.append(r)
                    seen["failed_open"] += 1
                elif r.decision == "allowed" and r.rule == "match-a":
                    seen["daemon"] += 1
                else:
                    errors.append(r)

        def worker():
            try:
                while not stop.is_set():
                    record(c.check({"group": "a", "k": unique()}))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        logging.getLogger("rld").disabled = True
        self.addCleanup(setattr, logging.getLogger("rld"), "disabled", False)
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        try:
            poll(lambda: seen["daemon"] >= 100, "answers from the daemon")
            d.kill()
            poll(lambda: seen["failed_open"] >= 100, "fail-open answers after the kill")
            # While it is down, asyncio fails open too.
            r = asyncio.run(ac.check({"group": "a", "k": unique()}))
            self.assertEqual((r.allowed, r.failed_open), (True, True))
            d.start()
            before = seen["daemon"]
            poll(lambda: seen["daemon"] >= before + 100, "answers from the restarted daemon")
        finally:
            stop.set()
            for t in threads:
                t.join()
        self.assertEqual(errors, [])
        key = unique()
        seq = [c.check({"endpoint": "/limited", "api_key": key}).decision for _ in range(6)]
        self.assertEqual(seq, ["allowed"] * 5 + ["limited"])

        async def limited_again():
            try:
                return [(await ac.check({"endpoint": "/limited", "api_key": key})).decision for _ in range(2)]
            finally:
                await ac.close()

        self.assertEqual(asyncio.run(limited_again()), ["limited", "limited"])


if __name__ == "__main__":
    unittest.main()
