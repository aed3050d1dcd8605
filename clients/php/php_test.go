// Package php_test runs Rld.php in PHP: the golden corpus with the php
// command, and a page under a real nginx + php-fpm against a real rld.
package php_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/clients/internal/nginxtest"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/derive"
)

var (
	repo   = nginxtest.RepoDir()
	corpus = filepath.Join(repo, "clients", "testdata", "golden.tsv")
	phpDir = filepath.Join(repo, "clients", "php")
)

func replay(t *testing.T, path string) (string, error) {
	t.Helper()
	out, err := exec.Command("php", filepath.Join(phpDir, "testdata", "replay.php"), path).CombinedOutput()
	return string(out), err
}

func TestCorpus(t *testing.T) {
	out, err := replay(t, corpus)
	require.NoError(t, err, "Rld.php does not match the golden corpus:\n%s", out)
	require.True(t, strings.HasPrefix(out, "ok "), out)
	t.Log(strings.TrimSpace(out))
}

// TestCorpusGuards: a golden answer with one byte changed makes the
// replay fail.
func TestCorpusGuards(t *testing.T) {
	data, err := os.ReadFile(corpus)
	require.NoError(t, err)
	bad := strings.Replace(string(data), "00000040018100000000000701000000000000001e", "00000040018100000000000701000000000000001f", 1)
	require.NotEqual(t, string(data), bad)
	path := filepath.Join(t.TempDir(), "golden.tsv")
	require.NoError(t, os.WriteFile(path, []byte(bad), 0o644))
	out, err := replay(t, path)
	require.Error(t, err)
	assert.Contains(t, out, "FAIL worked-example limit 31 want 30")
}

const rldConfig = `
deny = ["ip=203.0.113.66"]

[server]
http_socket = "HTTPSOCK"

[request]
trusted_proxies = ["127.0.0.1"]
client_ip_header = "x-real-ip"
descriptors = { api_key = "header:x-api-key" }

[[rule]]
name = "page"
match = { endpoint = "/check.php" }
by = ["api_key"]
limit = 5
period = "1h"

[[rule]]
name = "slot"
match = { endpoint = "/slot.php" }
by = ["api_key"]
algorithm = "concurrency"
limit = 1
timeout = "1m"

[[rule]]
name = "units"
match = { units = "1" }
by = ["api_key"]
limit = 100
period = "1h"
`

// fpm is a running php-fpm.
type fpm struct {
	sock string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startFPM(t *testing.T) *fpm {
	t.Helper()
	dir, err := os.MkdirTemp("", "fpm")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fpm{sock: filepath.Join(dir, "fpm.sock"), dir: dir, done: make(chan struct{})}
	conf := fmt.Sprintf(`[global]
daemonize = no
error_log = %[1]s/fpm.log
[www]
listen = %[1]s/fpm.sock
pm = static
pm.max_children = 2
catch_workers_output = yes
php_admin_flag[log_errors] = on
php_admin_value[error_log] = %[1]s/php.log
php_admin_flag[display_errors] = off
`, dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fpm.conf"), []byte(conf), 0o644))
	f.cmd = exec.Command("php-fpm8.2", "-F", "-R", "-y", filepath.Join(dir, "fpm.conf"))
	f.cmd.Stderr = io.Discard
	// Its own process group, so that the workers die with the master.
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, f.cmd.Start())
	go func() { _ = f.cmd.Wait(); close(f.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-f.cmd.Process.Pid, syscall.SIGKILL)
		<-f.done
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", f.sock); err == nil {
			c.Close()
			return f
		}
		select {
		case <-f.done:
			log, _ := os.ReadFile(filepath.Join(dir, "fpm.log"))
			t.Fatalf("php-fpm exited:\n%s", log)
		default:
		}
		require.True(t, time.Now().Before(deadline), "php-fpm not listening after 10s")
		time.Sleep(10 * time.Millisecond) // polling readiness
	}
}

