// Package nginx_test runs the plain-nginx recipe of docs/clients.md,
// auth_request.conf, in a real nginx against a real rld.
package nginx_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/clients/internal/nginxtest"
	"github.com/rld/rld/daemon/daemontest"
)

// rldConfig: nginx's peer, 127.0.0.1, is a trusted proxy naming the
// client with X-Real-IP; 127.0.0.2 (the abuser) is refused after 3
// requests an hour; /keyed allows 1 an hour per API key.
const rldConfig = `
deny = ["ip=203.0.113.66"]

[server]
http_socket = "HTTPSOCK"
trusted_proxies = ["unix"]

[request]
trusted_proxies = ["127.0.0.1"]
client_ip_header = "x-real-ip"

[request.descriptors]
api_key = "header:x-api-key"

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

[[rule]]
name = "page"
match = { endpoint = "/limited" }
by = ["api_key"]
limit = 5
period = "1h"
`

// get is nginxtest.Get.
func get(t *testing.T, url string, hdr ...string) nginxtest.Reply {
	t.Helper()
	return nginxtest.Get(t, url, hdr...)
}

func TestAuthRequest(t *testing.T) {
	sockDir, err := os.MkdirTemp("", "rldn")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	httpSock := filepath.Join(sockDir, "http.sock")
	p, err := daemontest.StartProcess(strings.Replace(rldConfig, "HTTPSOCK", httpSock, 1))
	require.NoError(t, err)
	t.Cleanup(p.Close)

	www := t.TempDir()
	for _, f := range []string{"limited", "free", "keyed", "index.html"} {
		require.NoError(t, os.WriteFile(filepath.Join(www, f), []byte("hello from "+f+"\n"), 0o644))
	}
	recipe, err := os.ReadFile(filepath.Join(nginxtest.RepoDir(), "clients", "nginx", "auth_request.conf"))
	require.NoError(t, err)
	conf := strings.NewReplacer("/run/rld/http.sock", httpSock, "127.0.0.1:8080", "127.0.0.1:PORT", "/var/www/html", www).Replace(string(recipe))
	// Types by extension, as Debian's nginx.conf sets them: a denial's
	// body is JSON whatever the path.
	conf += "include /etc/nginx/mime.types;\n"
	n := nginxtest.Start(t, false, conf)

	for i := 1; i <= 5; i++ {
		r := get(t, n.URL+"/limited", "X-API-Key", "k1")
		require.Equal(t, 200, r.Status, "request %d: %s\n%s\n%s", i, r.Body, n.ErrorLog(), p.Logs())
		require.NotEmpty(t, r.Header.Get("X-RateLimit-Limit"), "%v\n%s", r.Header, n.ErrorLog())
		assert.Equal(t, "hello from limited\n", r.Body)
		assert.Equal(t, "5", r.Header.Get("X-RateLimit-Limit"))
		assert.Equal(t, strconv.Itoa(5-i), r.Header.Get("X-RateLimit-Remaining"))
		assert.Equal(t, `"page";q=5;w=3600`, r.Header.Get("RateLimit-Policy"))
		assert.Regexp(t, `^"page";r=`+strconv.Itoa(5-i)+`;t=\d+$`, r.Header.Get("RateLimit"))
		assert.Empty(t, r.Header.Get("Retry-After"))
	}
	r := get(t, n.URL+"/limited", "X-API-Key", "k1")
	require.Equal(t, 429, r.Status, r.Body)
	retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After reaches the client")
	assert.True(t, retry >= 1 && retry <= 720, "Retry-After %d", retry)
	assert.Equal(t, "5", r.Header.Get("X-RateLimit-Limit"))
	assert.Equal(t, "0", r.Header.Get("X-RateLimit-Remaining"))
	reset, err := strconv.ParseInt(r.Header.Get("X-RateLimit-Reset"), 10, 64)
	require.NoError(t, err)
	assert.Greater(t, reset, time.Now().Unix())
	assert.Equal(t, `"page";q=5;w=3600`, r.Header.Get("RateLimit-Policy"))
	assert.Regexp(t, `^"page";r=0;t=\d+$`, r.Header.Get("RateLimit"))
	assert.Contains(t, r.Body, "RATE_LIMIT_EXCEEDED")
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"))

	// Another key, and the same endpoint spelled with doubled slashes
	// (rld normalises the raw target).
	assert.Equal(t, "4", get(t, n.URL+"//limited", "X-API-Key", "k2").Header.Get("X-RateLimit-Remaining"))

	// Blocked: the deny-listed client address, named by X-Real-IP from
	// a trusted proxy (the test's client, 127.0.0.1).
	r = get(t, n.URL+"/free", "X-Real-IP", "203.0.113.66")
	assert.Equal(t, 403, r.Status)
	assert.Contains(t, r.Body, "BLOCKED")
	assert.Empty(t, r.Header.Get("Retry-After"))
	assert.Equal(t, 200, get(t, n.URL+"/free", "X-Real-IP", "203.0.113.67").Status)
	r = get(t, n.URL+"/logo.png", "X-Real-IP", "203.0.113.66")
	assert.Equal(t, 403, r.Status)
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"), "a denial is JSON whatever the path's extension")

	// A key holding '&' is a key like any other: nothing goes into a
	// query any more.
	assert.Equal(t, 200, get(t, n.URL+"/free", "X-API-Key", "k&ip=1.2.3.4").Status)

	abuse(t, n)

	// rld down: the recipe fails open.
	p.Kill()
	for i := 0; i < 5; i++ {
		r := get(t, n.URL+"/limited", "X-API-Key", "k1")
		require.Equal(t, 200, r.Status, r.Body)
		assert.Equal(t, "hello from limited\n", r.Body)
	}
	r = get(t, n.URL+"/")
	assert.Equal(t, 200, r.Status, "a directory's index, failing open")
	assert.Equal(t, "hello from index.html\n", r.Body)
	require.NoError(t, p.Restart())
	for i := 1; i <= 5; i++ {
		require.Equal(t, 200, get(t, n.URL+"/limited", "X-API-Key", "k3").Status)
	}
	assert.Equal(t, 429, get(t, n.URL+"/limited", "X-API-Key", "k3").Status)
}

