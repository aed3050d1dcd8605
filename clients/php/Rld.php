<?php
// Rld.php: the PHP client of rld, the rate-limit daemon (PHP 8.1+, the
// standard library only). It speaks the binary protocol of
// docs/protocol.md on the daemon's Unix socket, over one persistent
// connection per PHP-FPM worker (pfsockopen), so a request pays no
// connect. docs/clients.md describes it.
//
//   require '/usr/share/rld/Rld.php';
//   $rld = new Rld('/run/rld/rld.sock');
//   if (!$rld->enforce($rld->attributes())) {
//       return; // 429 or 403 sent, with the rate-limit headers
//   }
//
// The client sends the request's attributes (docs/protocol.md): the
// address, method, Host, raw target and some headers as PHP got them;
// the daemon derives the descriptors its rules match on.

declare(strict_types=1);

/**
 * Rld asks rld whether a request may go through.
 */
final class Rld
{
    public const OP_CHECK = 1;
    public const OP_PEEK = 2;
    public const OP_PING = 3;
    public const OP_ACQUIRE = 5;
    public const OP_RELEASE = 6;
    public const OP_SETTLE = 7;

    public const ALLOWED = 0;
    public const LIMITED = 1;
    public const BLOCKED = 2;
    public const ALLOWED_DEGRADED = 3;
    public const ERROR = 4;

    public const STATUS_NAMES = ['allowed', 'limited', 'blocked', 'allowed-degraded', 'error'];
    /** The next field of an answer when the daemon does not know when quota comes back. */
    public const NEXT_UNKNOWN = 4294967295;

    /** The headers sent as attributes by default (lower case). */
    public const DEFAULT_HEADERS = ['x-api-key', 'authorization', 'x-forwarded-for', 'x-real-ip', 'forwarded', 'cookie'];
    /** The most header names the headers option may list. */
    public const MAX_HEADERS = 8;
    /** The error codes (internal, overloaded, unavailable) on which a client fails open, as when rld is down. */
    public const FAIL_OPEN_CODES = [7, 8, 11];

    private const MAX_FRAME = 65536;
    private const MAX_DESCS = 32;
    private const MAX_NAME = 64;
    private const MAX_VALUE = 1024;
    private const MAX_ATTR_VALUE = 16384;
    private const MAX_TARGET = 16384;
    private const MAX_HEADER_VALUE = 4096;
    private const MAX_MESSAGE = 1024;
    private const MAX_LEASE = 1024;

    /** @var array<string, true> the leases settled by this object, which withSlot() does not release */
    private array $settled = [];

    /** @var array<string, int> the actual costs set by setActualCost(), which withSlot() settles at */
    private array $actual = [];

    private static int $nextId = 0;

    /** @var string|null why the last call could not ask the daemon */
    public ?string $lastError = null;

    /**
     * @param string $socket      the daemon's Unix socket
     * @param float  $timeout     seconds for connect, write and read, each
     * @param bool   $failOpen    enforce() lets requests through when rld cannot be asked
     * @param int    $failStatus  the status enforce() answers when failing closed
     * @param int    $logInterval seconds between two error_log lines about failures (per host)
     * @param list<string> $headers the request headers attributes() sends (at most 8 names)
     */
    public function __construct(
        private string $socket = '/run/rld/rld.sock',
        private float $timeout = 0.1,
        private bool $failOpen = true,
        private int $failStatus = 503,
        private int $logInterval = 10,
        array $headers = self::DEFAULT_HEADERS,
    ) {
        $this->sources = self::sources($headers);
    }

    /** @var array<string, string> each attribute attributes() sends => the $_SERVER entry it is read from */
    private array $sources;

    /** The attributes every request has, and where PHP keeps them. */
    private const FIXED = [':peer' => 'REMOTE_ADDR', ':method' => 'REQUEST_METHOD', ':host' => 'HTTP_HOST', ':target' => 'REQUEST_URI'];