// PHPLog returns what PHP wrote to its error log.
func (f *fpm) phpLog() string {
	b, _ := os.ReadFile(filepath.Join(f.dir, "php.log"))
	return string(b)
}

// nginxPHP is the nginx configuration of docs/clients.md for PHP-FPM:
// no realip module, the daemon reads X-Real-IP from a trusted proxy.
const nginxPHP = `
  server {
    listen 127.0.0.1:PORT;
    root @WWW@;
    location ~ \.php$ {
      include /etc/nginx/fastcgi_params;
      fastcgi_param HTTP_HOST $http_host;
      fastcgi_param HTTP_X_FORWARDED_FOR $http_x_forwarded_for if_not_empty;
      fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
      fastcgi_param RLD_SOCKET @SOCK@;
      fastcgi_param RLD_CLIENT @CLIENT@;
      fastcgi_param RLD_TIMEOUT 1.0;
      fastcgi_pass unix:@FPMSOCK@;
    }
  }`

type setup struct {
	rld      *daemontest.Process
	httpSock string
	fpm      *fpm
	nginx    *nginxtest.Nginx
}

func start(t *testing.T) *setup {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "rldp")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	s := &setup{httpSock: filepath.Join(sockDir, "http.sock")}
	s.rld, err = daemontest.StartProcess(strings.Replace(rldConfig, "HTTPSOCK", s.httpSock, 1))
	require.NoError(t, err)
	t.Cleanup(s.rld.Close)
	s.fpm = startFPM(t)
	s.nginx = nginxtest.Start(t, false, strings.NewReplacer("@WWW@", filepath.Join(phpDir, "testdata", "www"),
		"@FPMSOCK@", s.fpm.sock, "@CLIENT@", filepath.Join(phpDir, "Rld.php"), "@SOCK@", s.rld.Socket).Replace(nginxPHP))
	return s
}

// accepted returns rld_connections_accepted_total from the daemon's
// /metrics, on its HTTP socket.
func (s *setup) accepted(t *testing.T) int {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", s.httpSock)
	}}}
	resp, err := c.Get("http://rld/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "rld_connections_accepted_total "); ok {
			n, err := strconv.Atoi(v)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no rld_connections_accepted_total in /metrics")
	return 0
}

// get is nginxtest.Get.
func get(t *testing.T, url string, hdr ...string) nginxtest.Reply {
	t.Helper()
	return nginxtest.Get(t, url, hdr...)
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

// sameAsHTTP peeks at key's count with the PHP client (peek.php, through
// Rld::headers) and with the daemon's HTTP endpoint, and requires the same
// six header fields. Time moves between the two asks, so a pair that
// straddles a second is asked again; a wrong rendering differs every time.
func (s *setup) sameAsHTTP(t *testing.T, key string) map[string]string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", s.httpSock)
	}}}
	var mine, theirs map[string]string
	for range 3 {
		r := get(t, s.nginx.URL+"/peek.php?api_key="+key)
		require.Equal(t, 200, r.Status, "%s\n%s", r.Body, s.fpm.phpLog())
		mine = fields(r.Header)
		resp, err := c.Get("http://rld/v1/check?peek=1&api_key=" + key + "&endpoint=/check.php")
		require.NoError(t, err)
		resp.Body.Close()
		theirs = fields(resp.Header)
		if assert.ObjectsAreEqual(mine, theirs) {
			break
		}
	}
	require.Equal(t, theirs, mine, "the PHP client and the HTTP endpoint, for %s", key)
	return mine
}

