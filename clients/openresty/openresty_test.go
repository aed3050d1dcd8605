package openresty_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/clients/internal/nginxtest"
	"github.com/rld/rld/daemon/daemontest"
)

var (
	repo   = nginxtest.RepoDir()
	corpus = filepath.Join(repo, "clients", "testdata", "golden.tsv")
)

// replay runs the corpus at path through rld.lua inside nginx and returns
// what the replay script printed.
func replay(t *testing.T, path string) string {
	t.Helper()
	n := nginxtest.Start(t, true, `
  server {
    listen 127.0.0.1:PORT;
    location /corpus {
      default_type text/plain;
      set $corpus `+path+`;
      content_by_lua_file `+repo+`/clients/openresty/testdata/replay.lua;
    }
  }`)
	resp, err := http.Get(n.URL + "/corpus")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, 200, resp.StatusCode, "%s\n%s", b, n.ErrorLog())
	return string(b)
}

func TestCorpus(t *testing.T) {
	out := replay(t, corpus)
	require.True(t, strings.HasPrefix(out, "ok "), "rld.lua does not match the golden corpus:\n%s", out)
	t.Log(strings.TrimSpace(out))
}

// TestCorpusGuards: a golden answer with one byte changed makes the
// replay fail.
func TestCorpusGuards(t *testing.T) {
	data, err := os.ReadFile(corpus)
	require.NoError(t, err)
	lines := strings.Split(string(data), "\n")
	changed := false
	for i, l := range lines {
		f := strings.Split(l, "\t")
		if f[0] == "decode" && f[1] == "worked-example" {
			// The limit, 30 (0x1e), becomes 31.
			f[2] = strings.Replace(f[2], "000000000000001e", "000000000000001f", 1)
			lines[i] = strings.Join(f, "\t")
			changed = true
		}
	}
	require.True(t, changed)
	bad := filepath.Join(t.TempDir(), "golden.tsv")
	require.NoError(t, os.WriteFile(bad, []byte(strings.Join(lines, "\n")), 0o644))
	out := replay(t, bad)
	assert.Contains(t, out, "FAIL worked-example limit 31 want 30")
}

// rldConfig limits /limited to 5 per hour per API key, blocks one IP,
// refuses 127.0.0.2 (the abuser) after 3 requests an hour, and limits
// /keyed to 1 per hour per API key. nginx's peer, 127.0.0.1, is a
// trusted proxy naming the client with X-Real-IP.
const rldConfig = `
deny = ["ip=203.0.113.66"]

[server]
http_socket = "HTTPSOCK"

[request]
trusted_proxies = ["127.0.0.1"]
client_ip_header = "x-real-ip"

[request.descriptors]
api_key = "header:x-api-key"
user = "jwt:sub"

[request.jwt]
keys_file = "KEYS"

[[rule]]
name = "page"
match = { endpoint = "/limited" }
by = ["api_key"]
limit = 5
period = "1h"

[[rule]]
name = "export"
match = { endpoint = "/export" }
by = ["api_key"]
algorithm = "concurrency"
limit = 2
timeout = "1m"

[[rule]]
name = "perip"
match = { ip = "127.0.0.2" }
by = ["ip"]
limit = 3
period = "1h"

[[rule]]
name = "keyed"
match = { endpoint = "/keyed" }
by = ["api_key"]
limit = 1
period = "1h"
`

// get is nginxtest.Get.
func get(t *testing.T, url string, hdr ...string) nginxtest.Reply {
	t.Helper()
	return nginxtest.Get(t, url, hdr...)
}

// www makes a document root holding the static files the tests fetch.
func www(t *testing.T) string {
	dir := t.TempDir()
	for _, f := range []string{"limited", "closed", "free", "keyed"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("hello from "+f+"\n"), 0o644))
	}
	return dir
}

// peekLocation renders, with rld.headers, the answer of a PEEK for the
// rule "page" (api_key from the query), for comparing with the daemon's
// HTTP endpoint.
const peekLocation = `
    location = /rld-peek {
        content_by_lua_block {
            local rld = require "rld"
            local res, err = rld.new{ socket = "unix:/run/rld/rld.sock", timeout = 1000, pipeline = false }:peek(
                { { "api_key", ngx.var.arg_api_key }, { "endpoint", "/limited" } })
            if not res then
                ngx.status = 500
                return ngx.say(err)
            end
            local h = rld.headers(res)
            for i = 1, #h do
                ngx.header[h[i]] = h[h[i]]
            end
            ngx.say(res.status_name)
        }
    }

    # How many checks`

