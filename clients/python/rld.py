"""Client of rld, the rate-limit daemon: ask it whether a request may go through.

One file, standard library only, Python 3.9+. It speaks rld's binary protocol
(docs/protocol.md) over the daemon's Unix socket:

    import rld
    client = rld.Client("/run/rld/rld.sock")
    result = client.check({"api_key": key, "endpoint": "/v1/search"})
    if not result.allowed:
        ...  # answer 429 with result.headers()

A request that should hold a slot of a concurrency limit while it runs, or
whose cost is known only once it is done, is acquired and then released or
settled; the context manager does it:

    with client.acquiring({"api_key": key, "endpoint": "/v1/export"}) as a:
        if not a.allowed:
            ...  # answer 429 with a.result.headers()
        ...      # the request; a.actual = n when its cost was an estimate: settled on exit

Client is thread-safe and pipelines the calls of many threads on one
connection; AsyncClient does the same for asyncio. When the daemon is
unreachable or slow, a call fails open by default: it answers allowed, marked
failed_open, counts the failure and logs it at most once per interval; with
fail_open=False it answers an error, which is not allowed. A daemon outage
never raises unless raise_errors=True. WSGIMiddleware and ASGIMiddleware put
a check in front of a web application: they send the request's attributes as
the server saw them (peer address, method, Host, raw target, chosen headers)
and rld derives the descriptors (docs/clients.md).

A value longer than its limit is never refused and never fails open: it is
sent as "sha256:" and the 64 hex digits of its SHA-256 (see fit).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import socket
import struct
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

__all__ = [
    "ASGIMiddleware", "Acquisition", "AsyncClient", "Client", "DecodeError", "EncodeError", "FrameBuffer", "Response",
    "Result", "RldError", "Unavailable", "WSGIMiddleware", "decode_response", "encode_request", "fit",
    "fit_descriptors", "value_limit", "wsgi_target", "asgi_target", "DEFAULT_HEADERS",
]
__version__ = "2.0.0"

#: The daemon's default socket path.
DEFAULT_SOCKET = "/run/rld/rld.sock"

# Protocol constants (docs/protocol.md).
VERSION = 1
HEADER_SIZE = 12
MAX_FRAME = 65536
MAX_DESCRIPTORS = 32
MAX_NAME = 64
MAX_VALUE = 1024
#: The longest value of an attribute (a descriptor whose name starts with ":") on the wire.
MAX_ATTR_VALUE = 16384
ATTR_PREFIX = b":"
#: What a value longer than its limit is sent as: this, then 64 hex digits.
DIGEST_PREFIX = b"sha256:"
#: The limits of the long-value rule (value_limit): longer values are digested.
TARGET_LIMIT, HEADER_LIMIT = 16384, 4096
_ATTR_LIMITS = {b":target": TARGET_LIMIT, b":peer": MAX_VALUE, b":method": MAX_VALUE, b":host": MAX_VALUE}
#: The headers the middleware sends by default (as ":h:NAME" attributes).
DEFAULT_HEADERS = ("x-api-key", "authorization", "x-forwarded-for", "x-real-ip", "forwarded", "cookie")
#: The most headers the middleware sends.
MAX_HEADERS = 8
MAX_COST = 0xFFFFFFFF
MAX_ID = 0xFFFFFFFF
MAX_RULE = 255
MAX_MESSAGE = 1024
MAX_LEASE = 1024

OP_CHECK, OP_PEEK, OP_PING = 1, 2, 3
OP_ACQUIRE, OP_RELEASE, OP_SETTLE = 5, 6, 7
OP_RESPONSE = 0x80
FLAG_DEGRADED = 0x0001
#: A response's next_ms when the time until quota comes back is not known.
NEXT_UNKNOWN = 0xFFFFFFFF

ALLOWED, LIMITED, BLOCKED, ALLOWED_DEGRADED, ERROR = range(5)
STATUS_NAMES = ("allowed", "limited", "blocked", "allowed-degraded", "error")
CODE_NAMES = ("none", "malformed", "frame_too_large", "unknown_op", "bad_version", "too_large",
              "cost_too_large", "internal", "overloaded", "not_supported", "bad_flags", "unavailable",
              "bad_cost", "forbidden", "not_found")
CODE_INTERNAL, CODE_OVERLOADED, CODE_UNAVAILABLE = 7, 8, 11
# Error answers that mean the daemon could not decide right now: they follow
# the fail mode, like an unreachable daemon. Other error codes say that the
# request was wrong, and are never allowed.
_OUTAGE_CODES = frozenset((CODE_INTERNAL, CODE_OVERLOADED, CODE_UNAVAILABLE))

_HEADER = struct.Struct(">IBBHI")
_CHECK_BODY = struct.Struct(">IB")
_RESPONSE_FIXED = struct.Struct(">BQQIIIQIIB")  # status .. rule length: 46 bytes
_U16 = struct.Struct(">H")
_U16_U16 = struct.Struct(">HH")
_RESPONSE_MIN = HEADER_SIZE + _RESPONSE_FIXED.size + 4

Descriptors = Union[Mapping[Any, Any], Iterable[Tuple[Any, Any]], None]

log = logging.getLogger("rld")


class RldError(Exception):
    """Base class of the errors this module raises."""


class EncodeError(RldError, ValueError):
    """A request breaks the protocol's limits; nothing was sent."""


class DecodeError(RldError, ValueError):
    """A response frame does not parse."""


class Unavailable(RldError, ConnectionError):
    """The daemon could not answer (raised only with raise_errors=True)."""


# ---------------------------------------------------------------- encoding


def _raw(v: Any, what: str) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise EncodeError(f"{what} must be str or bytes, not {type(v).__name__}")


def value_limit(name: bytes) -> int:
    """Returns the length above which the value of descriptor name is sent
    as its digest: 16384 bytes for ":target", 4096 for a header (":h:NAME"),
    1024 for ":peer", ":method", ":host" and every descriptor given by hand."""
    if name.startswith(b":h:"):
        return HEADER_LIMIT
    return _ATTR_LIMITS.get(name, MAX_VALUE)


def fit(name: Any, value: Any) -> bytes:
    """Returns value as sent for descriptor name: itself (as bytes) when it
    is within value_limit(name), else b"sha256:" and the 64 lowercase hex
    digits of the SHA-256 of the whole value. Raises EncodeError when name
    or value is not str or bytes."""
    v = _raw(value, "descriptor value")
    if len(v) <= value_limit(_raw(name, "descriptor name")):
        return v
    return _digest(v)