func sequence(t *testing.T, s *setup, key string) {
	t.Helper()
	for i := 1; i <= 5; i++ {
		r := get(t, s.nginx.URL+"/check.php", "X-API-Key", key)
		require.Equal(t, 200, r.Status, "request %d: %s\n%s\n%s", i, r.Body, s.nginx.ErrorLog(), s.fpm.phpLog())
		assert.Equal(t, "hello from php\n", r.Body)
		assert.Equal(t, "5", r.Header.Get("X-RateLimit-Limit"))
		assert.Equal(t, strconv.Itoa(5-i), r.Header.Get("X-RateLimit-Remaining"))
		assert.Equal(t, `"page";q=5;w=3600`, r.Header.Get("RateLimit-Policy"))
		assert.Regexp(t, `^"page";r=`+strconv.Itoa(5-i)+`;t=\d+$`, r.Header.Get("RateLimit"), "a token bucket knows when the next unit comes back")
		assert.Empty(t, r.Header.Get("Retry-After"))
		h := s.sameAsHTTP(t, key)
		assert.Equal(t, strconv.Itoa(max(0, 4-i)), h["X-RateLimit-Remaining"], "a peek says what a check would leave")
	}
	r := get(t, s.nginx.URL+"/check.php", "X-API-Key", key)
	require.Equal(t, 429, r.Status, r.Body)
	retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.True(t, retry >= 1 && retry <= 720, "Retry-After %d", retry)
	assert.Equal(t, `"page";q=5;w=3600`, r.Header.Get("RateLimit-Policy"))
	assert.Regexp(t, `^"page";r=0;t=\d+$`, r.Header.Get("RateLimit"))
	h := s.sameAsHTTP(t, key)
	assert.NotEmpty(t, h["Retry-After"], "limited")
	assert.Equal(t, "0", r.Header.Get("X-RateLimit-Remaining"))
	reset, err := strconv.ParseInt(r.Header.Get("X-RateLimit-Reset"), 10, 64)
	require.NoError(t, err)
	assert.Greater(t, reset, time.Now().Unix())

	assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
	assert.Contains(t, r.Body, `{"error":{"code":"RATE_LIMIT_EXCEEDED","message":"rate limit \"page\" exceeded; retry after `+strconv.Itoa(retry)+`s","details":{"rule":"page","limit":5,"window_seconds":3600,"retry_after_seconds":`+strconv.Itoa(retry)+`,"reset_at":`)
}

func TestPHPFPM(t *testing.T) {
	s := start(t)
	before := s.accepted(t)
	sequence(t, s, "k1")
	r := get(t, s.nginx.URL+"/check.php", "X-Real-IP", "203.0.113.66")
	assert.Equal(t, 403, r.Status)
	assert.Contains(t, r.Body, "BLOCKED")
	for i := 0; i < 20; i++ {
		require.Equal(t, 200, get(t, s.nginx.URL+"/check.php", "X-API-Key", "k"+strconv.Itoa(10+i)).Status)
	}
	// An error answer other than internal, overloaded or unavailable
	// refuses: a cost above the rule's capacity is never admitted, and
	// does not fail open.
	r = get(t, s.nginx.URL+"/check.php?cost=1000", "X-API-Key", "k9")
	assert.Equal(t, 503, r.Status, r.Body)
	assert.Contains(t, r.Body, "RATE_LIMIT_ERROR")
	assert.Contains(t, s.fpm.phpLog(), "rld: check refused (error answer 6")
	// 28 checks through 2 FPM workers: each keeps its one connection.
	assert.LessOrEqual(t, s.accepted(t)-before, 2, "persistent connections are reused across requests")

	// rld killed: the page fails open with no error in the body; the
	// fail-closed page answers 503.
	s.rld.Kill()
	for i := 0; i < 6; i++ {
		r := get(t, s.nginx.URL+"/check.php", "X-API-Key", "k1")
		require.Equal(t, 200, r.Status, r.Body)
		assert.Equal(t, "hello from php\n", r.Body)
	}
	r = get(t, s.nginx.URL+"/closed.php", "X-API-Key", "k1")
	assert.Equal(t, 503, r.Status)
	assert.Contains(t, r.Body, "RATE_LIMIT_UNAVAILABLE")
	log := s.fpm.phpLog()
	assert.Contains(t, log, "rld: cannot check")
	assert.LessOrEqual(t, strings.Count(log, "rld: cannot check (")-strings.Count(log, "failing closed"), 1,
		"logged at most once per interval:\n%s", log)

	require.NoError(t, s.rld.Restart())
	sequence(t, s, "k2")
}

