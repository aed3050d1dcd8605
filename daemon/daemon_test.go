package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/wire"
)

const testConfig = `
allow = ["api_key=sk_internal_*"]
deny  = ["api_key=sk_revoked_*"]

[[rule]]
name = "search"
match = { endpoint = "/v1/search*" }
by = ["api_key"]
limit = 3
period = "1h"

[[rule]]
name = "tenant"
by = ["tenant"]
limit = 1000
period = "1h"
`

func start(t *testing.T, config string) *daemontest.Server {
	t.Helper()
	s, err := daemontest.Start(config)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func search(key string) []client.Descriptor {
	return []client.Descriptor{{Name: "api_key", Value: key}, {Name: "endpoint", Value: "/v1/search"}}
}

func TestCheckAllowedThenLimited(t *testing.T) {
	s := start(t, testConfig)
	c := client.New(s.Socket)
	defer c.Close()
	ctx := context.Background()
	for want := uint64(2); ; want-- {
		res, err := c.Check(ctx, search("demo"), 1)
		require.NoError(t, err)
		assert.Equal(t, wire.StatusAllowed, res.Status)
		assert.Equal(t, "search", res.Rule)
		assert.Equal(t, uint64(3), res.Limit)
		assert.Equal(t, want, res.Remaining)
		assert.Zero(t, res.RetryAfter)
		if want == 0 {
			break
		}
	}
	res, err := c.Check(ctx, search("demo"), 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusLimited, res.Status)
	assert.Equal(t, uint64(0), res.Remaining)
	// One token of 3/h refills in 20 minutes.
	assert.InDelta(t, (20 * time.Minute).Seconds(), res.RetryAfter.Seconds(), 1)
	// Another key has its own counter.
	res, err = c.Check(ctx, search("other"), 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusAllowed, res.Status)
	// Peek consumes nothing.
	for range 3 {
		res, err = c.Peek(ctx, search("peek"), 1)
		require.NoError(t, err)
		assert.Equal(t, uint64(2), res.Remaining)
	}
}

func TestAllowDenyAndNoRule(t *testing.T) {
	s := start(t, testConfig)
	c := client.New(s.Socket)
	defer c.Close()
	ctx := context.Background()
	res, err := c.Check(ctx, search("sk_revoked_1"), 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusBlocked, res.Status)
	for range 10 {
		res, err = c.Check(ctx, search("sk_internal_1"), 1)
		require.NoError(t, err)
		assert.Equal(t, wire.StatusAllowed, res.Status)
	}
	res, err = c.Check(ctx, []client.Descriptor{{Name: "endpoint", Value: "/v1/other"}}, 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusAllowed, res.Status)
	assert.Equal(t, "", res.Rule)
}

func TestCostTooLargeIsAnError(t *testing.T) {
	s := start(t, testConfig)
	c := client.New(s.Socket)
	defer c.Close()
	_, err := c.Check(context.Background(), search("big"), 4)
	var rerr *client.ResponseError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, wire.CodeCostTooLarge, rerr.Code)
	// and it consumed nothing
	res, err := c.Check(context.Background(), search("big"), 3)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusAllowed, res.Status)
}

// rawConn is a test connection that speaks frames by hand.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, path string) *rawConn {
	t.Helper()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) write(b []byte) {
	r.t.Helper()
	_, err := r.c.Write(b)
	require.NoError(r.t, err)
}

// read returns the next response, or the read error.
func (r *rawConn) read() (wire.Response, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r.br, hdr[:]); err != nil {
		return wire.Response{}, err
	}
	f := make([]byte, 4+binary.BigEndian.Uint32(hdr[:]))
	copy(f, hdr[:])
	if _, err := io.ReadFull(r.br, f[4:]); err != nil {
		return wire.Response{}, err
	}
	var res wire.Response
	require.NoError(r.t, wire.DecodeResponse(f, &res))
	return res, nil
}

func (r *rawConn) mustRead() wire.Response {
	r.t.Helper()
	res, err := r.read()
	require.NoError(r.t, err)
	return res
}

func (r *rawConn) ping(id uint32) {
	r.t.Helper()
	r.write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpPing, ID: id}))
	res := r.mustRead()
	assert.Equal(r.t, id, res.ID)
	assert.Equal(r.t, wire.StatusAllowed, res.Status)
}

func checkFrame(id uint32, descs ...string) []byte {
	req := wire.Request{Op: wire.OpCheck, ID: id, Cost: 1}
	for _, d := range descs {
		n, v, _ := strings.Cut(d, "=")
		req.Descs = append(req.Descs, wire.Descriptor{Name: []byte(n), Value: []byte(v)})
	}
	return wire.AppendRequest(nil, &req)
}