// lua is a running nginx with the recipe, and the rld it asks.
type lua struct {
	*nginxtest.Nginx
	httpSock string
}

// startLua starts rld and nginx with the recipe; extra is added to each
// access call's options. The recipe's application (/export) is backend,
// or nothing when it is "".
func startLua(t *testing.T, extra string, backend ...string) (*daemontest.Process, *lua) {
	sockDir, err := os.MkdirTemp("", "rldh")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	httpSock := filepath.Join(sockDir, "http.sock")
	keys := filepath.Join(sockDir, "jwt.pem")
	require.NoError(t, os.WriteFile(keys, jwtPublicPEM(t), 0o644))
	p, err := daemontest.StartProcess(strings.NewReplacer("HTTPSOCK", httpSock, "KEYS", keys).Replace(rldConfig))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	recipe, err := os.ReadFile(filepath.Join(repo, "clients", "openresty", "nginx.conf"))
	require.NoError(t, err)
	// The recipe, with the test's paths and port, and a timeout for a
	// shared machine.
	app := "127.0.0.1:1"
	if len(backend) > 0 {
		app = backend[0]
	}
	conf := strings.NewReplacer("/run/rld/rld.sock", p.Socket, "/var/www/html", www(t), "127.0.0.1:8081", app,
		"127.0.0.1:8080", "127.0.0.1:PORT", "timeout = 100,", "timeout = 1000, log_interval = 60,"+extra,
		"    # How many checks", peekLocation).Replace(string(recipe))
	n := nginxtest.Start(t, true, strings.ReplaceAll(conf, "/run/rld/rld.sock", p.Socket))
	return p, &lua{n, httpSock}
}

// fieldNames are the rate-limit header fields of docs/protocol.md.
var fieldNames = []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit", "Retry-After"}

func fields(h http.Header) map[string]string {
	m := map[string]string{}
	for _, name := range fieldNames {
		if v := h.Get(name); v != "" {
			m[name] = v
		}
	}
	return m
}

// sameAsHTTP peeks at key's count with rld.lua (rld.headers) and with
// the daemon's HTTP endpoint, and requires the same six header fields.
// Time moves between the two asks, so a pair that straddles a second is
// asked again; a wrong rendering differs every time.
func sameAsHTTP(t *testing.T, n *lua, key string) map[string]string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", n.httpSock)
	}}}
	var mine, theirs map[string]string
	for range 3 {
		r := get(t, n.URL+"/rld-peek?api_key="+key)
		require.Equal(t, 200, r.Status, r.Body)
		mine = fields(r.Header)
		resp, err := c.Get("http://rld/v1/check?peek=1&api_key=" + key + "&endpoint=/limited")
		require.NoError(t, err)
		resp.Body.Close()
		theirs = fields(resp.Header)
		if assert.ObjectsAreEqual(mine, theirs) {
			break
		}
	}
	require.Equal(t, theirs, mine, "rld.lua and the HTTP endpoint, for %s", key)
	return mine
}