func TestPHPKillUnderLoad(t *testing.T) {
	s := start(t)
	nginxtest.KillUnderLoad(t, s.nginx.URL+"/check.php", "hello from php\n", 100, 30*time.Second, s.rld.Kill, s.rld.Restart)
}

// TestPHPSlot: slot.php holds rld's one slot per key while it works
// (withSlot): a second request meanwhile gets 429, and the slot is free
// again when the first ends, also when its work threw; a cost known at
// the end is settled (setActualCost).
func TestPHPSlot(t *testing.T) {
	s := start(t)
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", s.httpSock)
	}}}
	// free reports whether the key's slot is free: a check of a
	// concurrency rule looks for one and holds none.
	free := func(key string) bool {
		resp, err := c.Get("http://rld/v1/check?peek=1&endpoint=/slot.php&api_key=" + key)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	slow := make(chan nginxtest.Reply, 1)
	go func() { slow <- nginxtest.Get(t, s.nginx.URL+"/slot.php?ms=3000", "X-API-Key", "s1") }()
	deadline := time.Now().Add(10 * time.Second)
	for free("s1") {
		require.True(t, time.Now().Before(deadline), "the slow request never held its slot")
		time.Sleep(10 * time.Millisecond) // polling for the slot to be taken
	}
	r := get(t, s.nginx.URL+"/slot.php", "X-API-Key", "s1")
	assert.Equal(t, 429, r.Status, r.Body)
	assert.Equal(t, "busy\n", r.Body)
	assert.NotEmpty(t, r.Header.Get("Retry-After"))
	r = <-slow
	require.Equal(t, 200, r.Status, "%s\n%s", r.Body, s.fpm.phpLog())
	assert.Equal(t, "done\n", r.Body)
	assert.True(t, free("s1"), "released when the page ended")

	r = get(t, s.nginx.URL+"/slot.php?fail=1", "X-API-Key", "s1")
	assert.Equal(t, 500, r.Status)
	assert.Contains(t, s.fpm.phpLog(), "the work failed")
	assert.True(t, free("s1"), "released in the finally block")
	r = get(t, s.nginx.URL+"/slot.php", "X-API-Key", "s1")
	assert.Equal(t, 200, r.Status, r.Body)

	// A cost known at the end: acquired at an estimate, settled at the
	// actual cost that the work gave setActualCost().
	units := func(key string) int {
		t.Helper()
		resp, err := c.Get("http://rld/v1/check?peek=1&units=1&api_key=" + key)
		require.NoError(t, err)
		resp.Body.Close()
		n, err := strconv.Atoi(resp.Header.Get("X-RateLimit-Remaining"))
		require.NoError(t, err)
		return n + 1 // the peek counts its unit
	}
	r = get(t, s.nginx.URL+"/slot.php?est=10&actual=25", "X-API-Key", "s2")
	require.Equal(t, 200, r.Status, "%s\n%s", r.Body, s.fpm.phpLog())
	assert.Equal(t, 75, units("s2"), "settled at 25")
	assert.True(t, free("s2"), "the settle gave the slot back")
	r = get(t, s.nginx.URL+"/slot.php?est=10&actual=4&fail=1", "X-API-Key", "s2")
	assert.Equal(t, 500, r.Status)
	assert.Equal(t, 71, units("s2"), "settled at 4 although the work threw after it")
	assert.True(t, free("s2"))
	r = get(t, s.nginx.URL+"/slot.php?est=10", "X-API-Key", "s2")
	require.Equal(t, 200, r.Status, r.Body)
	assert.Equal(t, 61, units("s2"), "no actual cost: released, the estimate stays")
	assert.True(t, free("s2"))
}