// abuse: an address refused by a per-IP rule (127.0.0.2, an untrusted
// peer) stays refused whatever it adds to the request: long API keys (the
// 100 KB one nginx itself refuses, never 2xx), doubled slashes, dot
// segments, %2F, spoofed X-Forwarded-For, X-Real-IP, Forwarded and
// X-Rld-* fields, a bearer token rld cannot verify, another Host.
// Keyless requests share no bucket: the keyed rule does not apply to
// them, from any address.
func abuse(t *testing.T, n *nginxtest.Nginx) {
	const abuser = "127.0.0.2"
	for i := 1; i <= 3; i++ {
		r := nginxtest.RawFrom(t, abuser, n.Addr, "GET /free HTTP/1.1\r\nHost: h")
		require.Equal(t, 200, r.Status, "request %d: %s\n%s", i, r.Body, n.ErrorLog())
		assert.Equal(t, "3", r.Header.Get("X-RateLimit-Limit"))
	}
	for _, c := range []struct{ name, req string }{
		{"same", "GET /free HTTP/1.1\r\nHost: h"},
		{"2 KB key", "GET /free HTTP/1.1\r\nHost: h\r\nX-API-Key: " + strings.Repeat("a", 2048)},
		{"100 KB key", "GET /free HTTP/1.1\r\nHost: h\r\nX-API-Key: " + strings.Repeat("b", 100<<10)},
		{"doubled slashes", "GET //free HTTP/1.1\r\nHost: h"},
		{"dot segments", "GET /x/../free/./ HTTP/1.1\r\nHost: h"},
		{"percent-encoded slash", "GET /%2Ffree%2F HTTP/1.1\r\nHost: h"},
		{"long path", "GET /" + strings.Repeat("p", 5000) + " HTTP/1.1\r\nHost: h"},
		{"X-Forwarded-For", "GET /free HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 198.51.100.7"},
		{"X-Real-IP", "GET /free HTTP/1.1\r\nHost: h\r\nX-Real-IP: 198.51.100.8"},
		{"Forwarded", "GET /free HTTP/1.1\r\nHost: h\r\nForwarded: for=198.51.100.9"},
		{"X-Rld-Peer", "GET /free HTTP/1.1\r\nHost: h\r\nX-Rld-Peer: 198.51.100.10\r\nX-Rld-Target: /other"},
		{"bearer token", "GET /free HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJ2In0."},
		{"other host", "GET /free HTTP/1.1\r\nHost: other.test"},
		{"a key", "GET /free HTTP/1.1\r\nHost: h\r\nX-API-Key: fresh"},
	} {
		r := nginxtest.RawFrom(t, abuser, n.Addr, c.req)
		assert.True(t, r.Status >= 400 && r.Status < 500, "%s: %d %s", c.name, r.Status, r.Body)
		if r.Status == 429 {
			assert.Contains(t, r.Header.Get("RateLimit"), `"perip"`, c.name)
		} else {
			assert.Contains(t, []int{400, 414, 431, 494}, r.Status, "%s: nginx refused it itself", c.name)
		}
	}
	for _, src := range []string{"127.0.0.3", "127.0.0.4", "127.0.0.3", "127.0.0.4"} {
		r := nginxtest.RawFrom(t, src, n.Addr, "GET /keyed HTTP/1.1\r\nHost: h")
		assert.Equal(t, 200, r.Status, "keyless from %s", src)
		assert.Empty(t, r.Header.Get("RateLimit"), "no rule applies to a keyless request of /keyed")
	}
	r := nginxtest.RawFrom(t, "127.0.0.3", n.Addr, "GET /keyed HTTP/1.1\r\nHost: h\r\nX-API-Key: k1")
	assert.Equal(t, 200, r.Status)
	assert.Contains(t, r.Header.Get("RateLimit"), `"keyed"`)
	assert.Equal(t, 429, nginxtest.RawFrom(t, "127.0.0.4", n.Addr, "GET /keyed HTTP/1.1\r\nHost: h\r\nX-API-Key: k1").Status)
}