func TestBadFramesKeepConnectionWhenFramingIntact(t *testing.T) {
	s := start(t, testConfig)
	r := dialRaw(t, s.Socket)

	good := checkFrame(1, "api_key=k", "endpoint=/v1/search")
	cases := []struct {
		name  string
		frame func() []byte
		code  wire.Code
	}{
		{"bad version", func() []byte { f := clone(good); f[4] = 9; return f }, wire.CodeBadVersion},
		{"unknown op", func() []byte { f := clone(good); f[5] = 0x42; return f }, wire.CodeUnknownOp},
		{"reserved op", func() []byte { f := clone(good); f[5] = byte(wire.OpReset); return f }, wire.CodeNotSupported},
		{"request flags", func() []byte { f := clone(good); f[7] = 1; return f }, wire.CodeBadFlags},
		{"truncated descriptor", func() []byte {
			f := clone(good[:len(good)-3])
			binary.BigEndian.PutUint32(f, uint32(len(f)-4))
			return f
		}, wire.CodeMalformed},
		{"too many descriptors", func() []byte {
			var d []string
			for range wire.MaxDescriptors + 1 {
				d = append(d, "a=b")
			}
			return checkFrame(1, d...)
		}, wire.CodeTooLarge},
		{"value too long", func() []byte { return checkFrame(1, "a="+strings.Repeat("x", wire.MaxValueLen+1)) }, wire.CodeTooLarge},
	}
	for i, tc := range cases {
		f := tc.frame()
		binary.BigEndian.PutUint32(f[8:], uint32(100+i))
		r.write(f)
		res := r.mustRead()
		assert.Equal(t, wire.StatusError, res.Status, tc.name)
		assert.Equal(t, tc.code, res.Code, tc.name)
		assert.Equal(t, uint32(100+i), res.ID, tc.name)
		assert.NotEmpty(t, res.Message, tc.name)
		r.ping(uint32(200 + i)) // the connection still serves
	}
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

func TestFramingLostClosesOnlyThatConnection(t *testing.T) {
	s := start(t, testConfig)
	other := dialRaw(t, s.Socket)
	other.ping(1)

	// Oversize length: answered with frame_too_large (the id is readable),
	// then closed, before the daemon reads or allocates the body.
	r := dialRaw(t, s.Socket)
	f := checkFrame(77, "api_key=k")
	binary.BigEndian.PutUint32(f, wire.MaxFrame)
	r.write(f)
	res := r.mustRead()
	assert.Equal(t, wire.CodeFrameTooLarge, res.Code)
	assert.Equal(t, uint32(77), res.ID)
	_, err := r.read()
	assert.ErrorIs(t, err, io.EOF)

	// A length below the header size: closed.
	r2 := dialRaw(t, s.Socket)
	r2.write([]byte{0, 0, 0, 3, 1, 2, 3})
	res, err = r2.read()
	if err == nil { // an error answer may come first
		assert.Equal(t, wire.StatusError, res.Status)
		_, err = r2.read()
	}
	assert.Error(t, err)

	other.ping(2)
}

func TestPipelinedAnswersMatchIDs(t *testing.T) {
	s := start(t, testConfig)
	r := dialRaw(t, s.Socket)
	var batch []byte
	const n = 500
	for i := range n {
		batch = append(batch, checkFrame(uint32(i+1), "tenant=acme")...)
	}
	r.write(batch)
	seen := make(map[uint32]bool)
	allowed := 0
	for range n {
		res := r.mustRead()
		assert.False(t, seen[res.ID], "duplicate id %d", res.ID)
		seen[res.ID] = true
		if res.Status == wire.StatusAllowed {
			allowed++
		}
	}
	assert.Len(t, seen, n)
	assert.Equal(t, n, allowed)
}

func TestSlowClientIsCut(t *testing.T) {
	s := start(t, testConfig+"\n[server]\nread_timeout = \"200ms\"\n")
	r := dialRaw(t, s.Socket)
	f := checkFrame(1, "api_key=k")
	r.write(f[:7]) // a frame that never completes
	_, err := r.read()
	assert.ErrorIs(t, err, io.EOF)
	// others are served
	dialRaw(t, s.Socket).ping(1)
}

func TestMaxConnections(t *testing.T) {
	s := start(t, testConfig+"\n[server]\nmax_connections = 2\n")
	a, b := dialRaw(t, s.Socket), dialRaw(t, s.Socket)
	a.ping(1)
	b.ping(1)
	c := dialRaw(t, s.Socket)
	// The daemon closes a connection over the limit at once, writing
	// nothing: no request was made, so none is answered.
	_, err := c.read()
	assert.ErrorIs(t, err, io.EOF, "a third connection is closed with nothing written")
	a.c.Close()
	// The slot frees once the daemon sees the close: poll for it.
	require.Eventually(t, func() bool {
		d, err := net.Dial("unix", s.Socket)
		if err != nil {
			return false
		}
		defer d.Close()
		d.SetDeadline(time.Now().Add(time.Second))
		d.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpPing, ID: 9}))
		var hdr [4]byte
		_, err = io.ReadFull(d, hdr[:])
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
}