def _digest(v: bytes) -> bytes:
    return DIGEST_PREFIX + hashlib.sha256(v).hexdigest().encode("ascii")


def _pairs(descriptors: Descriptors) -> Iterable[Tuple[bytes, bytes]]:
    pairs = () if descriptors is None else descriptors.items() if isinstance(descriptors, Mapping) else descriptors
    for pair in pairs:
        try:
            name, value = pair
        except (TypeError, ValueError):
            raise EncodeError(f"descriptor {pair!r} is not a (name, value) pair") from None
        yield _raw(name, "descriptor name"), _raw(value, "descriptor value")


def fit_descriptors(descriptors: Descriptors) -> List[Tuple[bytes, bytes]]:
    """Returns descriptors (a dict or (name, value) pairs) as the client
    sends them: (name, value) bytes pairs with every value passed through
    fit, so that no value is too long for the protocol."""
    out = []
    for n, v in _pairs(descriptors):
        if len(v) > MAX_VALUE and len(v) > value_limit(n):  # every limit is at least MAX_VALUE
            v = _digest(v)
        out.append((n, v))
    return out


def _check_body(cost: int, descriptors: Descriptors, digest: bool = False) -> bytes:
    """Returns the body of a CHECK or PEEK, or raises EncodeError. With
    digest, a value over its limit is sent as its digest (as
    fit_descriptors does: the Client's calls); without, it raises."""
    if isinstance(cost, bool) or not isinstance(cost, int) or not 0 <= cost <= MAX_COST:
        raise EncodeError(f"cost {cost!r} is not a whole number from 0 to {MAX_COST}")
    parts = []
    size = HEADER_SIZE + _CHECK_BODY.size
    for n, v in _pairs(descriptors):
        if len(parts) == MAX_DESCRIPTORS:
            raise EncodeError(f"more than {MAX_DESCRIPTORS} descriptors")
        if not 1 <= len(n) <= MAX_NAME:
            raise EncodeError(f"descriptor name {n[:20]!r} is empty or longer than {MAX_NAME} bytes")
        if len(v) > MAX_VALUE:  # every limit is at least MAX_VALUE
            if digest and len(v) > value_limit(n):
                v = _digest(v)
            limit = MAX_ATTR_VALUE if n[:1] == ATTR_PREFIX else MAX_VALUE
            if len(v) > limit:
                raise EncodeError(f"descriptor {n!r}: value of {len(v)} bytes, longer than {limit}")
        parts.append(b"%c%b%b%b" % (len(n), n, _U16.pack(len(v)), v))
        size += 3 + len(n) + len(v)
    if size > MAX_FRAME:
        raise EncodeError(f"request frame of {size} bytes, larger than {MAX_FRAME}")
    return _CHECK_BODY.pack(cost, len(parts)) + b"".join(parts)


def _lease_body(op: int, cost: int, lease: Any) -> bytes:
    """Returns the body of a RELEASE or SETTLE, or raises EncodeError."""
    raw = _raw(lease, "lease")
    if not 1 <= len(raw) <= MAX_LEASE:
        raise EncodeError(f"lease of {len(raw)} bytes, want 1 to {MAX_LEASE}")
    head = b""
    if op == OP_SETTLE:
        if isinstance(cost, bool) or not isinstance(cost, int) or not 0 <= cost <= MAX_COST:
            raise EncodeError(f"cost {cost!r} is not a whole number from 0 to {MAX_COST}")
        head = struct.pack(">I", cost)
    return head + _U16.pack(len(raw)) + raw


def _frame(op: int, req_id: int, body: bytes) -> bytes:
    return _HEADER.pack(8 + len(body), VERSION, op, 0, req_id) + body


def encode_request(op: int, req_id: int, cost: int = 1, descriptors: Descriptors = None,
                   lease: Any = None) -> bytes:
    """Returns the frame of a request, or raises EncodeError when it breaks
    the protocol's limits. op is OP_CHECK, OP_PEEK, OP_ACQUIRE, OP_PING (a
    PING has no body: cost and descriptors are ignored), OP_RELEASE or
    OP_SETTLE (which send lease, and a SETTLE its cost). Names and values
    are str (sent as UTF-8) or bytes. This is the protocol's encoder: a
    value over its limit raises (1024 bytes; 16384 for an attribute, whose
    name starts with ":"); the Client's calls digest long values first."""
    if isinstance(req_id, bool) or not isinstance(req_id, int) or not 0 <= req_id <= MAX_ID:
        raise EncodeError(f"id {req_id!r} is not a whole number from 0 to {MAX_ID}")
    if op == OP_PING:
        return _frame(op, req_id, b"")
    if op in (OP_RELEASE, OP_SETTLE):
        return _frame(op, req_id, _lease_body(op, cost, b"" if lease is None else lease))
    if op not in (OP_CHECK, OP_PEEK, OP_ACQUIRE):
        raise EncodeError(f"op {op!r} is not CHECK, PEEK, ACQUIRE, RELEASE, SETTLE or PING")
    return _frame(op, req_id, _check_body(cost, descriptors))


# ---------------------------------------------------------------- decoding


class Response(NamedTuple):
    """A decoded response frame, field for field (rule and message as raw bytes)."""

    id: int
    op: int  # as sent, with OP_RESPONSE set
    flags: int
    status: int
    limit: int
    remaining: int
    reset_ms: int
    retry_ms: int
    window_ms: int
    quota: int
    quota_window_ms: int
    next_ms: int  # NEXT_UNKNOWN when not known
    rule: bytes
    code: int
    message: bytes
    lease: bytes = b""  # an ACQUIRE answer's lease; no other answer carries one