    /**
     * attributes returns the current request's attributes, as PHP got
     * them, for the daemon to derive descriptors from: :peer
     * (REMOTE_ADDR), :method (REQUEST_METHOD), :host (HTTP_HOST), :target
     * (REQUEST_URI, raw), and :h:NAME for each header of the headers
     * option that the request carries; then $extra, descriptors given by
     * hand (a map or a list of [name, value] pairs). Whatever is absent is
     * left out. Nothing is normalised here: the daemon does it.
     *
     * @return list<array{0: string, 1: string}>
     */
    public function attributes(array $extra = []): array
    {
        return self::collect($this->sources, $extra);
    }

    /**
     * requestAttributes is attributes() with the header names given:
     * lower-case names, at most 8 (InvalidArgumentException otherwise).
     *
     * @return list<array{0: string, 1: string}>
     */
    public static function requestAttributes(array $headers = self::DEFAULT_HEADERS, array $extra = []): array
    {
        return self::collect(self::sources($headers), $extra);
    }

    /**
     * @param array<string, string> $sources attribute name => $_SERVER entry
     * @return list<array{0: string, 1: string}>
     */
    private static function collect(array $sources, array $extra): array
    {
        $a = [];
        foreach ($sources as $name => $var) {
            if (isset($_SERVER[$var])) {
                $a[] = [$name, (string) $_SERVER[$var]];
            }
        }
        foreach (self::pairs($extra) as $p) {
            $a[] = $p;
        }
        return $a;
    }

    /**
     * requestDescriptors is requestAttributes() with the default headers
     * and $apiKeyHeader. Deprecated: pages written for the descriptors the
     * client used to build keep working; the daemon's [request] table says
     * which header is the API key.
     *
     * @return list<array{0: string, 1: string}>
     */
    public static function requestDescriptors(string $apiKeyHeader = 'X-API-Key', array $extra = []): array
    {
        $headers = self::DEFAULT_HEADERS;
        $key = strtolower($apiKeyHeader);
        if (!in_array($key, $headers, true)) {
            $headers[] = $key;
        }
        return self::requestAttributes($headers, $extra);
    }

    /**
     * fit returns $value as it goes on the wire under $name: itself when
     * it is within its limit, else "sha256:" and the lowercase hex SHA-256
     * of the whole value. Limits: :target 16384 bytes, :h:* 4096, any
     * other name 1024. A long value is digested, so it never makes a check
     * fail.
     */
    public static function fit(string $name, string $value): string
    {
        if (strlen($value) <= self::MAX_VALUE) {
            return $value; // within every limit
        }
        $limit = self::MAX_VALUE;
        if ($name === ':target') {
            $limit = self::MAX_TARGET;
        } elseif (str_starts_with($name, ':h:')) {
            $limit = self::MAX_HEADER_VALUE;
        }
        return strlen($value) > $limit ? 'sha256:' . hash('sha256', $value) : $value;
    }

    /**
     * fitAll returns $descriptors (a map or a list of [name, value] pairs)
     * as the list check() encodes: each value passed through fit().
     *
     * @return list<array{0: string, 1: string}>
     */
    public static function fitAll(array $descriptors): array
    {
        $list = [];
        foreach (self::pairs($descriptors) as [$name, $value]) {
            $list[] = [(string) $name, self::fit((string) $name, (string) $value)];
        }
        return $list;
    }

    /**
     * sources returns where PHP keeps each attribute attributes() sends:
     * the fixed four, then :h:NAME for each header (HTTP_NAME, upper case,
     * '-' as '_'; CONTENT_TYPE and CONTENT_LENGTH without HTTP_).
     *
     * @return array<string, string>
     */
    private static function sources(array $headers): array
    {
        $src = self::FIXED;
        foreach (self::headerNames($headers) as $h) {
            $var = strtoupper(strtr($h, '-', '_'));
            $src[':h:' . $h] = $var === 'CONTENT_TYPE' || $var === 'CONTENT_LENGTH' ? $var : 'HTTP_' . $var;
        }
        return $src;
    }