// TestRefusedConnectionsLogThrottled: a flood of connections over
// max_connections is counted one by one and logged once per interval,
// and no refused connection receives a byte.
func TestRefusedConnectionsLogThrottled(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "rld.toml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(testConfig+"\n[server]\nmax_connections = 1\nhttp = \"127.0.0.1:0\"\n"), 0o644))
	var logs syncBuffer
	d, err := daemon.New(daemon.Options{ConfigPath: cfgPath, Socket: filepath.Join(dir, "rld.sock"),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-d.Ready()
	metric := func() int {
		t.Helper()
		resp, err := http.Get("http://" + d.HTTPAddr() + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "rld_connections_rejected_total "); ok {
				n, err := strconv.Atoi(v)
				require.NoError(t, err)
				return n
			}
		}
		t.Fatal("no rld_connections_rejected_total")
		return 0
	}
	before := metric()

	held := dialRaw(t, d.SocketPath())
	held.ping(1)
	const flood = 50
	for i := range flood {
		c, err := net.Dial("unix", d.SocketPath())
		require.NoError(t, err)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		require.NoError(t, err, "refused connection %d closed", i)
		require.Empty(t, b, "refused connection %d received bytes", i)
	}
	assert.Equal(t, flood, metric()-before, "every refusal counted")
	lines := strings.Count(logs.String(), "too many connections")
	assert.Equal(t, 1, lines, "one log line for the flood within the interval:\n%s", logs.String())
	assert.Contains(t, logs.String(), "refused=1 ", "the first refusal is logged at once")
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestSocketModeAndStaleSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "sub", "rld.sock")
	// A stale socket: bound, then its listener gone without unlinking.
	require.NoError(t, os.MkdirAll(filepath.Dir(sock), 0o755))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	ln.Close()
	_, err = os.Stat(sock)
	require.NoError(t, err, "stale socket file exists")

	cfgPath := filepath.Join(dir, "rld.toml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(testConfig+"\n[server]\nsocket_mode = \"0600\"\nhttp = \"\"\n"), 0o644))
	run := func() (*daemon.Daemon, context.CancelFunc, chan error) {
		d, err := daemon.New(daemon.Options{ConfigPath: cfgPath, Socket: sock, Logger: discardLogger()})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		return d, cancel, done
	}
	d, cancel, done := run()
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("daemon did not start over a stale socket: %v", err)
	}
	fi, err := os.Stat(sock)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o600), fi.Mode().Perm())
	assert.NotZero(t, fi.Mode()&fs.ModeSocket)

	// A second daemon on the same live socket refuses to start.
	_, cancel2, done2 := run()
	err = <-done2
	cancel2()
	assert.ErrorIs(t, err, daemon.ErrSocketInUse)

	cancel()
	require.NoError(t, <-done)
	_, err = os.Stat(sock)
	assert.ErrorIs(t, err, fs.ErrNotExist, "socket removed on shutdown")
}

func TestDrainAnswersWhatWasRead(t *testing.T) {
	s := start(t, testConfig)
	c := client.New(s.Socket)
	defer c.Close()
	res, err := c.Check(context.Background(), search("drain"), 1)
	require.NoError(t, err)
	require.Equal(t, wire.StatusAllowed, res.Status)

	r := dialRaw(t, s.Socket)
	r.ping(1)
	require.NoError(t, s.Stop())
	_, err = r.read()
	assert.ErrorIs(t, err, io.EOF, "connection closed cleanly after drain")
	_, err = os.Stat(s.Socket)
	assert.ErrorIs(t, err, fs.ErrNotExist)
}