def decode_response(frame: Union[bytes, bytearray, memoryview]) -> Response:
    """Decodes one complete response frame, or raises DecodeError. Unknown
    flag bits and error codes are passed through."""
    n = len(frame)
    if n < HEADER_SIZE:
        raise DecodeError(f"frame of {n} bytes is shorter than the {HEADER_SIZE}-byte header")
    length, version, op, flags, rid = _HEADER.unpack_from(frame)
    if length < HEADER_SIZE - 4 or length > MAX_FRAME - 4:
        raise DecodeError(f"length field {length} is outside 8..{MAX_FRAME - 4}")
    if n != length + 4:
        raise DecodeError(f"frame of {n} bytes, its length field says {length + 4}")
    if version != VERSION:
        raise DecodeError(f"protocol version {version}, want {VERSION}")
    if not op & OP_RESPONSE:
        raise DecodeError(f"op {op:#x} is not a response")
    if n < _RESPONSE_MIN:
        raise DecodeError(f"response body of {n - HEADER_SIZE} bytes, shorter than {_RESPONSE_MIN - HEADER_SIZE}")
    status, limit, remaining, reset, retry, window, quota, quota_window, next_ms, rule_len = \
        _RESPONSE_FIXED.unpack_from(frame, HEADER_SIZE)
    if status > ERROR:
        raise DecodeError(f"unknown status {status}")
    p = HEADER_SIZE + _RESPONSE_FIXED.size
    if n < p + rule_len + 4:
        raise DecodeError(f"rule of {rule_len} bytes runs past the end of the frame")
    rule = bytes(frame[p:p + rule_len])
    p += rule_len
    code, msg_len = _U16_U16.unpack_from(frame, p)
    p += 4
    if msg_len > MAX_MESSAGE:
        raise DecodeError(f"message of {msg_len} bytes, longer than {MAX_MESSAGE}")
    lease = b""
    if op == OP_ACQUIRE | OP_RESPONSE:
        # An ACQUIRE answer ends with its lease: u16 length, bytes.
        q = p + msg_len
        if n < q + 2:
            raise DecodeError("ACQUIRE answer without its lease length")
        (lease_len,) = _U16.unpack_from(frame, q)
        if lease_len > MAX_LEASE:
            raise DecodeError(f"lease of {lease_len} bytes, longer than {MAX_LEASE}")
        if n != q + 2 + lease_len:
            raise DecodeError(f"lease of {lease_len} bytes with {n - q - 2} bytes left in the frame")
        lease = bytes(frame[q + 2:])
        n = q
    if n != p + msg_len:
        raise DecodeError(f"message of {msg_len} bytes with {n - p} bytes left in the frame")
    return Response(rid, op, flags, status, limit, remaining, reset, retry, window, quota, quota_window, next_ms,
                    rule, code, bytes(frame[p:p + msg_len]), lease)


