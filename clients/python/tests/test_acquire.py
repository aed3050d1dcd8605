"""Acquire, release and settle against a real rld daemon."""

import asyncio
import unittest

from rldtest import env, rld, unique


class AcquireTest(unittest.TestCase):
    def setUp(self):
        self.client = rld.Client(env("RLD_TEST_SOCKET"), timeout=10)
        self.addCleanup(self.client.close)

    def test_context_manager_releases(self):
        d = {"group": "slots", "k": unique()}
        with self.client.acquiring(d) as a, self.client.acquiring(d) as b:
            self.assertTrue(a.allowed and b.allowed)
            self.assertEqual((a.result.rule, b.result.remaining), ("slots", 0))
            self.assertTrue(a.result.lease and b.result.lease)
            with self.client.acquiring(d) as c:
                self.assertFalse(c.allowed, "the third request in flight")
                self.assertEqual(c.result.decision, "limited")
                self.assertEqual(c.result.lease, "")
                self.assertIn(("Retry-After", "60"), c.result.headers())
                # Slots in flight are no quota over a window: no policy.
                names = [n for n, _ in c.result.headers()]
                self.assertNotIn("RateLimit-Policy", names)
                self.assertIn(("X-RateLimit-Limit", "2"), c.result.headers())
            self.assertIsNone(c.done, "a refused acquire sends nothing on exit")
        self.assertEqual(a.done.decision, "allowed")
        # Both slots came back.
        with self.client.acquiring(d) as a, self.client.acquiring(d) as b:
            self.assertTrue(a.allowed and b.allowed)

    def test_released_on_exception(self):
        d = {"group": "slots", "k": unique()}
        for _ in range(3):
            with self.assertRaises(KeyError):
                with self.client.acquiring(d) as a:
                    self.assertTrue(a.allowed)
                    raise KeyError("the request failed")
        self.assertEqual(self.client.peek(d).remaining, 1, "both slots free: a peek takes one")

    def test_release_twice(self):
        r = self.client.acquire({"group": "slots", "k": unique()})
        self.assertTrue(r.allowed)
        self.assertEqual(self.client.release(r.lease).decision, "allowed")
        again = self.client.release(r.lease)
        self.assertEqual((again.decision, again.error), ("error", "not_found"))
        self.assertFalse(again.failed, "the daemon's answer, not the fail mode's")
        with self.assertRaises(rld.EncodeError):
            self.client.release("")

    def test_settle(self):
        d = {"group": "tokens", "k": unique()}
        with self.client.acquiring(d, cost=10) as a:
            self.assertEqual(a.result.remaining, 90)
            s = a.settle(25)
            self.assertEqual((s.decision, s.rule), ("allowed", "tokens"))
            self.assertIs(a.settle(3), s, "settled once")
        self.assertIs(a.done, s, "not released after its settle")
        self.assertEqual(self.client.peek(d).remaining, 100 - 25 - 1)
        r = self.client.acquire(d, cost=10)
        self.assertEqual(self.client.settle(r.lease, 4).decision, "allowed")
        self.assertEqual(self.client.peek(d).remaining, 100 - 25 - 4 - 1)
        self.assertEqual(self.client.settle(r.lease, 4).error, "not_found")

    def test_actual_on_exit(self):
        d = {"group": "tokens", "k": unique()}
        with self.client.acquiring(d, cost=10) as a:
            self.assertEqual(a.result.remaining, 90)
            a.actual = 25
            self.assertIsNone(a.done, "settled on exit, not before")
        self.assertEqual((a.done.decision, a.done.rule), ("allowed", "tokens"))
        self.assertEqual(self.client.peek(d).remaining, 100 - 25 - 1, "charged 15 more")
        # Set, then the block fails: the work was done, it is settled.
        with self.assertRaises(KeyError):
            with self.client.acquiring(d, cost=10) as a:
                a.actual = 4
                raise KeyError("the response failed")
        self.assertEqual(a.done.decision, "allowed")
        self.assertEqual(self.client.peek(d).remaining, 100 - 25 - 4 - 1, "refunded 6")
        # Not set: released at the estimate.
        with self.client.acquiring(d, cost=10) as a:
            pass
        self.assertEqual(a.done.decision, "allowed")
        self.assertEqual(self.client.peek(d).remaining, 100 - 25 - 4 - 10 - 1, "the estimate stays")

    def test_actual_frees_slot(self):
        d = {"group": "slots", "k": unique()}
        for _ in range(3):
            with self.client.acquiring(d) as a:
                self.assertTrue(a.allowed)
                a.actual = 3
            self.assertEqual(a.done.decision, "allowed")
        self.assertEqual(self.client.peek(d).remaining, 1, "both slots free: a peek takes one")

    def test_async(self):
        async def run():
            d = {"group": "slots", "k": unique()}
            async with rld.AsyncClient(env("RLD_TEST_SOCKET"), timeout=10) as c:
                a = await c.acquire(d)
                b = await c.acquire(d)
                full = await c.acquire(d)
                self.assertEqual((a.decision, b.decision, full.decision), ("allowed", "allowed", "limited"))
                self.assertEqual((await c.release(a.lease)).decision, "allowed")
                self.assertEqual((await c.settle(b.lease, 1)).decision, "allowed")
                self.assertEqual((await c.acquire(d)).remaining, 1)
        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