    /** @return list<string> the names, lower case, checked */
    private static function headerNames(array $headers): array
    {
        if (count($headers) > self::MAX_HEADERS) {
            throw new InvalidArgumentException(count($headers) . ' header names, more than ' . self::MAX_HEADERS);
        }
        $names = [];
        foreach ($headers as $h) {
            $h = strtolower((string) $h);
            if (!preg_match('/^[a-z0-9!#$%&\'*+.^_`|~-]{1,61}$/', $h)) {
                throw new InvalidArgumentException("header name \"$h\": 1 to 61 token characters");
            }
            $names[] = $h;
        }
        return $names;
    }

    /**
     * check asks whether a request may go, and takes $cost units when it
     * may. $descriptors is a map ['api_key' => 'k'] or a list of
     * [name, value] pairs; attributes() gives the request's. A value
     * longer than its limit is sent as its digest (fit()). Returns the
     * answer (see decode(), plus 'allowed'), or null when the daemon could
     * not be asked ($lastError says why; logged at most once per
     * interval). Descriptors the protocol cannot carry (more than 32, a
     * name empty or over 64 bytes) throw InvalidArgumentException.
     */
    public function check(array $descriptors, int $cost = 1): ?array
    {
        return $this->exchange(self::OP_CHECK, $descriptors, $cost);
    }

    /** peek decides as check() would, but takes nothing. */
    public function peek(array $descriptors, int $cost = 1): ?array
    {
        return $this->exchange(self::OP_PEEK, $descriptors, $cost);
    }

    /** ping returns a PING's answer, or null. */
    public function ping(): ?array
    {
        return $this->exchange(self::OP_PING, [], 0);
    }

    /**
     * acquire answers as check() does, and the concurrency rules that
     * apply hold a slot until release() or settle() of the answer's
     * 'lease' ('' when it took nothing), or their timeout. $cost may be
     * an estimate that settle() corrects. Prefer withSlot(), which
     * releases in a finally block.
     */
    public function acquire(array $descriptors, int $cost = 1): ?array
    {
        return $this->exchange(self::OP_ACQUIRE, $descriptors, $cost);
    }

    /** release gives back the slots of an acquire's lease; an unknown lease answers error not_found (code 14). */
    public function release(string $lease): ?array
    {
        return $this->exchange(self::OP_RELEASE, [], 0, $lease);
    }

    /**
     * settle ends an acquire at its actual cost: the difference from its
     * estimate is charged or refunded, and its slots go back.
     */
    public function settle(string $lease, int $cost): ?array
    {
        $this->settled[$lease] = true;
        return $this->exchange(self::OP_SETTLE, [], $cost, $lease);
    }

    /**
     * setActualCost records the actual cost of the request that $answer
     * (withSlot()'s acquire) admitted at an estimate: withSlot() settles
     * at it when $work ends, instead of releasing (also when $work throws
     * after the call: the work it counts was done). The last call wins.
     */
    public function setActualCost(?array $answer, int $cost): void
    {
        if ($answer !== null && ($answer['lease'] ?? '') !== '') {
            $this->actual[$answer['lease']] = $cost;
        }
    }

    /**
     * withSlot acquires, and when allowed calls $work with the answer and
     * returns what it returns, releasing the lease in a finally block
     * (unless $work settled it), or settling it at the cost $work gave
     * setActualCost(). When the acquire is refused it returns
     * $refused($answer) instead, holding nothing; when the daemon cannot
     * be asked, $work runs (fail open) or $refused(null) does (fail
     * closed), as for enforce().
     */
    public function withSlot(array $descriptors, callable $work, callable $refused, int $cost = 1): mixed
    {
        $res = $this->acquire($descriptors, $cost);
        if ($res === null || ($res['status'] === self::ERROR && in_array($res['code'], self::FAIL_OPEN_CODES, true))) {
            return $this->failOpen ? $work(null) : $refused(null);
        }
        if (!$res['allowed']) {
            return $refused($res);
        }
        try {
            return $work($res);
        } finally {
            $lease = $res['lease'];
            if ($lease !== '' && !isset($this->settled[$lease])) {
                if (isset($this->actual[$lease])) {
                    $this->settle($lease, $this->actual[$lease]);
                } else {
                    $this->release($lease);
                }
            }
            unset($this->settled[$lease], $this->actual[$lease]);
        }
    }