class FrameBuffer:
    """Splits a byte stream into frames. feed() returns the complete frames
    received so far and raises DecodeError when framing is lost (a length
    field outside 8..65532). Not safe for concurrent use."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> List[bytes]:
        buf = self._buf
        buf += data
        frames = []
        start = 0
        while len(buf) - start >= 4:
            length = int.from_bytes(buf[start:start + 4], "big")
            if length < HEADER_SIZE - 4 or length > MAX_FRAME - 4:
                raise DecodeError(f"length field {length} is outside 8..{MAX_FRAME - 4}: framing lost")
            end = start + 4 + length
            if len(buf) < end:
                break
            frames.append(bytes(buf[start:end]))
            start = end
        del buf[:start]
        return frames


# ---------------------------------------------------------------- results


def _seconds(ms: int) -> int:
    """Rounds milliseconds up to whole seconds, as the daemon's headers do."""
    return -(-ms // 1000) if ms > 0 else 0


def _sf_string(raw: bytes) -> str:
    """Renders raw as a structured-field string (RFC 8941), as the daemon does."""
    out = []
    for c in raw:
        if c in (0x22, 0x5C):
            out.append("\\")
        out.append(chr(c) if 0x20 <= c <= 0x7E else "?")
    return '"' + "".join(out) + '"'


class Result:
    """The answer to a check: the daemon's, or the fail mode's when the
    daemon could not answer (then failed is True, error names why).

    status is one of ALLOWED, LIMITED, BLOCKED, ALLOWED_DEGRADED, ERROR and
    decision its name; reset, retry_after and window are in seconds (float),
    with the daemon's milliseconds in reset_ms, retry_after_ms, window_ms.
    limit is the deciding limit's capacity (its burst, when it has one);
    quota per quota_window_ms is the rate a client pacing itself evenly is
    never refused at; next_ms is the time until quota comes back
    (RateLimit's t), None when not known. lease is, for an acquire, what
    release and settle take ("" when it took nothing).
    """

    __slots__ = ("status", "limit", "remaining", "reset_ms", "retry_after_ms", "window_ms", "_rule",
                 "flags", "code", "message", "failed", "failed_open", "quota", "quota_window_ms", "next_ms",
                 "lease")

    def __init__(self, status: int, limit: int = 0, remaining: int = 0, reset_ms: int = 0,
                 retry_after_ms: int = 0, window_ms: int = 0, rule: bytes = b"", flags: int = 0,
                 code: int = 0, message: str = "", failed: bool = False, failed_open: bool = False,
                 quota: int = 0, quota_window_ms: int = 0, next_ms: Optional[int] = None, lease: str = ""):
        self.status = status
        self.lease = lease
        self.limit = limit
        self.remaining = remaining
        self.reset_ms = reset_ms
        self.retry_after_ms = retry_after_ms
        self.window_ms = window_ms
        self.quota = quota
        self.quota_window_ms = quota_window_ms
        self.next_ms = next_ms
        self._rule = rule
        self.flags = flags
        self.code = code
        self.message = message
        self.failed = failed
        self.failed_open = failed_open

    @classmethod
    def from_response(cls, r: Response) -> "Result":
        """Returns the result a decoded response carries."""
        return cls(r.status, r.limit, r.remaining, r.reset_ms, r.retry_ms, r.window_ms, r.rule, r.flags,
                   r.code, r.message.decode("utf-8", "replace"), quota=r.quota, quota_window_ms=r.quota_window_ms,
                   next_ms=None if r.next_ms == NEXT_UNKNOWN else r.next_ms, lease=r.lease.decode("ascii", "replace"))

    @property
    def allowed(self) -> bool:
        """Whether the request may go through (allowed, allowed-degraded, or failed open)."""
        return self.status in (ALLOWED, ALLOWED_DEGRADED)

    @property
    def decision(self) -> str:
        """The status's name: allowed, limited, blocked, allowed-degraded or error."""
        return STATUS_NAMES[self.status]

    @property
    def degraded(self) -> bool:
        """Whether the daemon decided on local state alone (its shared store was unreachable)."""
        return self.status == ALLOWED_DEGRADED or bool(self.flags & FLAG_DEGRADED)

    @property
    def rule(self) -> str:
        """The rule that decided ("" when none did)."""
        return self._rule.decode("utf-8", "replace")

    @property
    def error(self) -> Optional[str]:
        """The error code's name (e.g. "unavailable"), or None."""
        if not self.code:
            return None
        return CODE_NAMES[self.code] if self.code < len(CODE_NAMES) else f"code({self.code})"

    @property
    def reset(self) -> float:
        return self.reset_ms / 1000

    @property
    def retry_after(self) -> float:
        return self.retry_after_ms / 1000

    @property
    def window(self) -> float:
        return self.window_ms / 1000

    def headers(self, now: Optional[float] = None) -> List[Tuple[str, str]]:
        """Returns the HTTP header fields of this answer, exactly as the
        daemon's HTTP endpoint renders them (docs/protocol.md, "Rendering
        HTTP headers"): X-RateLimit-Limit, -Remaining, -Reset (a Unix time),
        RateLimit-Policy (the sustained quota, when known), RateLimit (with
        t when the daemon knows when quota comes back), and Retry-After when
        limited. None when no limit applied (no rule, the allow or deny
        list, or a failed call). now is a Unix time, default time.time()."""
        if not self._rule or not self.limit:
            return []
        now_ns = time.time_ns() if now is None else int(now * 1e9)
        rule = _sf_string(self._rule)
        h = [
            ("X-RateLimit-Limit", str(self.limit)),
            ("X-RateLimit-Remaining", str(self.remaining)),
            ("X-RateLimit-Reset", str((now_ns + self.reset_ms * 1_000_000 + 999_999_999) // 1_000_000_000)),
        ]
        if self.quota:
            policy = f"{rule};q={self.quota}"
            w = self.quota_window_ms or self.window_ms
            if w:
                policy += f";w={_seconds(w)}"
            h.append(("RateLimit-Policy", policy))
        ratelimit = f"{rule};r={self.remaining}"
        if self.next_ms is not None:
            ratelimit += f";t={_seconds(self.next_ms)}"
        h.append(("RateLimit", ratelimit))
        if self.retry_after_ms > 0:
            h.append(("Retry-After", str(max(1, _seconds(self.retry_after_ms)))))
        return h

    def __repr__(self) -> str:
        s = (f"Result({self.decision} rule={self.rule!r} limit={self.limit} remaining={self.remaining} "
             f"reset_ms={self.reset_ms} retry_after_ms={self.retry_after_ms} window_ms={self.window_ms} "
             f"quota={self.quota} quota_window_ms={self.quota_window_ms} next_ms={self.next_ms}")
        if self.degraded:
            s += " degraded"
        if self.code:
            s += f" error={self.error} message={self.message!r}"
        if self.failed:
            s += " failed_open" if self.failed_open else " failed"
        return s + ")"


# ---------------------------------------------------------------- fail mode


class _FailMode:
    """Decides what a call answers when the daemon could not: counts the
    failures and logs them at most once per interval. Thread-safe."""

    def __init__(self, fail_open: bool, raise_errors: bool, log_interval: float):
        self.fail_open = fail_open
        self.raise_errors = raise_errors
        self.log_interval = log_interval
        self._lock = threading.Lock()  # guards count, _logged_at, _unlogged
        self.count = 0
        self._logged_at = -1e18
        self._unlogged = 0

    def result(self, why: str, code: int = CODE_UNAVAILABLE) -> Result:
        if self.raise_errors:
            raise Unavailable(why)
        now = time.monotonic()
        with self._lock:
            self.count += 1
            self._unlogged += 1
            emit = now - self._logged_at >= self.log_interval
            if emit:
                n, self._unlogged, self._logged_at = self._unlogged, 0, now
        if emit:
            log.warning("rld: %d call(s) %s since the last report: %s", n,
                        "failed open" if self.fail_open else "failed closed", why)
        if self.fail_open:
            return Result(ALLOWED, code=code, message=why, failed=True, failed_open=True)
        return Result(ERROR, code=code, message=why, failed=True)

    def answer(self, r: Response) -> Result:
        if r.status == ERROR and r.code in _OUTAGE_CODES:
            return self.result(f"daemon answered {CODE_NAMES[r.code]}: {r.message.decode('utf-8', 'replace')}", r.code)
        return Result.from_response(r)


class _Probe(_FailMode):
    """The fail mode of a PING: a failed result, nothing counted or logged."""

    def __init__(self) -> None:
        super().__init__(False, False, 0)

    def result(self, why: str, code: int = CODE_UNAVAILABLE) -> Result:
        return Result(ERROR, code=code, message=why, failed=True)


_probe = _Probe()

Batch = Sequence[Descriptors]


class _Base:
    def __init__(self, socket_path: str, timeout: float, fail_open: bool, raise_errors: bool,
                 retry_interval: float, log_interval: float):
        if timeout <= 0:
            raise ValueError(f"timeout {timeout!r} must be above 0")
        self.socket_path = socket_path
        self.timeout = timeout
        self.retry_interval = retry_interval
        self._fail = _FailMode(fail_open, raise_errors, log_interval)
        self._retry_at = 0.0  # monotonic time before which no connect is tried

    @property
    def failures(self) -> int:
        """How many calls the fail mode answered (daemon unreachable, slow, or failing)."""
        return self._fail.count

    def _bodies(self, op: int, batch: Batch, cost: int) -> List[bytes]:
        if op in (OP_RELEASE, OP_SETTLE):
            return [_lease_body(op, cost, lease) for lease in batch]  # the batch holds leases
        if op == OP_PING:
            return [b"" for _ in batch]
        return [_check_body(cost, d, True) for d in batch]

    def _connect_allowed(self) -> None:
        if time.monotonic() < self._retry_at:
            raise ConnectionError(f"cannot connect to {self.socket_path}; retrying soon")

    def _connect_failed(self, err: BaseException) -> ConnectionError:
        self._retry_at = time.monotonic() + self.retry_interval
        return ConnectionError(f"cannot connect to {self.socket_path}: {err}")


# ---------------------------------------------------------------- threads


class _Waiter:
    """One call's answer slot: the caller blocks on a held lock that the
    reader releases."""

    __slots__ = ("_lock", "id", "response", "error")

    def __init__(self) -> None:
        self.id = 0
        self._lock = threading.Lock()
        self._lock.acquire()
        self.response: Optional[Response] = None
        self.error: Optional[BaseException] = None

    def set(self, response: Optional[Response], error: Optional[BaseException] = None) -> None:
        self.response, self.error = response, error
        self._lock.release()

    def wait(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=max(timeout, 0))


class _Conn:
    """One connection: a reader thread matches answers to waiters by id."""

    def __init__(self, path: str, timeout: float):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(path)
            # Bounds sendall; the reader treats a timeout as a wake-up.
            self.sock.settimeout(max(timeout, 0.05))
        except BaseException:
            self.sock.close()
            raise
        self.pid = os.getpid()
        self.lock = threading.Lock()  # guards pending, error, next_id
        self.pending: dict = {}
        self.error: Optional[BaseException] = None
        self.next_id = 1
        self.wlock = threading.Lock()  # serialises writes
        threading.Thread(target=self._read_loop, name="rld-reader", daemon=True).start()

    def send(self, op: int, bodies: List[bytes]) -> List[_Waiter]:
        waiters = [_Waiter() for _ in bodies]
        frames = []
        with self.lock:
            if self.error is not None:
                raise ConnectionError(f"connection lost: {self.error}")
            for w, body in zip(waiters, bodies):
                i = self.next_id
                while i in self.pending:
                    i = (i + 1) & MAX_ID
                self.next_id = (i + 1) & MAX_ID
                self.pending[i], w.id = w, i
                frames.append(_frame(op, i, body))
        try:
            with self.wlock:
                self.sock.sendall(b"".join(frames))
        except OSError as e:  # the framing may be lost: the connection breaks
            self.fail(e)
        return waiters

    def forget(self, w: _Waiter) -> bool:
        """Removes w after a timeout; False when the reader already took it."""
        with self.lock:
            return self.pending.pop(w.id, None) is not None

    def fail(self, err: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = err
            waiters, self.pending = list(self.pending.values()), {}
        for w in waiters:
            w.set(None, err)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _read_loop(self) -> None:
        fb = FrameBuffer()
        try:
            while True:
                try:
                    data = self.sock.recv(65536)
                except socket.timeout:
                    if self.error is not None:
                        return
                    continue
                if not data:
                    raise ConnectionError("the daemon closed the connection")
                for f in fb.feed(data):
                    r = decode_response(f)
                    with self.lock:
                        w = self.pending.pop(r.id, None)
                    if w is not None:
                        w.set(r)
        except (OSError, RldError) as e:
            self.fail(e)


class Client(_Base):
    """A thread-safe client of one rld daemon.

    Calls from many threads share one connection and are pipelined: each
    request carries an id, and a reader thread hands every answer to the
    call that waits for it. The client connects on the first call, and
    reconnects on the next call after the connection broke (at most once
    per retry_interval seconds while the daemon is unreachable).

    timeout (seconds) bounds every call, connect included. When the daemon
    is unreachable, too slow, or answers internal/overloaded/unavailable, a
    call answers by the fail mode: allowed and marked failed_open
    (fail_open=True, the default), or status ERROR (fail_open=False); it
    raises Unavailable instead with raise_errors=True. A long value is sent
    as its digest (fit), never refused; requests that break the protocol's
    other limits (more than 32 descriptors, a name empty or over 64 bytes, a
    value not str or bytes, a frame over 65536 bytes) raise EncodeError and
    send nothing.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 0.1, fail_open: bool = True, *,
                 raise_errors: bool = False, retry_interval: float = 0.1, log_interval: float = 10.0):
        super().__init__(socket_path, timeout, fail_open, raise_errors, retry_interval, log_interval)
        self._lock = threading.Lock()  # guards _conn, _closed
        self._conn: Optional[_Conn] = None
        self._closed = False

    def check(self, descriptors: Descriptors = None, cost: int = 1, timeout: Optional[float] = None) -> Result:
        """Asks whether a request with these descriptors (a dict, or a list
        of (name, value) pairs) may go through, taking cost units when it
        may. Cost 0 is read as 1. A value longer than its limit is sent as
        its digest (fit); names starting with ":" are request attributes
        (docs/clients.md)."""
        return self._call(OP_CHECK, [descriptors], cost, timeout)[0]

    def peek(self, descriptors: Descriptors = None, cost: int = 1, timeout: Optional[float] = None) -> Result:
        """Answers as check would, taking nothing."""
        return self._call(OP_PEEK, [descriptors], cost, timeout)[0]

    def ping(self, timeout: Optional[float] = None) -> bool:
        """Reports whether the daemon answers. A probe: it never fails open,
        raises, counts or logs."""
        return not self._call(OP_PING, [None], 0, timeout, _probe)[0].failed

    def acquire(self, descriptors: Descriptors = None, cost: int = 1, timeout: Optional[float] = None) -> Result:
        """Answers as check does, and the concurrency rules that apply hold
        a slot until release or settle of the result's lease (or their
        timeout). cost may be an estimate, corrected by settle. Prefer
        acquiring(), which releases."""
        return self._call(OP_ACQUIRE, [descriptors], cost, timeout)[0]

    def release(self, lease: str, timeout: Optional[float] = None) -> Result:
        """Gives back the slots of an acquire's lease. An unknown lease
        (released or settled already, expired) answers error not_found."""
        return self._call(OP_RELEASE, [lease], 0, timeout)[0]

    def settle(self, lease: str, cost: int, timeout: Optional[float] = None) -> Result:
        """Ends an acquire at its actual cost: the difference from its
        estimate is charged or refunded, and its slots go back."""
        return self._call(OP_SETTLE, [lease], cost, timeout)[0]

    def acquiring(self, descriptors: Descriptors = None, cost: int = 1,
                  timeout: Optional[float] = None) -> "Acquisition":
        """A context manager that acquires on entry and releases on exit
        (unless settled meanwhile), whatever happens in between; with
        cost an estimate, set its actual in the block to settle on exit
        at the actual cost instead."""
        return Acquisition(self, descriptors, cost, timeout)

    def check_many(self, batch: Batch, cost: int = 1, timeout: Optional[float] = None) -> List[Result]:
        """Checks several requests at once, pipelined in one write; returns
        their results in order. timeout bounds the whole batch."""
        return self._call(OP_CHECK, batch, cost, timeout)

    def peek_many(self, batch: Batch, cost: int = 1, timeout: Optional[float] = None) -> List[Result]:
        """Peeks several requests at once, like check_many."""
        return self._call(OP_PEEK, batch, cost, timeout)

    def close(self) -> None:
        """Closes the connection; later calls raise RldError."""
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.fail(ConnectionError("client closed"))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _connection(self, timeout: float) -> _Conn:
        with self._lock:
            if self._closed:
                raise RldError("client closed")
            c = self._conn
            if c is not None and c.pid != os.getpid():
                # A child process (a forking server's worker) must not share
                # its parent's connection: it closes its copy (the parent's
                # stays open) and opens its own.
                c.sock.close()
                c = self._conn = None
            if c is not None and c.error is None:
                return c
            self._connect_allowed()
            try:
                self._conn = _Conn(self.socket_path, timeout)
            except OSError as e:
                raise self._connect_failed(e) from e
            return self._conn

    def _call(self, op: int, batch: Batch, cost: int, timeout: Optional[float],
              probe: Optional[_FailMode] = None) -> List[Result]:
        fail = probe or self._fail
        bodies = self._bodies(op, batch, cost)
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            conn = self._connection(timeout)
            waiters = conn.send(op, bodies)
        except ConnectionError as e:
            return [fail.result(str(e)) for _ in bodies]
        out = []
        for w in waiters:
            if not w.wait(deadline - time.monotonic()):
                if conn.forget(w):
                    out.append(fail.result(f"no answer within {timeout * 1000:g} ms"))
                    continue
                w.wait(1.0)  # the reader took it and is about to set it
            if w.response is None:
                out.append(fail.result(f"connection lost: {w.error}"))
            else:
                out.append(fail.answer(w.response))
        return out


class Acquisition:
    """An acquire, released on exit: see Client.acquiring.

    result is the acquire's Result and allowed whether the request may go
    through. When the acquire's cost was an estimate, set actual to the
    request's actual cost in the block: the exit settles at it instead of
    releasing (also when the block raised after setting it: the work it
    counts was done). settle(cost) settles at once. A refused (or
    failed-open) acquire holds nothing, and nothing is sent on exit.
    """

    def __init__(self, client: "Client", descriptors: Descriptors, cost: int, timeout: Optional[float]):
        self._client, self._args = client, (descriptors, cost, timeout)
        self.result: Optional[Result] = None
        self.done: Optional[Result] = None  # the release's or settle's result
        self.actual: Optional[int] = None  # the actual cost, settled on exit

    @property
    def allowed(self) -> bool:
        return self.result is not None and self.result.allowed

    def __enter__(self) -> "Acquisition":
        self.result = self._client.acquire(*self._args)
        return self

    def settle(self, cost: int) -> Result:
        """Settles the acquire at its actual cost (once)."""
        if self.done is None and self.result is not None and self.result.lease:
            self.done = self._client.settle(self.result.lease, cost, self._args[2])
        return self.done if self.done is not None else Result(ALLOWED)

    def __exit__(self, *exc: Any) -> None:
        if self.done is None and self.result is not None and self.result.lease:
            if self.actual is not None:
                self.done = self._client.settle(self.result.lease, self.actual, self._args[2])
            else:
                self.done = self._client.release(self.result.lease, self._args[2])


# ---------------------------------------------------------------- asyncio


class _AsyncConn:
    """One asyncio connection: a reader task resolves futures by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.loop = asyncio.get_running_loop()
        self.reader, self.writer = reader, writer
        self.pending: dict = {}
        self.error: Optional[BaseException] = None
        self.next_id = 1
        self.drain_lock = asyncio.Lock()
        self.task = self.loop.create_task(self._read_loop())

    def send(self, op: int, bodies: List[bytes]) -> List["asyncio.Future[Response]"]:
        if self.error is not None:
            raise ConnectionError(f"connection lost: {self.error}")
        futs, frames = [], []
        for body in bodies:
            i = self.next_id
            while i in self.pending:
                i = (i + 1) & MAX_ID
            self.next_id = (i + 1) & MAX_ID
            f = self.loop.create_future()
            self.pending[i] = f
            futs.append((i, f))
            frames.append(_frame(op, i, body))
        self.writer.write(b"".join(frames))
        return futs

    async def drain(self, timeout: float) -> None:
        """Waits, up to timeout, while the daemon is slow to read."""
        if self.writer.transport.get_write_buffer_size() > 1 << 16:
            async with self.drain_lock:
                await asyncio.wait_for(self.writer.drain(), timeout)

    def fail(self, err: BaseException) -> None:
        if self.error is None:
            self.error = err
        pending, self.pending = self.pending, {}
        for f in pending.values():
            if not f.done():
                f.set_exception(ConnectionError(f"connection lost: {err}"))
        self.writer.close()

    async def _read_loop(self) -> None:
        fb = FrameBuffer()
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("the daemon closed the connection")
                for frame in fb.feed(data):
                    r = decode_response(frame)
                    f = self.pending.pop(r.id, None)
                    if f is not None and not f.done():
                        f.set_result(r)
        except (OSError, RldError) as e:
            self.fail(e)
        except asyncio.CancelledError:
            self.fail(ConnectionError("client closed"))
            raise


class AsyncClient(_Base):
    """The asyncio twin of Client, with the same arguments and fail mode:
    the calls of many tasks share one connection and are pipelined. Use it
    from one event loop at a time; on another loop it reconnects."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 0.1, fail_open: bool = True, *,
                 raise_errors: bool = False, retry_interval: float = 0.1, log_interval: float = 10.0):
        super().__init__(socket_path, timeout, fail_open, raise_errors, retry_interval, log_interval)
        self._conn: Optional[_AsyncConn] = None
        self._connecting: Optional[asyncio.Future] = None
        self._closed = False

    async def check(self, descriptors: Descriptors = None, cost: int = 1, timeout: Optional[float] = None) -> Result:
        """Like Client.check."""
        return (await self._call(OP_CHECK, [descriptors], cost, timeout))[0]

    async def peek(self, descriptors: Descriptors = None, cost: int = 1, timeout: Optional[float] = None) -> Result:
        """Like Client.peek."""
        return (await self._call(OP_PEEK, [descriptors], cost, timeout))[0]

    async def ping(self, timeout: Optional[float] = None) -> bool:
        """Like Client.ping."""
        return not (await self._call(OP_PING, [None], 0, timeout, _probe))[0].failed

    async def acquire(self, descriptors: Descriptors = None, cost: int = 1, timeout: Optional[float] = None) -> Result:
        """Like Client.acquire."""
        return (await self._call(OP_ACQUIRE, [descriptors], cost, timeout))[0]

    async def release(self, lease: str, timeout: Optional[float] = None) -> Result:
        """Like Client.release."""
        return (await self._call(OP_RELEASE, [lease], 0, timeout))[0]

    async def settle(self, lease: str, cost: int, timeout: Optional[float] = None) -> Result:
        """Like Client.settle."""
        return (await self._call(OP_SETTLE, [lease], cost, timeout))[0]

    async def check_many(self, batch: Batch, cost: int = 1, timeout: Optional[float] = None) -> List[Result]:
        """Like Client.check_many."""
        return await self._call(OP_CHECK, batch, cost, timeout)

    async def peek_many(self, batch: Batch, cost: int = 1, timeout: Optional[float] = None) -> List[Result]:
        """Like Client.peek_many."""
        return await self._call(OP_PEEK, batch, cost, timeout)

    async def close(self) -> None:
        """Closes the connection; later calls raise RldError."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.task.cancel()
            conn.fail(ConnectionError("client closed"))

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _connection(self, timeout: float) -> _AsyncConn:
        if self._closed:
            raise RldError("client closed")
        loop = asyncio.get_running_loop()
        c = self._conn
        if c is not None and c.error is None and c.loop is loop:
            return c
        # One task connects; the others wait for its connection.
        if self._connecting is not None and self._connecting.get_loop() is loop:
            return await asyncio.wait_for(asyncio.shield(self._connecting), timeout)
        self._connect_allowed()
        fut = self._connecting = loop.create_future()
        try:
            r, w = await asyncio.wait_for(asyncio.open_unix_connection(self.socket_path), timeout)
        except (OSError, asyncio.TimeoutError) as e:
            err = self._connect_failed(e)
            fut.set_exception(err)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise err from e
        finally:
            if self._connecting is fut:
                self._connecting = None
        self._conn = _AsyncConn(r, w)
        fut.set_result(self._conn)
        return self._conn

    async def _call(self, op: int, batch: Batch, cost: int, timeout: Optional[float],
                    probe: Optional[_FailMode] = None) -> List[Result]:
        fail = probe or self._fail
        bodies = self._bodies(op, batch, cost)
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            conn = await self._connection(timeout)
            futs = conn.send(op, bodies)
            await conn.drain(deadline - time.monotonic())
        except (ConnectionError, asyncio.TimeoutError) as e:
            return [fail.result(str(e) or "daemon too slow to read") for _ in bodies]
        if len(futs) == 1:
            try:
                await asyncio.wait_for(asyncio.shield(futs[0][1]), max(deadline - time.monotonic(), 0))
            except (asyncio.TimeoutError, ConnectionError):
                pass
        else:
            await asyncio.wait([f for _, f in futs], timeout=max(deadline - time.monotonic(), 0))
        out = []
        for i, f in futs:
            if not f.done():
                conn.pending.pop(i, None)
                f.cancel()
                out.append(fail.result(f"no answer within {timeout * 1000:g} ms"))
            elif f.exception() is not None:
                out.append(fail.result(str(f.exception())))
            else:
                out.append(fail.answer(f.result()))
        return out


# ---------------------------------------------------------------- middleware

#: What WSGI's fallback re-quoting of SCRIPT_NAME + PATH_INFO leaves as is.
TARGET_SAFE = "/;=,~!$&'()*+:@"
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9a-z-]+$")


def _latin1(s: str) -> bytes:
    """Returns the bytes a WSGI string stands for (PEP 3333: the request's
    bytes decoded as latin-1)."""
    try:
        return s.encode("latin-1")
    except UnicodeEncodeError:  # a server that broke the rule: keep every character
        return s.encode("utf-8", "surrogatepass")


def wsgi_target(environ: Mapping[str, Any]) -> bytes:
    """Returns the raw request target (path and query) of a WSGI request:
    RAW_URI or REQUEST_URI when the server gives one (gunicorn, uWSGI),
    else SCRIPT_NAME + PATH_INFO percent-encoded again (all but TARGET_SAFE
    and unreserved characters) + "?" + QUERY_STRING when there is one. The
    re-quoting cannot tell an encoded character from a plain one: "%2F" and
    "/" (or "%41" and "A") both come back as the plain one."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return _latin1(raw)
    path = _latin1(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""))
    target = urllib.parse.quote_from_bytes(path, safe=TARGET_SAFE).encode("ascii") or b"/"
    query = environ.get("QUERY_STRING")
    return target + b"?" + _latin1(query) if query else target


def asgi_target(scope: Mapping[str, Any]) -> bytes:
    """Returns the raw request target of an ASGI HTTP scope: raw_path (+ "?"
    + query_string when not empty); a server that gives no raw_path gets the
    re-quoting of root_path + path, as wsgi_target does."""
    raw = scope.get("raw_path")
    if not raw:
        path = (scope.get("root_path", "") + scope.get("path", "")).encode("utf-8", "surrogateescape")
        raw = urllib.parse.quote_from_bytes(path, safe=TARGET_SAFE).encode("ascii") or b"/"
    query = scope.get("query_string")
    return bytes(raw) + b"?" + bytes(query) if query else bytes(raw)


def _header_names(headers: Iterable[str]) -> Tuple[bytes, ...]:
    """Returns the header names to send, lower case, or raises ValueError."""
    if isinstance(headers, (str, bytes)):
        raise ValueError("headers must be a list of header names, not one string")
    names = []
    for h in headers:
        n = _raw(h, "header name").decode("latin-1").strip().lower()
        if not _TOKEN.match(n) or len(n) > MAX_NAME - 3:
            raise ValueError(f"header name {h!r} is not a token of 1 to {MAX_NAME - 3} characters")
        if n.encode() not in names:
            names.append(n.encode())
    if len(names) > MAX_HEADERS:
        raise ValueError(f"{len(names)} header names, at most {MAX_HEADERS}")
    return tuple(names)


class _Limiter:
    """What the WSGI and ASGI middleware share: the headers sent, the cost,
    the by-hand descriptors, and the answer of a denied request."""

    def __init__(self, headers: Iterable[str], cost: int, extra: Optional[Callable[[Any], Iterable[Tuple[Any, Any]]]]):
        self.headers = _header_names(headers)
        self.attr_names = tuple(b":h:" + h for h in self.headers)
        self.cost = cost
        self.extra = extra

    def finish(self, d: list, request: Any) -> list:
        if self.extra is not None:
            d.extend(self.extra(request))
        return d

    @staticmethod
    def denial(r: Result) -> Optional[Tuple[int, str, bytes]]:
        """Returns (status, reason, JSON body) for a result that may not go through."""
        if r.allowed:
            return None
        if r.status == LIMITED:
            retry = max(1, _seconds(r.retry_after_ms))
            body = {"error": {"code": "RATE_LIMIT_EXCEEDED",
                              "message": f"rate limit {json.dumps(r.rule)} exceeded; retry after {retry}s",
                              "details": {"rule": r.rule, "limit": r.limit, "window_seconds": _seconds(r.window_ms),
                                          "retry_after_seconds": retry,
                                          "reset_at": -(-(time.time_ns() + r.reset_ms * 1_000_000) // 1_000_000_000)}}}
            return 429, "Too Many Requests", _json(body)
        if r.status == BLOCKED:
            return 403, "Forbidden", _json({"error": {"code": "BLOCKED", "message": "request blocked by the deny list"}})
        if r.code in _OUTAGE_CODES:
            return 503, "Service Unavailable", _json({"error": {"code": "UNAVAILABLE",
                                                                "message": "the rate limiter is unavailable"}})
        return 500, "Internal Server Error", _json({"error": {"code": "INTERNAL",
                                                              "message": f"rate limiter error: {r.error}"}})


def _json(v: Any) -> bytes:
    return (json.dumps(v, separators=(",", ":")) + "\n").encode("utf-8")


class WSGIMiddleware:
    """Checks every request of a WSGI application with rld.

    It sends the request's attributes as the server saw them: :peer
    (REMOTE_ADDR), :method, :host (HTTP_HOST), :target (see wsgi_target),
    and :h:NAME for each header of headers the request carries (as the
    server joined repeated ones), then whatever extra(environ) returns;
    rld derives the descriptors its rules match on ([request] in
    rld.toml). Long values are sent as their digest. Every answer gets the
    rate-limit headers; a limited request is answered 429 with Retry-After
    and a JSON body, a blocked one 403, and, when the client fails
    closed, 503.
    """

    def __init__(self, app: Callable, client: Client, *, headers: Iterable[str] = DEFAULT_HEADERS, cost: int = 1,
                 extra: Optional[Callable[[dict], Iterable]] = None):
        self.app = app
        self.client = client
        self._limiter = _Limiter(headers, cost, extra)
        self._env = tuple(
            (a, "CONTENT_TYPE" if h == b"content-type" else "CONTENT_LENGTH" if h == b"content-length"
             else "HTTP_" + h.decode().upper().replace("-", "_"))
            for a, h in zip(self._limiter.attr_names, self._limiter.headers))

    def attributes(self, environ: dict) -> list:
        """Returns what a request's check sends (before long values are
        digested): its attributes, then extra's descriptors."""
        d = []
        peer = environ.get("REMOTE_ADDR")
        if peer:
            d.append((b":peer", _latin1(peer)))
        d.append((b":method", _latin1(environ.get("REQUEST_METHOD", "GET"))))
        host = environ.get("HTTP_HOST")
        if host is not None:
            d.append((b":host", _latin1(host)))
        d.append((b":target", wsgi_target(environ)))
        for attr, key in self._env:
            v = environ.get(key)
            if v is not None:
                d.append((attr, _latin1(v)))
        return self._limiter.finish(d, environ)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        r = self.client.check(self.attributes(environ), self._limiter.cost)
        extra = r.headers()
        denied = _Limiter.denial(r)
        if denied is not None:
            status, reason, body = denied
            start_response(f"{status} {reason}", extra + [("Content-Type", "application/json"),
                                                         ("Content-Length", str(len(body)))])
            return [body]

        def start(status: str, headers: list, exc_info: Any = None) -> Callable:
            return start_response(status, list(headers) + extra, exc_info)

        return self.app(environ, start)


class ASGIMiddleware:
    """Checks every HTTP request of an ASGI application with rld, as
    WSGIMiddleware does: :peer is scope["client"][0], :method
    scope["method"], :host the host header, :target raw_path (+ "?" +
    query_string), :h:NAME the headers (repeated ones joined with ", " in
    the order received); extra(scope) may add descriptors. Other scopes
    (lifespan, websocket) pass through."""

    def __init__(self, app: Callable, client: AsyncClient, *, headers: Iterable[str] = DEFAULT_HEADERS, cost: int = 1,
                 extra: Optional[Callable[[dict], Iterable]] = None):
        self.app = app
        self.client = client
        self._limiter = _Limiter(headers, cost, extra)
        self._attr = dict(zip(self._limiter.headers, self._limiter.attr_names))

    def attributes(self, scope: dict) -> list:
        """Returns what a request's check sends (before long values are
        digested): its attributes, then extra's descriptors."""
        d = []
        client = scope.get("client")
        if client and client[0]:
            d.append((b":peer", str(client[0]).encode("utf-8", "surrogateescape")))
        d.append((b":method", scope.get("method", "GET").encode("utf-8", "surrogateescape")))
        host = None
        found: dict = {}
        for k, v in scope.get("headers") or ():
            k = bytes(k).lower()
            if k == b"host" and host is None:
                host = bytes(v)
            if k in self._attr:
                found.setdefault(k, []).append(bytes(v))
        if host is not None:
            d.append((b":host", host))
        d.append((b":target", asgi_target(scope)))
        for h in self._limiter.headers:
            vs = found.get(h)
            if vs is not None:
                d.append((self._attr[h], b", ".join(vs)))
        return self._limiter.finish(d, scope)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        r = await self.client.check(self.attributes(scope), self._limiter.cost)
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in r.headers()]
        denied = _Limiter.denial(r)
        if denied is not None:
            status, _, body = denied
            await send({"type": "http.response.start", "status": status,
                        "headers": extra + [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(message: dict) -> None:
            if message.get("type") == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers") or ()) + extra
            await send(message)

        await self.app(scope, receive, send_with_headers)