func TestReload(t *testing.T) {
	s := start(t, testConfig)
	c := client.New(s.Socket)
	defer c.Close()
	ctx := context.Background()
	limitOf := func() uint64 {
		res, err := c.Peek(ctx, search("reload"), 1)
		require.NoError(t, err)
		return res.Limit
	}
	require.Equal(t, uint64(3), limitOf())

	require.NoError(t, os.WriteFile(s.ConfigPath, []byte(strings.Replace(testConfig, "limit = 3", "limit = 7", 1)), 0o644))
	require.NoError(t, s.Daemon.Reload())
	assert.Equal(t, uint64(7), limitOf())

	require.NoError(t, os.WriteFile(s.ConfigPath, []byte(strings.Replace(testConfig, "limit = 3", "limit = -1", 1)), 0o644))
	err := s.Daemon.Reload()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "limit")
	assert.Equal(t, uint64(7), limitOf(), "the last good rules stay in force")

	// A socket path the kernel cannot bind is refused on reload too.
	long := "[server]\nsocket = \"/run/rld/" + strings.Repeat("s", 100) + ".sock\"\n"
	require.NoError(t, os.WriteFile(s.ConfigPath, []byte(testConfig+"\n"+long), 0o644))
	err = s.Daemon.Reload()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "server.socket")
	assert.Equal(t, uint64(7), limitOf())
}