    /**
     * enforce checks the current request ($descriptors: usually
     * $rld->attributes()) and sends the answer's header fields. It returns
     * true when the request may go on: allowed, or rld could not be asked
     * (down, slow, or an error answer internal, overloaded or unavailable)
     * and the client fails open. Otherwise it has sent 429 (limited, with
     * Retry-After and a JSON body), 403 (blocked) or the fail status
     * (failing closed, or any other error answer: nothing a request
     * contains lets it through), and the caller should stop.
     */
    public function enforce(array $descriptors, int $cost = 1): bool
    {
        $res = $this->check($descriptors, $cost);
        $refused = false;
        if ($res !== null && $res['status'] === self::ERROR) {
            $refused = !in_array($res['code'], self::FAIL_OPEN_CODES, true);
            $this->failed(sprintf('error answer %d: %s', $res['code'], $res['message']), $refused);
            $res = null;
        }
        if ($res === null) {
            if ($this->failOpen && !$refused) {
                return true;
            }
            http_response_code($this->failStatus);
            header('Content-Type: application/json');
            echo $refused
                ? '{"error":{"code":"RATE_LIMIT_ERROR","message":"the rate limiter refused the check"}}'
                : '{"error":{"code":"RATE_LIMIT_UNAVAILABLE","message":"the rate limiter cannot be reached"}}', "\n";
            return false;
        }
        $now = microtime(true);
        foreach (self::headers($res, $now) as $name => $value) {
            header($name . ': ' . $value);
        }
        if ($res['status'] === self::LIMITED) {
            http_response_code(429);
            header('Content-Type: application/json');
            echo self::limitedBody($res, $now);
            return false;
        }
        if ($res['status'] === self::BLOCKED) {
            http_response_code(403);
            header('Content-Type: application/json');
            echo '{"error":{"code":"BLOCKED","message":"request blocked by the deny list"}}', "\n";
            return false;
        }
        return true;
    }

    private function exchange(int $op, array $descriptors, int $cost, string $lease = ''): ?array
    {
        self::$nextId = (self::$nextId + 1) & 0xffffffff;
        $id = self::$nextId;
        $frame = self::encode($id, $op, $cost, self::fitAll($descriptors), $lease);
        for ($attempt = 1; ; $attempt++) {
            $err = null;
            $res = $this->roundTrip($frame, $id, $err);
            if ($res !== null) {
                $this->lastError = null;
                return $res;
            }
            // A persistent connection the daemon closed (a restart): try
            // once on a new one.
            if ($attempt === 1 && $err === 'connection closed') {
                continue;
            }
            $this->failed($err);
            return null;
        }
    }

    private function roundTrip(string $frame, int $id, ?string &$err): ?array
    {
        $errno = 0;
        $errstr = '';
        $fp = @pfsockopen('unix://' . $this->socket, -1, $errno, $errstr, $this->timeout);
        if ($fp === false) {
            $err = sprintf('connect %s: %s', $this->socket, $errstr !== '' ? $errstr : "error $errno");
            return null;
        }
        $sec = (int) $this->timeout;
        stream_set_timeout($fp, $sec, (int) (($this->timeout - $sec) * 1e6));
        $written = @fwrite($fp, $frame);
        if ($written !== strlen($frame)) {
            $err = stream_get_meta_data($fp)['timed_out'] ? 'write timed out' : 'connection closed';
            $this->drop($fp);
            return null;
        }
        while (true) {
            $head = $this->readN($fp, 4, $err);
            if ($head === null) {
                return null;
            }
            $length = unpack('N', $head)[1];
            if ($length < 8 || $length > self::MAX_FRAME - 4) {
                $err = "bad length field $length";
                $this->drop($fp);
                return null;
            }
            $body = $this->readN($fp, $length, $err);
            if ($body === null) {
                return null;
            }
            try {
                $res = self::decode($head . $body);
            } catch (UnexpectedValueException $e) {
                $err = 'bad answer: ' . $e->getMessage();
                $this->drop($fp);
                return null;
            }
            if ($res['id'] === $id) {
                $res['allowed'] = $res['status'] === self::ALLOWED || $res['status'] === self::ALLOWED_DEGRADED;
                return $res;
            }
        }
    }

