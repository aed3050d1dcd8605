"""Replays the golden corpus (clients/testdata/golden.tsv) through rld.py."""

import logging
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import rld  # noqa: E402

CORPUS = os.path.join(HERE, "..", "..", "testdata", "golden.tsv")


def unhex(s):
    return b"" if s == "-" else bytes.fromhex(s)


def descs(s):
    if s == "-":
        return []
    out = []
    for part in s.split(","):
        name, value = part.split(":")
        out.append((bytes.fromhex(name), bytes.fromhex(value)))
    return out


def load():
    lines = []
    with open(CORPUS, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            lines.append((no, line.split("\t")))
    return lines


def fields(r, acquire=False):
    """The decoded fields a decode (or decode_acquire) line lists, in its order."""
    f = (r.id, r.op, r.flags, r.status, r.limit, r.remaining, r.reset_ms, r.retry_ms, r.window_ms,
         r.quota, r.quota_window_ms, r.next_ms, r.rule, r.code, r.message)
    return f + (r.lease,) if acquire else f


class CorpusTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.lines = load()

    def of_kind(self, kind):
        got = [(no, f) for no, f in self.lines if f[0] == kind]
        self.assertTrue(got, f"the corpus has no {kind} line")
        return got

    def test_kinds(self):
        kinds = {f[0] for _, f in self.lines}
        self.assertEqual(kinds, {"encode", "encode_error", "encode_lease", "encode_lease_error",
                                 "decode", "decode_acquire", "decode_error"})

    def test_encode(self):
        for no, f in self.of_kind("encode"):
            with self.subTest(line=no, name=f[1]):
                self.assertEqual(len(f), 7)
                _, _, rid, op, cost, ds, want = f
                got = rld.encode_request(int(op), int(rid), int(cost), descs(ds))
                self.assertEqual(got.hex(), want)

    def test_encode_lease(self):
        for no, f in self.of_kind("encode_lease"):
            with self.subTest(line=no, name=f[1]):
                self.assertEqual(len(f), 7)
                _, _, rid, op, cost, lease, want = f
                got = rld.encode_request(int(op), int(rid), int(cost), lease=unhex(lease))
                self.assertEqual(got.hex(), want)

    def test_encode_lease_error(self):
        for no, f in self.of_kind("encode_lease_error"):
            with self.subTest(line=no, name=f[1]):
                self.assertEqual(len(f), 7)
                _, _, rid, op, cost, lease, _ = f
                with self.assertRaises(rld.EncodeError):
                    rld.encode_request(int(op), int(rid), int(cost), lease=unhex(lease))

    def test_encode_dict_and_str(self):
        # The worked example, with a dict of str as an application writes it.
        want = [f[6] for _, f in self.of_kind("encode") if f[1] == "worked-example"][0]
        got = rld.encode_request(rld.OP_CHECK, 7, 1, {"api_key": "sk_123", "endpoint": "/v1/search"})
        self.assertEqual(got.hex(), want)

    def test_encode_error(self):
        for no, f in self.of_kind("encode_error"):
            with self.subTest(line=no, name=f[1]):
                self.assertEqual(len(f), 7)
                _, _, rid, op, cost, ds, _ = f
                with self.assertRaises(rld.EncodeError):
                    rld.encode_request(int(op), int(rid), int(cost), descs(ds))

    def test_encode_error_through_the_client(self):
        # The client's calls send a value over its limit as its digest
        # (rld.fit): such a line goes out (here to a missing socket, so it
        # fails open). Every other refused request never reaches the
        # socket: the client does not even connect.
        c = rld.Client("/nonexistent/rld.sock", log_interval=3600)
        logging.getLogger("rld").disabled = True
        self.addCleanup(setattr, logging.getLogger("rld"), "disabled", False)
        sent = 0
        for no, f in self.of_kind("encode_error"):
            rid, op, cost, ds = int(f[2]), int(f[3]), int(f[4]), descs(f[5])
            call = {rld.OP_CHECK: c.check, rld.OP_PEEK: c.peek, rld.OP_ACQUIRE: c.acquire}[op]
            try:
                rld.encode_request(op, rid, cost, rld.fit_descriptors(ds))
                digested = True
            except rld.EncodeError:
                digested = False
            with self.subTest(line=no, name=f[1]):
                if digested:
                    self.assertTrue(any(len(v) > rld.value_limit(n) for n, v in ds), "only a long value is digested")
                    self.assertTrue(call(ds, cost).failed_open)
                    sent += 1
                else:
                    with self.assertRaises(rld.EncodeError):
                        call(ds, cost)
        self.assertGreaterEqual(sent, 1, "the corpus has a value over its limit")
        self.assertEqual(c.failures, sent)

    def decode_lines(self):
        for kind, n in (("decode", 18), ("decode_acquire", 19)):
            for no, f in self.of_kind(kind):
                self.assertEqual(len(f), n, f"line {no}")
                frame = bytes.fromhex(f[2])
                want = tuple(int(x) for x in f[3:15]) + (unhex(f[15]), int(f[16]), unhex(f[17]))
                if n == 19:
                    want += (unhex(f[18]),)
                yield no, f[1], frame, want

    def test_decode(self):
        for no, name, frame, want in self.decode_lines():
            with self.subTest(line=no, name=name):
                self.assertEqual(fields(rld.decode_response(frame), len(want) == 16), want)

    def test_decode_error(self):
        for no, f in self.of_kind("decode_error"):
            with self.subTest(line=no, name=f[1]):
                self.assertEqual(len(f), 4)
                with self.assertRaises(rld.DecodeError):
                    rld.decode_response(unhex(f[2]))

    def test_decode_error_through_the_stream(self):
        # A frame whose length field is out of range loses the framing:
        # the stream splitter refuses it before reading a body.
        for no, f in self.of_kind("decode_error"):
            frame = unhex(f[2])
            if len(frame) < 4:
                continue
            length = int.from_bytes(frame[:4], "big")
            if 8 <= length <= 16380:
                continue
            with self.subTest(line=no, name=f[1]), self.assertRaises(rld.DecodeError):
                rld.FrameBuffer().feed(frame)

    def test_one_byte_changed(self):
        # The corpus guards the decoder: with any one byte of a golden
        # answer changed, it refuses the frame or decodes other fields.
        for no, name, frame, want in self.decode_lines():
            with self.subTest(line=no, name=name):
                for i in range(len(frame)):
                    for x in (0x01, 0x80, 0xFF):
                        bad = bytearray(frame)
                        bad[i] ^= x
                        try:
                            got = fields(rld.decode_response(bytes(bad)), len(want) == 16)
                        except rld.DecodeError:
                            continue
                        self.assertNotEqual(got, want, f"byte {i} ^ {x:#x} decodes to the same answer")

    def test_frame_buffer_splits_the_stream(self):
        frames = [f for _, _, f, _ in self.decode_lines()]
        stream = b"".join(frames)
        fb = rld.FrameBuffer()
        got = []
        for i in range(0, len(stream), 7):  # fed in small pieces
            got.extend(fb.feed(stream[i:i + 7]))
        self.assertEqual(got, frames)

    def result(self, name):
        for _, n, frame, _ in self.decode_lines():
            if n == name:
                return rld.Result.from_response(rld.decode_response(frame))
        raise AssertionError(f"no decode line {name}")

    def test_results_and_headers(self):
        # The worked example's answer, as the daemon's HTTP endpoint renders
        # it (docs/protocol.md, "Rendering HTTP headers").
        r = self.result("worked-example")
        self.assertEqual((r.decision, r.allowed, r.rule, r.retry_after, r.window), ("limited", False, "search", 2.0, 60.0))
        self.assertEqual((r.quota, r.quota_window_ms, r.next_ms), (30, 60000, 2000))
        self.assertEqual(r.headers(now=1_700_000_000.5), [
            ("X-RateLimit-Limit", "30"),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "1700000042"),
            ("RateLimit-Policy", '"search";q=30;w=60'),
            ("RateLimit", '"search";r=0;t=2'),
            ("Retry-After", "2"),
        ])
        # Allowed, with t; no Retry-After.
        self.assertEqual(self.result("allowed").headers(now=1_700_000_000), [
            ("X-RateLimit-Limit", "10"),
            ("X-RateLimit-Remaining", "9"),
            ("X-RateLimit-Reset", "1700000006"),
            ("RateLimit-Policy", '"per-key";q=10;w=60'),
            ("RateLimit", '"per-key";r=9;t=6'),
        ])
        # A burst: the quota is not the capacity.
        h = dict(self.result("quota-below-limit-burst").headers(now=1_700_000_000))
        self.assertEqual((h["X-RateLimit-Limit"], h["RateLimit-Policy"]), ("50", '"burst";q=10;w=60'))
        # Next unknown: RateLimit without t.
        r = self.result("next-unknown")
        self.assertIsNone(r.next_ms)
        self.assertEqual(dict(r.headers(now=1_700_000_000))["RateLimit"], '"login";r=4')
        # Next 0: t=0, not left out.
        r = self.result("next-0")
        self.assertEqual(r.next_ms, 0)
        self.assertEqual(dict(r.headers(now=1_700_000_000))["RateLimit"], '"tb";r=3;t=0')
        # The quota's own window, two periods of a sliding counter of 1.
        h = dict(self.result("quota-window-above-window").headers(now=1_700_000_000))
        self.assertEqual((h["RateLimit-Policy"], h["RateLimit"], h["Retry-After"]),
                         ('"sliding-one";q=1;w=2', '"sliding-one";r=0;t=2', "2"))
        # No limit applied, a PING's answer, an error: no field.
        for name in ("allowed-no-rule", "pong", "blocked", "error-internal"):
            self.assertEqual(self.result(name).headers(), [], name)


if __name__ == "__main__":
    unittest.main()
