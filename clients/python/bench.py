"""Measures the Python client's checks per second against a running rld.

    bin/rld serve -config clients/python/tests/rld-test.toml -socket /tmp/rld.sock -http off &
    python3 clients/python/bench.py -socket /tmp/rld.sock

Every check is {"group": "bench", "k": <one of 100 keys>}, which the test
configuration's "bench" rule allows. It prints checks/s for: one thread,
one check at a time; one thread with -inflight checks pipelined per batch
(check_many); -threads threads sharing one Client; and asyncio with
-inflight tasks sharing one AsyncClient.

    python3 clients/python/bench.py -encode

prints instead, with no daemon, what the WSGI middleware spends building a
typical request's attributes and encoding its frame (the best of 30
rounds, interleaved): with the server's RAW_URI, with PATH_INFO encoded
again, and with a 10 KB API key (digested).
"""

import argparse
import asyncio
import os
import sys
import threading
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rld  # noqa: E402

KEYS = [{"group": "bench", "k": f"bench-{i}"} for i in range(100)]


def one_at_a_time(c, seconds):
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for d in KEYS:
            assert c.check(d).rule == "bench"
        n += len(KEYS)
    return n


def pipelined(c, seconds, inflight):
    batch = (KEYS * (inflight // len(KEYS) + 1))[:inflight]
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        rs = c.check_many(batch)
        assert rs[-1].rule == "bench"
        n += len(rs)
    return n


def threads(c, seconds, count):
    counts = [0] * count
    end = time.monotonic() + seconds

    def work(i):
        while time.monotonic() < end:
            for d in KEYS[:10]:
                assert c.check(d).rule == "bench"
            counts[i] += 10

    ts = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts)


async def tasks(path, seconds, count):
    async with rld.AsyncClient(path, timeout=5) as c:
        end = time.monotonic() + seconds
        counts = [0] * count

        async def work(i):
            while time.monotonic() < end:
                assert (await c.check(KEYS[i % len(KEYS)])).rule == "bench"
                counts[i] += 1

        await asyncio.gather(*(work(i) for i in range(count)))
        return sum(counts)


def encode_cost():
    env = {"REMOTE_ADDR": "203.0.113.9", "REQUEST_METHOD": "GET", "HTTP_HOST": "api.example.com",
           "SCRIPT_NAME": "", "PATH_INFO": "/v1/search", "QUERY_STRING": "q=shoes&page=2",
           "RAW_URI": "/v1/search?q=shoes&page=2", "HTTP_X_API_KEY": "sk_live_0123456789abcdef",
           "HTTP_USER_AGENT": "curl/8", "HTTP_ACCEPT": "*/*"}
    requote = dict(env)
    del requote["RAW_URI"]
    long_key = dict(env, HTTP_X_API_KEY="k" * 10240)
    m = rld.WSGIMiddleware(None, None)
    cases = {"RAW_URI": env, "PATH_INFO encoded again": requote, "10 KB API key, digested": long_key}
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(30):
        for name, e in cases.items():
            # What WSGIMiddleware and Client.check do for one request, socket aside.
            t = timeit.timeit(lambda: rld._frame(rld.OP_CHECK, 1, rld._check_body(1, m.attributes(e), True)),
                              number=2000)
            best[name] = min(best[name], t / 2000)
    for name in cases:
        print(f"{name:45s} {best[name] * 1e6:8.2f} µs a request")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-socket", default=rld.DEFAULT_SOCKET)
    ap.add_argument("-seconds", type=float, default=3.0, help="duration of each measurement")
    ap.add_argument("-inflight", type=int, default=64, help="checks in flight when pipelining")
    ap.add_argument("-threads", type=int, default=8)
    ap.add_argument("-encode", action="store_true", help="measure the middleware's encoding only (no daemon)")
    a = ap.parse_args()
    if a.encode:
        encode_cost()
        return
    with rld.Client(a.socket, timeout=5) as c:
        if not c.ping():
            sys.exit(f"bench: no rld answers on {a.socket}")
        runs = [
            ("one thread, one at a time", lambda: one_at_a_time(c, a.seconds)),
            (f"one thread, {a.inflight} pipelined (check_many)", lambda: pipelined(c, a.seconds, a.inflight)),
            (f"{a.threads} threads, one Client", lambda: threads(c, a.seconds, a.threads)),
            (f"asyncio, {a.inflight} tasks, one AsyncClient", lambda: asyncio.run(tasks(a.socket, a.seconds, a.inflight))),
        ]
        for name, run in runs:
            start = time.monotonic()
            n = run()
            print(f"{name:45s} {n / (time.monotonic() - start):10.0f} checks/s")
        assert c.failures == 0, c.failures


if __name__ == "__main__":
    main()