    /** @param resource $fp */
    private function readN($fp, int $n, ?string &$err): ?string
    {
        $buf = '';
        while (strlen($buf) < $n) {
            $chunk = @fread($fp, $n - strlen($buf));
            if ($chunk === false || $chunk === '') {
                $meta = stream_get_meta_data($fp);
                $err = $meta['timed_out'] ? 'read timed out' : 'connection closed';
                $this->drop($fp);
                return null;
            }
            $buf .= $chunk;
        }
        return $buf;
    }

    /** @param resource $fp */
    private function drop($fp): void
    {
        @fclose($fp);
    }

    /**
     * failed records why a check could not be made and logs it at most
     * once per interval; $refused: an error answer that refuses the
     * request (logged apart, with its own interval).
     */
    private function failed(?string $err, bool $refused = false): void
    {
        $this->lastError = $err;
        // PHP forgets everything between requests: the last log time is
        // the mtime of a marker file, shared by the host's workers.
        $marker = sys_get_temp_dir() . '/rld-' . md5($this->socket) . ($refused ? '.refused' : '.logged');
        $now = time();
        clearstatcache(true, $marker);
        $last = @filemtime($marker);
        if ($last === false || $now - $last >= $this->logInterval) {
            @touch($marker, $now);
            error_log($refused
                ? sprintf('rld: check refused (%s); answering %d', $err, $this->failStatus)
                : sprintf('rld: cannot check (%s); failing %s', $err, $this->failOpen ? 'open' : 'closed'));
        }
    }

    /** @return list<array{0: string, 1: string}> */
    private static function pairs(array $descriptors): array
    {
        if ($descriptors === [] || array_is_list($descriptors)) {
            return $descriptors;
        }
        ksort($descriptors, SORT_STRING);
        $list = [];
        foreach ($descriptors as $k => $v) {
            $list[] = [(string) $k, (string) $v];
        }
        return $list;
    }

    /**
     * encode returns the request frame. CHECK, PEEK and ACQUIRE carry cost
     * and descriptors; RELEASE carries $lease, and SETTLE cost and $lease;
     * a PING has an empty body. It throws InvalidArgumentException for a
     * request the protocol cannot carry: it encodes values as given, up to
     * 1024 bytes (16384 for an attribute, a name starting with ':'), and
     * leaves digesting long ones (fit()) to check(), peek() and acquire().
     */
    public static function encode(int $id, int $op, int $cost, array $descriptors, string $lease = ''): string
    {
        $body = '';
        if ($op === self::OP_RELEASE || $op === self::OP_SETTLE) {
            if ($lease === '' || strlen($lease) > self::MAX_LEASE) {
                throw new InvalidArgumentException('lease of ' . strlen($lease) . ' bytes (1 to 1024)');
            }
            if ($op === self::OP_SETTLE) {
                if ($cost < 0 || $cost > 0xffffffff) {
                    throw new InvalidArgumentException("cost $cost does not fit in 4 bytes");
                }
                $body = pack('N', $cost);
            }
            $body .= pack('n', strlen($lease)) . $lease;
        }
        if ($op === self::OP_CHECK || $op === self::OP_PEEK || $op === self::OP_ACQUIRE) {
            if ($cost < 0 || $cost > 0xffffffff) {
                throw new InvalidArgumentException("cost $cost does not fit in 4 bytes");
            }
            $list = self::pairs($descriptors);
            if (count($list) > self::MAX_DESCS) {
                throw new InvalidArgumentException(count($list) . ' descriptors, more than ' . self::MAX_DESCS);
            }
            $body = pack('NC', $cost, count($list));
            foreach ($list as [$name, $value]) {
                $name = (string) $name;
                $value = (string) $value;
                if ($name === '' || strlen($name) > self::MAX_NAME) {
                    throw new InvalidArgumentException('descriptor name of ' . strlen($name) . ' bytes (1 to 64)');
                }
                $max = $name[0] === ':' ? self::MAX_ATTR_VALUE : self::MAX_VALUE;
                if (strlen($value) > $max) {
                    throw new InvalidArgumentException("descriptor $name: value of " . strlen($value) . " bytes (at most $max)");
                }
                $body .= chr(strlen($name)) . $name . pack('n', strlen($value)) . $value;
            }
            if (12 + strlen($body) > self::MAX_FRAME) {
                throw new InvalidArgumentException('frame of ' . (12 + strlen($body)) . ' bytes, more than ' . self::MAX_FRAME);
            }
        }
        return pack('NCCnN', 8 + strlen($body), 1, $op, 0, $id & 0xffffffff) . $body;
    }