// sequence asserts that key gets exactly 5 × 200, then 429 with the
// headers.
func sequence(t *testing.T, n *lua, key string) {
	t.Helper()
	for i := 1; i <= 5; i++ {
		r := get(t, n.URL+"/limited", "X-API-Key", key)
		require.Equal(t, 200, r.Status, "request %d: %s\n%s", i, r.Body, n.ErrorLog())
		assert.Equal(t, "hello from limited\n", r.Body)
		assert.Equal(t, "5", r.Header.Get("X-RateLimit-Limit"))
		assert.Equal(t, strconv.Itoa(5-i), r.Header.Get("X-RateLimit-Remaining"))
		assert.Equal(t, `"page";q=5;w=3600`, r.Header.Get("RateLimit-Policy"))
		assert.Regexp(t, `^"page";r=`+strconv.Itoa(5-i)+`;t=\d+$`, r.Header.Get("RateLimit"), "a token bucket knows when the next unit comes back")
		assert.Empty(t, r.Header.Get("Retry-After"))
		h := sameAsHTTP(t, n, key)
		assert.Equal(t, strconv.Itoa(max(0, 4-i)), h["X-RateLimit-Remaining"], "a peek says what a check would leave")
	}
	r := get(t, n.URL+"/limited", "X-API-Key", key)
	require.Equal(t, 429, r.Status, "request 6: %s", r.Body)
	assert.Equal(t, "5", r.Header.Get("X-RateLimit-Limit"))
	assert.Equal(t, "0", r.Header.Get("X-RateLimit-Remaining"))
	reset, err := strconv.ParseInt(r.Header.Get("X-RateLimit-Reset"), 10, 64)
	require.NoError(t, err)
	now := time.Now().Unix()
	assert.True(t, reset > now && reset <= now+3600+2, "X-RateLimit-Reset %d is a Unix time within the hour", reset)
	assert.Equal(t, `"page";q=5;w=3600`, r.Header.Get("RateLimit-Policy"))
	retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.True(t, retry >= 1 && retry <= 720, "Retry-After %d: one token of 5 per hour", retry)
	assert.Regexp(t, `^"page";r=0;t=\d+$`, r.Header.Get("RateLimit"))
	h := sameAsHTTP(t, n, key)
	assert.NotEmpty(t, h["Retry-After"], "limited")
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
	assert.Contains(t, r.Body, `{"error":{"code":"RATE_LIMIT_EXCEEDED","message":"rate limit \"page\" exceeded; retry after `+strconv.Itoa(retry)+`s","details":{"rule":"page","limit":5,"window_seconds":3600,"retry_after_seconds":`+strconv.Itoa(retry)+`,"reset_at":`)
}

func TestLuaAccess(t *testing.T) {
	for _, mode := range []string{"pipeline = true,", "pipeline = false,"} {
		t.Run(strings.TrimSuffix(mode, ","), func(t *testing.T) { testLuaAccess(t, mode) })
	}
}

func testLuaAccess(t *testing.T, mode string) {
	p, n := startLua(t, mode)
	sequence(t, n, "k1")
	// Another key has its own count; a path with doubled slashes and a
	// query is the same endpoint.
	r := get(t, n.URL+"//limited?x=1", "X-API-Key", "k2")
	assert.Equal(t, 200, r.Status)
	assert.Equal(t, "4", r.Header.Get("X-RateLimit-Remaining"))

	// The deny-listed IP (through set_real_ip_from / real_ip_header) is
	// blocked.
	r = get(t, n.URL+"/free", "X-Real-IP", "203.0.113.66")
	assert.Equal(t, 403, r.Status)
	assert.Equal(t, `{"error":{"code":"BLOCKED","message":"request blocked by the deny list"}}`+"\n", r.Body)
	r = get(t, n.URL+"/free", "X-Real-IP", "203.0.113.67")
	assert.Equal(t, 200, r.Status)
	assert.Empty(t, r.Header.Get("X-RateLimit-Limit"), "no rule applies to /free")
	assert.Equal(t, "0\n", get(t, n.URL+"/rld-failures").Body)

	// rld killed: the location fails open, with the page and no error.
	p.Kill()
	for i := 0; i < 10; i++ {
		r := get(t, n.URL+"/limited", "X-API-Key", "k1")
		require.Equal(t, 200, r.Status, r.Body)
		assert.Equal(t, "hello from limited\n", r.Body)
		assert.Empty(t, r.Header.Get("X-RateLimit-Limit"))
	}
	// The fail-closed location answers its status.
	r = get(t, n.URL+"/closed", "X-API-Key", "k1")
	assert.Equal(t, 503, r.Status)
	assert.Contains(t, r.Body, "RATE_LIMIT_UNAVAILABLE")
	assert.Equal(t, "11\n", get(t, n.URL+"/rld-failures").Body, "every failure counted in the shared dict")
	assert.Equal(t, 1, strings.Count(n.ErrorLog(), "rld: cannot check"), "logged once per interval:\n%s", n.ErrorLog())
	// nginx logs each failed connect itself: after one, the worker's
	// checks fail at once for reconnect_after (200 ms) without a connect,
	// so the 11 failures made fewer connects (and error lines) than 11.
	connects := strings.Count(n.ErrorLog(), "connect() to unix:")
	assert.True(t, connects >= 1 && connects < 11, "%d failed connects logged for 11 failures:\n%s", connects, n.ErrorLog())

	// rld again on the same socket: limits apply again, nginx untouched,
	// once a connect is tried again.
	require.NoError(t, p.Restart())
	deadline := time.Now().Add(10 * time.Second)
	for get(t, n.URL+"/limited", "X-API-Key", "probe").Header.Get("X-RateLimit-Limit") == "" {
		require.True(t, time.Now().Before(deadline), "rld's answers back within 10 s:\n%s", n.ErrorLog())
		time.Sleep(20 * time.Millisecond) // polling: the worker connects again after reconnect_after
	}
	sequence(t, n, "k3")
	assert.Equal(t, 200, get(t, n.URL+"/closed", "X-API-Key", "k1").Status)
}

