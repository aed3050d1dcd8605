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

const rldConfig = `
deny = ["ip=203.0.113.66"]

[server]
http_socket = "HTTPSOCK"
trusted_proxies = ["unix"]

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
	for _, f := range []string{"limited", "free", "index.html"} {
		require.NoError(t, os.WriteFile(filepath.Join(www, f), []byte("hello from "+f+"\n"), 0o644))
	}
	recipe, err := os.ReadFile(filepath.Join(nginxtest.RepoDir(), "clients", "nginx", "auth_request.conf"))
	require.NoError(t, err)
	conf := strings.NewReplacer("/run/rld/http.sock", httpSock, "127.0.0.1:8080", "127.0.0.1:PORT", "/var/www/html", www).Replace(string(recipe))
	// The test's client comes from 127.0.0.1: let it name another
	// address, as a load balancer in front of nginx would.
	conf += "\nset_real_ip_from 127.0.0.1;\nreal_ip_header X-Real-IP;\n"
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

	// Another key, and the same endpoint spelled with doubled slashes.
	assert.Equal(t, "4", get(t, n.URL+"//limited", "X-API-Key", "k2").Header.Get("X-RateLimit-Remaining"))

	// Blocked: the deny-listed client address, named by nginx.
	r = get(t, n.URL+"/free", "X-Real-IP", "203.0.113.66")
	assert.Equal(t, 403, r.Status)
	assert.Contains(t, r.Body, "BLOCKED")
	assert.Empty(t, r.Header.Get("Retry-After"))
	assert.Equal(t, 200, get(t, n.URL+"/free", "X-Real-IP", "203.0.113.67").Status)
	r = get(t, n.URL+"/logo.png", "X-Real-IP", "203.0.113.66")
	assert.Equal(t, 403, r.Status)
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"), "a denial is JSON whatever the path's extension")

	// A key that would smuggle a descriptor into the query is refused.
	assert.Equal(t, 403, get(t, n.URL+"/free", "X-API-Key", "k&ip=1.2.3.4").Status)

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
