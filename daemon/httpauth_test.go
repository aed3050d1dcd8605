package daemon_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// authConfig limits each ip to 2 per hour and blocks 203.0.113.66.
const authConfig = `
deny = ["ip=203.0.113.66"]

[server]
http_socket = "HTTPSOCK"
socket_mode = "0620"
TRUST

[[rule]]
name = "per_ip"
by = ["ip"]
limit = 2
period = "1h"
`

// startAuth starts a daemon serving HTTP on TCP and on a Unix socket,
// trusting the proxies listed in trust (TOML array text, "" for none).
func startAuth(t *testing.T, trust string) (tcp, sock string) {
	t.Helper()
	sock = filepath.Join(shortTempDir(t), "http.sock")
	cfg := strings.Replace(authConfig, "HTTPSOCK", sock, 1)
	if trust != "" {
		trust = "trusted_proxies = " + trust
	}
	cfg = strings.Replace(cfg, "TRUST", trust, 1)
	s := start(t, cfg)
	require.Equal(t, sock, s.Daemon.HTTPSocket())
	return s.HTTP, sock
}

// shortTempDir returns a temporary directory with a path short enough
// for a Unix socket.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rldh")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// httpVia returns a client whose connections go to the Unix socket sock,
// or to TCP when sock is "".
func httpVia(sock string) *http.Client {
	tr := &http.Transport{}
	if sock != "" {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
	}
	return &http.Client{Transport: tr}
}

type httpAnswer struct {
	status int
	header http.Header
	body   string
}

func doHTTP(t *testing.T, c *http.Client, url string, hdr ...string) httpAnswer {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return httpAnswer{resp.StatusCode, resp.Header, string(b)}
}

func TestHTTPSocketServesAndIsRemoved(t *testing.T) {
	sock := filepath.Join(shortTempDir(t), "sub", "http.sock")
	s := start(t, strings.NewReplacer("HTTPSOCK", sock, "TRUST", "").Replace(authConfig))
	fi, err := os.Stat(sock)
	require.NoError(t, err, "the socket and its parent directory are created")
	assert.Equal(t, os.FileMode(0o620), fi.Mode().Perm(), "the HTTP socket gets socket_mode")
	c := httpVia(sock)
	a := doHTTP(t, c, "http://rld/healthz")
	assert.Equal(t, 200, a.status)
	a = doHTTP(t, c, "http://rld/v1/check?api_key=k")
	assert.Equal(t, 200, a.status, a.body)
	c.CloseIdleConnections()
	require.NoError(t, s.Stop())
	_, err = os.Stat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist, "shutdown removes the HTTP socket")
}

func TestHTTPClientIPUntrustedPeers(t *testing.T) {
	tcp, sock := startAuth(t, "")
	c := httpVia("")
	// The TCP peer's own address is the ip: X-Real-IP and
	// X-Forwarded-For from an untrusted peer are ignored.
	assert.Equal(t, 200, doHTTP(t, c, "http://"+tcp+"/v1/check", "X-Real-IP", "198.51.100.1").status)
	assert.Equal(t, 200, doHTTP(t, c, "http://"+tcp+"/v1/check", "X-Forwarded-For", "198.51.100.2").status)
	a := doHTTP(t, c, "http://"+tcp+"/v1/check", "X-Real-IP", "198.51.100.3")
	assert.Equal(t, 429, a.status, "all three counted against 127.0.0.1")
	// A deny-listed address in a header does not block an untrusted peer.
	assert.Equal(t, 429, doHTTP(t, c, "http://"+tcp+"/v1/check", "X-Real-IP", "203.0.113.66").status)
	// ip= is refused from an untrusted peer.
	a = doHTTP(t, c, "http://"+tcp+"/v1/check?ip=198.51.100.9")
	assert.Equal(t, 400, a.status)
	assert.Contains(t, a.body, "trusted_proxies")

	// A peer of the Unix socket that is not trusted has no address: no
	// ip descriptor, so the per-ip rule does not apply.
	u := httpVia(sock)
	for i := 0; i < 4; i++ {
		a := doHTTP(t, u, "http://rld/v1/check", "X-Real-IP", "203.0.113.66")
		assert.Equal(t, 200, a.status, a.body)
		assert.Empty(t, a.header.Get("X-RateLimit-Limit"), "no rule applied")
	}
	assert.Equal(t, 400, doHTTP(t, u, "http://rld/v1/check?ip=198.51.100.9").status)
}