    /**
     * decode decodes a complete response frame (length prefix included)
     * into [id, op (as sent, e.g. 129), flags, status, limit, remaining,
     * reset, retry, window (milliseconds), quota, quota_window
     * (milliseconds), next (milliseconds, 4294967295 when the daemon does
     * not know when quota comes back), rule, code, message, lease (an
     * ACQUIRE answer's, '' for the others)]. Unknown
     * flag bits are passed through. It throws UnexpectedValueException
     * for a frame that breaks the protocol.
     */
    public static function decode(string $f): array
    {
        $n = strlen($f);
        if ($n < 12) {
            throw new UnexpectedValueException("truncated frame: $n bytes");
        }
        $h = unpack('Nlength/Cversion/Cop/nflags/Nid', $f);
        if ($h['length'] < 8) {
            throw new UnexpectedValueException("length field {$h['length']} below 8");
        }
        if ($h['length'] > self::MAX_FRAME - 4) {
            throw new UnexpectedValueException("length field {$h['length']} above " . (self::MAX_FRAME - 4));
        }
        if ($n !== $h['length'] + 4) {
            throw new UnexpectedValueException($n < $h['length'] + 4
                ? "truncated frame: $n bytes, the length field says " . ($h['length'] + 4)
                : ($n - $h['length'] - 4) . ' bytes left over after the frame');
        }
        if ($h['version'] !== 1) {
            throw new UnexpectedValueException("bad version {$h['version']}");
        }
        if (($h['op'] & 0x80) === 0) {
            throw new UnexpectedValueException("op {$h['op']} is not a response (0x80 unset)");
        }
        if ($n < 12 + 50) {
            throw new UnexpectedValueException('truncated response body: ' . ($n - 12) . ' bytes');
        }
        $b = unpack('Cstatus/Jlimit/Jremaining/Nreset/Nretry/Nwindow/Jquota/Nquota_window/Nnext/Crl', $f, 12);
        if ($b['status'] > self::ERROR) {
            throw new UnexpectedValueException("unknown status {$b['status']}");
        }
        $rl = $b['rl'];
        if ($n < 58 + $rl + 4) {
            throw new UnexpectedValueException("rule of $rl bytes runs past the end");
        }
        $p = 58 + $rl;
        $t = unpack('ncode/nml', $f, $p);
        if ($t['ml'] > self::MAX_MESSAGE) {
            throw new UnexpectedValueException("message of {$t['ml']} bytes, more than 1024");
        }
        $lease = '';
        if ($h['op'] === (self::OP_ACQUIRE | 0x80)) {
            // An ACQUIRE answer ends with its lease: u16 length, bytes.
            $q = $p + 4 + $t['ml'];
            if ($n < $q + 2) {
                throw new UnexpectedValueException('ACQUIRE answer without its lease length');
            }
            $ll = unpack('n', $f, $q)[1];
            if ($ll > self::MAX_LEASE) {
                throw new UnexpectedValueException("lease of $ll bytes, more than 1024");
            }
            if ($n !== $q + 2 + $ll) {
                throw new UnexpectedValueException("lease of $ll bytes with " . ($n - $q - 2) . ' bytes left');
            }
            $lease = substr($f, $q + 2, $ll);
            $n = $q;
        }
        if ($n !== $p + 4 + $t['ml']) {
            throw new UnexpectedValueException($n < $p + 4 + $t['ml']
                ? "message of {$t['ml']} bytes runs past the end"
                : 'bytes left over after the message');
        }
        return [
            'id' => $h['id'],
            'op' => $h['op'],
            'flags' => $h['flags'],
            'status' => $b['status'],
            'limit' => $b['limit'],
            'remaining' => $b['remaining'],
            'reset' => $b['reset'],
            'retry' => $b['retry'],
            'window' => $b['window'],
            'quota' => $b['quota'],
            'quota_window' => $b['quota_window'],
            'next' => $b['next'],
            'rule' => substr($f, 58, $rl),
            'code' => $t['code'],
            'message' => substr($f, $p + 4, $t['ml']),
            'lease' => $lease,
        ];
    }