// unitOut is what testdata/unit.php prints.
type unitOut struct {
	Attributes [][2]string `json:"attributes"`
	Fit        []string    `json:"fit"`
	Error      *string     `json:"error"`
}

func unit(t *testing.T, in map[string]any) unitOut {
	t.Helper()
	if _, ok := in["fit"]; !ok {
		in["fit"] = [][2]string{}
	}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	cmd := exec.Command("php", filepath.Join(phpDir, "testdata", "unit.php"))
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var u unitOut
	require.NoError(t, json.Unmarshal(out, &u), "%s", out)
	return u
}

// TestPHPUnit: attributes() outside a server (what it reads from
// $_SERVER, the headers option and its checks, the deprecated
// requestDescriptors()) and fit() at every limit, against derive's rule.
func TestPHPUnit(t *testing.T) {
	server := map[string]string{
		"REMOTE_ADDR": "2001:db8::1", "REQUEST_METHOD": "PATCH", "HTTP_HOST": "h:8080", "REQUEST_URI": "/a//b?c=%2F",
		"HTTP_X_API_KEY": "k", "HTTP_COOKIE": "sid=1", "HTTP_X_OTHER": "o", "CONTENT_TYPE": "text/plain", "HTTP_X_EMPTY": "",
	}
	u := unit(t, map[string]any{"server": server, "headers": nil, "extra": map[string]string{"tenant": "t", "plan": "p"}})
	assert.Equal(t, [][2]string{{":peer", "2001:db8::1"}, {":method", "PATCH"}, {":host", "h:8080"}, {":target", "/a//b?c=%2F"},
		{":h:x-api-key", "k"}, {":h:cookie", "sid=1"}, {"plan", "p"}, {"tenant", "t"}}, u.Attributes)

	u = unit(t, map[string]any{"server": server, "headers": []string{"X-Other", "content-type", "x-empty", "x-absent"}})
	assert.Equal(t, [][2]string{{":peer", "2001:db8::1"}, {":method", "PATCH"}, {":host", "h:8080"}, {":target", "/a//b?c=%2F"},
		{":h:x-other", "o"}, {":h:content-type", "text/plain"}, {":h:x-empty", ""}}, u.Attributes, "names lower-cased; absent headers left out")

	u = unit(t, map[string]any{"server": map[string]string{}, "headers": nil})
	assert.Empty(t, u.Attributes, "outside a request: nothing")

	u = unit(t, map[string]any{"server": server, "headers": nil, "apiKeyHeader": "X-Other"})
	assert.Contains(t, u.Attributes, [2]string{":h:x-other", "o"}, "requestDescriptors() adds its header")
	assert.Contains(t, u.Attributes, [2]string{":h:x-api-key", "k"})

	for _, hs := range [][]string{{"a", "b", "c", "d", "e", "f", "g", "h", "i"}, {"x api key"}, {""}, {strings.Repeat("x", 62)}} {
		u = unit(t, map[string]any{"server": server, "headers": hs})
		require.NotNil(t, u.Error, "%q", hs)
	}

	var fit [][2]string
	var want []string
	for _, c := range []struct {
		name  string
		limit int
	}{{":target", derive.MaxTarget}, {":h:x-api-key", derive.MaxHeader}, {":peer", derive.MaxValue}, {":method", derive.MaxValue},
		{":host", derive.MaxValue}, {"api_key", derive.MaxValue}, {"tenant", derive.MaxValue}} {
		for _, n := range []int{0, c.limit, c.limit + 1, 100 << 10} {
			v := strings.Repeat("v", n)
			fit = append(fit, [2]string{c.name, v})
			want = append(want, string(derive.AppendValue(nil, []byte(v), c.limit)))
		}
	}
	u = unit(t, map[string]any{"server": server, "headers": nil, "fit": fit})
	assert.Equal(t, want, u.Fit)
}