func TestHTTPClientIPTrustedPeers(t *testing.T) {
	tcp, sock := startAuth(t, `["127.0.0.1", "10.0.0.0/8", "unix"]`)
	c := httpVia("")
	get := func(hdr ...string) httpAnswer { return doHTTP(t, c, "http://"+tcp+"/v1/check", hdr...) }

	// X-Real-IP names the client.
	assert.Equal(t, "1", get("X-Real-IP", "198.51.100.1").header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, "0", get("X-Real-IP", "198.51.100.1").header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, 429, get("X-Real-IP", "198.51.100.1").status)
	assert.Equal(t, 200, get("X-Real-IP", "198.51.100.2").status, "another client has its own count")
	// X-Real-IP wins over X-Forwarded-For.
	assert.Equal(t, 429, get("X-Real-IP", "198.51.100.1", "X-Forwarded-For", "198.51.100.77").status)

	// X-Forwarded-For: the right-most address that is not a trusted proxy.
	xff := "198.51.100.1, 198.51.100.3, 10.1.2.3"
	assert.Equal(t, "1", get("X-Forwarded-For", xff).header.Get("X-RateLimit-Remaining"), "198.51.100.3 counted")
	assert.Equal(t, "1", get("X-Forwarded-For", "10.0.0.9, 198.51.100.4").header.Get("X-RateLimit-Remaining"), "198.51.100.4 counted")
	assert.Equal(t, "0", get("X-Forwarded-For", "198.51.100.3").header.Get("X-RateLimit-Remaining"))
	// All trusted: the left-most.
	assert.Equal(t, "1", get("X-Forwarded-For", "10.0.0.5, 10.0.0.6").header.Get("X-RateLimit-Remaining"), "10.0.0.5 counted")
	assert.Equal(t, "0", get("X-Forwarded-For", "10.0.0.5").header.Get("X-RateLimit-Remaining"))
	// Garbage from a trusted proxy is a clear 400.
	a := get("X-Forwarded-For", "198.51.100.1, not-an-ip")
	assert.Equal(t, 400, a.status)
	assert.Contains(t, a.body, "not-an-ip")
	assert.Equal(t, 400, get("X-Real-IP", "nope").status)

	// ip= from a trusted peer is taken as is.
	assert.Equal(t, 403, doHTTP(t, c, "http://"+tcp+"/v1/check?ip=203.0.113.66").status)
	// A trusted peer with no header: its own address.
	assert.Equal(t, "1", get().header.Get("X-RateLimit-Remaining"))

	// The Unix socket listed as "unix" is trusted.
	u := httpVia(sock)
	assert.Equal(t, 403, doHTTP(t, u, "http://rld/v1/check", "X-Real-IP", "203.0.113.66").status)
	assert.Equal(t, 429, doHTTP(t, u, "http://rld/v1/check", "X-Real-IP", "198.51.100.1").status)
}

func TestHTTPAuthMode(t *testing.T) {
	_, sock := startAuth(t, `["unix"]`)
	u := httpVia(sock)
	auth := func(ip string) httpAnswer { return doHTTP(t, u, "http://rld/v1/auth?endpoint=/x", "X-Real-IP", ip) }
	for i, rem := range []string{"1", "0"} {
		a := auth("198.51.100.1")
		require.Equal(t, 200, a.status, "request %d", i+1)
		assert.Equal(t, "allowed", a.header.Get("X-RateLimit-Decision"))
		assert.Equal(t, "2", a.header.Get("X-RateLimit-Limit"))
		assert.Equal(t, rem, a.header.Get("X-RateLimit-Remaining"))
		assert.Equal(t, `"per_ip";q=2;w=3600`, a.header.Get("RateLimit-Policy"))
		assert.Empty(t, a.body)
	}
	a := auth("198.51.100.1")
	assert.Equal(t, 403, a.status, "limited is 403 for auth_request")
	assert.Equal(t, "limited", a.header.Get("X-RateLimit-Decision"))
	assert.Regexp(t, `^\d+$`, a.header.Get("Retry-After"))
	assert.NotEqual(t, "0", a.header.Get("Retry-After"))
	assert.Equal(t, "0", a.header.Get("X-RateLimit-Remaining"))
	assert.Regexp(t, `^"per_ip";r=0;t=\d+$`, a.header.Get("RateLimit"))

	a = auth("203.0.113.66")
	assert.Equal(t, 403, a.status)
	assert.Equal(t, "blocked", a.header.Get("X-RateLimit-Decision"))
	assert.Empty(t, a.header.Get("Retry-After"))

	a = doHTTP(t, u, "http://rld/v1/auth?cost=x", "X-Real-IP", "198.51.100.2")
	assert.Equal(t, 400, a.status, "a bad request stays a 400")
}

// TestHTTPCheckMetrics: HTTP checks are timed in
// rld_http_check_duration_seconds, and one refused with 400 is counted in
// rld_http_rejected_total, not among the socket's frame errors.
func TestHTTPCheckMetrics(t *testing.T) {
	tcp, _ := startAuth(t, "")
	c := httpVia("")
	metric := func(series string) float64 {
		t.Helper()
		for _, line := range strings.Split(doHTTP(t, c, "http://"+tcp+"/metrics").body, "\n") {
			if v, ok := strings.CutPrefix(line, series+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				require.NoError(t, err)
				return f
			}
		}
		t.Fatalf("no series %s", series)
		return 0
	}
	timed := metric("rld_http_check_duration_seconds_count")
	rejected := metric("rld_http_rejected_total")
	malformed := metric(`rld_frame_errors_total{code="malformed"}`)
	for range 3 {
		assert.Contains(t, []int{200, 429}, doHTTP(t, c, "http://"+tcp+"/v1/check?endpoint=/m").status, "decided")
	}
	assert.Equal(t, 400, doHTTP(t, c, "http://"+tcp+"/v1/check?endpoint=%zz").status)
	assert.Equal(t, 400, doHTTP(t, c, "http://"+tcp+"/v1/check?cost=x").status)
	assert.Equal(t, timed+3, metric("rld_http_check_duration_seconds_count"))
	assert.Equal(t, rejected+2, metric("rld_http_rejected_total"))
	assert.Equal(t, malformed, metric(`rld_frame_errors_total{code="malformed"}`))
}