// TestLuaKillUnderLoad: in both connection modes, while requests flow, rld is SIGKILLed and
// restarted; nginx never answers 5xx.
func TestLuaKillUnderLoad(t *testing.T) {
	for _, mode := range []string{"pipeline = true,", "pipeline = false,"} {
		t.Run(strings.TrimSuffix(mode, ","), func(t *testing.T) { testLuaKillUnderLoad(t, mode) })
	}
}

func testLuaKillUnderLoad(t *testing.T, mode string) {
	p, n := startLua(t, mode)
	nginxtest.KillUnderLoad(t, n.URL+"/free", "hello from free\n", 200, 20*time.Second, p.Kill, p.Restart)
}

// TestLuaConcurrency: the recipe's /export holds one of rld's two slots
// per API key from access to log phase. With a slow application, the
// third concurrent request gets 429; the slots come back when the
// requests end, and when a client aborts its request.
func TestLuaConcurrency(t *testing.T) {
	// The application answers once the gate in force is closed.
	var gate atomic.Pointer[chan struct{}]
	first := make(chan struct{})
	gate.Store(&first)
	var entered atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		select {
		case <-*gate.Load():
		case <-r.Context().Done(): // nginx gave up on it
		}
		io.WriteString(w, "exported\n")
	}))
	t.Cleanup(app.Close)
	_, n := startLua(t, "", strings.TrimPrefix(app.URL, "http://"))
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", n.httpSock)
	}}}
	// free returns how many of key's slots are free, from the daemon:
	// its checks hold none.
	free := func(key string) int {
		resp, err := c.Get("http://rld/v1/check?peek=1&endpoint=/export&api_key=" + key)
		require.NoError(t, err)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0
		}
		r, err := strconv.Atoi(resp.Header.Get("X-RateLimit-Remaining"))
		require.NoError(t, err)
		return r + 1 // a peek counts the slot it would take
	}
	waitFree := func(key string, want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for free(key) != want {
			require.True(t, time.Now().Before(deadline), "%s: %d slots free, want %d\n%s", key, free(key), want, n.ErrorLog())
			time.Sleep(10 * time.Millisecond) // polling: the log phase releases in a timer
		}
	}

	// Two slow requests hold both slots: the third gets 429.
	done := make(chan nginxtest.Reply, 2)
	for range 2 {
		go func() { done <- nginxtest.Get(t, n.URL+"/export", "X-API-Key", "e1") }()
	}
	waitFree("e1", 0)
	r := get(t, n.URL+"/export", "X-API-Key", "e1")
	assert.Equal(t, 429, r.Status, r.Body)
	assert.Equal(t, "2", r.Header.Get("X-RateLimit-Limit"))
	assert.Equal(t, "60", r.Header.Get("Retry-After"))
	assert.Equal(t, int64(2), entered.Load(), "the refused request never reached the application")
	close(first)
	for range 2 {
		r := <-done
		assert.Equal(t, 200, r.Status, r.Body)
		assert.Equal(t, "exported\n", r.Body)
	}
	waitFree("e1", 2)

	// A client that aborts its request gives its slot back.
	second := make(chan struct{})
	gate.Store(&second)
	defer close(second)
	ctx, cancel := context.WithCancel(context.Background())
	aborted := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", n.URL+"/export", nil)
		req.Header.Set("X-API-Key", "e2")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		aborted <- err
	}()
	waitFree("e2", 1)
	cancel()
	require.Error(t, <-aborted)
	waitFree("e2", 2)
}