    private static function seconds(int $ms): int
    {
        return $ms <= 0 ? 0 : intdiv($ms + 999, 1000);
    }

    private static function sfString(string $s): string
    {
        $out = '"';
        for ($i = 0, $n = strlen($s); $i < $n; $i++) {
            $c = $s[$i];
            $o = ord($c);
            if ($c === '"' || $c === '\\') {
                $out .= '\\' . $c;
            } elseif ($o < 0x20 || $o > 0x7e) {
                $out .= '?';
            } else {
                $out .= $c;
            }
        }
        return $out . '"';
    }

    /**
     * headers returns the response header fields for an answer, in the
     * order and form of docs/protocol.md ("Rendering HTTP headers"), as
     * rld's HTTP endpoint renders them: X-RateLimit-Limit, -Remaining,
     * -Reset (Unix seconds), RateLimit-Policy (when the quota is known),
     * RateLimit (with t when the daemon knows when quota comes back), and
     * Retry-After when there is a retry-after. Empty when no limit applied.
     */
    public static function headers(array $res, ?float $now = null): array
    {
        if ($res['rule'] === '' || $res['limit'] === 0) {
            return [];
        }
        $now ??= microtime(true);
        $rule = self::sfString($res['rule']);
        $h = [
            'X-RateLimit-Limit' => (string) $res['limit'],
            'X-RateLimit-Remaining' => (string) $res['remaining'],
            'X-RateLimit-Reset' => (string) (int) floor($now + $res['reset'] / 1000 + 0.999999999),
        ];
        if ($res['quota'] > 0) {
            $policy = $rule . ';q=' . $res['quota'];
            $w = $res['quota_window'] ?: $res['window'];
            if ($w > 0) {
                $policy .= ';w=' . self::seconds($w);
            }
            $h['RateLimit-Policy'] = $policy;
        }
        $rl = $rule . ';r=' . $res['remaining'];
        if ($res['next'] !== self::NEXT_UNKNOWN) {
            $rl .= ';t=' . self::seconds($res['next']);
        }
        $h['RateLimit'] = $rl;
        if ($res['retry'] > 0) {
            $h['Retry-After'] = (string) max(1, self::seconds($res['retry']));
        }
        return $h;
    }

    /** limitedBody returns the JSON body of a 429, as rld's HTTP endpoint writes it. */
    public static function limitedBody(array $res, ?float $now = null): string
    {
        $now ??= microtime(true);
        $retry = max(1, self::seconds(max($res['retry'], 1)));
        $flags = JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE | JSON_INVALID_UTF8_SUBSTITUTE;
        $msg = 'rate limit ' . json_encode($res['rule'], $flags) . " exceeded; retry after {$retry}s";
        return '{"error":{"code":"RATE_LIMIT_EXCEEDED","message":' . json_encode($msg, $flags)
            . ',"details":{"rule":' . json_encode($res['rule'], $flags)
            . ',"limit":' . $res['limit']
            . ',"window_seconds":' . self::seconds($res['window'])
            . ',"retry_after_seconds":' . $retry
            . ',"reset_at":' . (int) floor($now + $res['reset'] / 1000 + 0.999999999)
            . "}}}\n";
    }
}