func TestHTTPCheck(t *testing.T) {
	s := start(t, testConfig)
	get := func(q string) *http.Response {
		t.Helper()
		resp, err := http.Get("http://" + s.HTTP + "/v1/check?" + q)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	q := "api_key=web&endpoint=/v1/search"
	// The exact spelling of the field names, as the raw response carries them.
	raw, err := net.Dial("tcp", s.HTTP)
	require.NoError(t, err)
	fmt.Fprintf(raw, "GET /v1/check?api_key=spelling&endpoint=/v1/search HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	head, _ := io.ReadAll(raw)
	raw.Close()
	for _, name := range []string{"X-RateLimit-Limit:", "X-RateLimit-Remaining:", "X-RateLimit-Reset:", "RateLimit-Policy:", "RateLimit:"} {
		assert.Contains(t, string(head), "\r\n"+name+" ", "field spelled %s", name)
	}

	resp := get(q)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "3", resp.Header.Get("X-RateLimit-Limit"))
	assert.Equal(t, "2", resp.Header.Get("X-RateLimit-Remaining"))
	assert.NotEmpty(t, resp.Header.Get("X-RateLimit-Reset"))
	assert.Equal(t, `"search";q=3;w=3600`, resp.Header.Get("RateLimit-Policy"))
	assert.Regexp(t, `^"search";r=2;t=\d+$`, resp.Header.Get("RateLimit"))

	resp = get(q + "&cost=2")
	assert.Equal(t, 200, resp.StatusCode)
	resp = get(q)
	assert.Equal(t, 429, resp.StatusCode)
	assert.Equal(t, "1200", resp.Header.Get("Retry-After"))
	var body struct {
		Error struct {
			Code    string
			Message string
			Details struct {
				Limit             int   `json:"limit"`
				WindowSeconds     int   `json:"window_seconds"`
				RetryAfterSeconds int   `json:"retry_after_seconds"`
				ResetAt           int64 `json:"reset_at"`
			}
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	assert.Equal(t, "RATE_LIMIT_EXCEEDED", body.Error.Code)
	assert.Equal(t, 3, body.Error.Details.Limit)
	assert.Equal(t, 3600, body.Error.Details.WindowSeconds)
	assert.Equal(t, 1200, body.Error.Details.RetryAfterSeconds)
	assert.Greater(t, body.Error.Details.ResetAt, time.Now().Unix())

	assert.Equal(t, 403, get("api_key=sk_revoked_9&endpoint=/v1/search").StatusCode)
	assert.Equal(t, 400, get(q+"&cost=x").StatusCode)

	resp, err = http.Get("http://" + s.HTTP + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	m, _ := io.ReadAll(resp.Body)
	assert.Contains(t, string(m), `rld_checks_total{rule="search",decision="limited"}`)
	assert.Contains(t, string(m), `rld_check_duration_seconds`)
	assert.Contains(t, string(m), `rld_store_keys`)

	resp, err = http.Get("http://" + s.HTTP + "/healthz")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
}

// TestHTTPQueryParsing: the HTTP check refuses what it cannot read
// exactly, and cost and peek mean what they mean on the wire.
func TestHTTPQueryParsing(t *testing.T) {
	s := start(t, testConfig)
	get := func(q string) (int, http.Header) {
		t.Helper()
		// A raw request line: net/http would re-encode a bad escape.
		raw, err := net.Dial("tcp", s.HTTP)
		require.NoError(t, err)
		defer raw.Close()
		fmt.Fprintf(raw, "GET /v1/check?%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", q)
		resp, err := http.ReadResponse(bufio.NewReader(raw), nil)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	// remaining peeks at key: what would remain after one more unit (a
	// peek answers as the check would), so 2 for a fresh key.
	remaining := func(key string) string {
		t.Helper()
		code, h := get("api_key=" + key + "&endpoint=/v1/search&peek=1")
		require.Equal(t, 200, code)
		return h.Get("X-RateLimit-Remaining")
	}

	// Malformed percent-encoding: 400, and nothing is counted.
	for _, q := range []string{"api_key=%zz&endpoint=/v1/search", "api_key=a%&endpoint=/v1/search",
		"api_key=a%2&endpoint=/v1/search", "api_key=a&endpoint=/v1/search%", "a%zz=1&api_key=b&endpoint=/v1/search"} {
		code, _ := get(q)
		assert.Equal(t, 400, code, q)
	}
	assert.Equal(t, "2", remaining("%25zz"), "a refused query took nothing")
	code, _ := get("api_key=%25zz&endpoint=%2Fv1%2Fsearch")
	assert.Equal(t, 200, code, "well-formed escapes are decoded")
	assert.Equal(t, "1", remaining("%25zz"))

	// cost=0 means 1, as on the wire.
	code, h := get("api_key=c0&endpoint=/v1/search&cost=0")
	assert.Equal(t, 200, code)
	assert.Equal(t, "2", h.Get("X-RateLimit-Remaining"))
	for _, c := range []string{"", "-1", "x", "4294967296", "1.5"} {
		code, _ := get("api_key=cbad&endpoint=/v1/search&cost=" + c)
		assert.Equal(t, 400, code, "cost=%q", c)
	}

	// peek takes only 1, true, 0, false; anything else is refused, never
	// silently consumed.
	for _, v := range []string{"1", "true"} {
		code, _ := get("api_key=p&endpoint=/v1/search&peek=" + v)
		assert.Equal(t, 200, code)
	}
	assert.Equal(t, "2", remaining("p"))
	for _, v := range []string{"0", "false"} {
		code, _ := get("api_key=p&endpoint=/v1/search&peek=" + v)
		assert.Equal(t, 200, code)
	}
	assert.Equal(t, "0", remaining("p"))
	for _, v := range []string{"yes", "", "TRUE", "2", "1&peek=0", "0&peek=1"} {
		code, _ := get("api_key=p2&endpoint=/v1/search&peek=" + v)
		assert.Equal(t, 400, code, "peek=%q", v)
	}
	// A repeated cost is refused too, whatever its values.
	code, _ = get("api_key=p2&endpoint=/v1/search&cost=1&cost=1")
	assert.Equal(t, 400, code, "cost twice")
	assert.Equal(t, "2", remaining("p2"))
}

// TestDrainAnswersEverythingSent: requests a client wrote before the drain
// began are all answered, not only those the daemon had read.
func TestDrainAnswersEverythingSent(t *testing.T) {
	s := start(t, testConfig)
	r := dialRaw(t, s.Socket)
	// One round trip first: the daemon has accepted the connection (one
	// still in the listen backlog when the drain begins is reset, which a
	// client sees as a connection error and retries).
	r.write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpPing, ID: 1}))
	_, err := r.read()
	require.NoError(t, err)
	const n = 5000
	var batch []byte
	for i := range n {
		batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpPing, ID: uint32(i)})
	}
	answered := make(chan int)
	go func() {
		count := 0
		for {
			if _, err := r.read(); err != nil {
				answered <- count
				return
			}
			count++
		}
	}()
	r.write(batch)
	require.NoError(t, s.Stop())
	assert.Equal(t, n, <-answered)
}

// TestTricklingFrameIsCut: a frame whose bytes trickle in is cut
// read_timeout after its first byte, however steadily bytes arrive.
func TestTricklingFrameIsCut(t *testing.T) {
	s := start(t, testConfig+"\n[server]\nread_timeout = \"300ms\"\n")
	r := dialRaw(t, s.Socket)
	f := checkFrame(1, "api_key="+strings.Repeat("k", 200))
	sent := make(chan int, 1)
	go func() {
		i := 0
		for ; i < len(f); i++ {
			if _, err := r.c.Write(f[i : i+1]); err != nil {
				break
			}
			time.Sleep(20 * time.Millisecond) // the trickle itself, not synchronization
		}
		sent <- i
	}()
	_, err := r.read()
	assert.ErrorIs(t, err, io.EOF, "the daemon closes the connection")
	r.c.Close()
	assert.Less(t, <-sent, len(f), "closed before the trickling frame was complete")
}
