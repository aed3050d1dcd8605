package php_test

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/clients/internal/nginxtest"
	"github.com/rld/rld/config"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/derive"
	"github.com/rld/rld/internal/reqcorpus"
	"github.com/rld/rld/wire"
)

// nginxFront sends every path to one PHP page, front.php (the front
// controller of most PHP frameworks), on IPv4 and IPv6 loopback, with the
// two lines docs/clients.md adds to Debian's fastcgi_params: HTTP_HOST is
// the Host header (fastcgi_params has $host, an absolute-form target's
// host), and X-Forwarded-For sent twice reaches PHP joined. Header lines
// up to 32 KB reach PHP (a 20 KB API key is the client's to digest);
// nginx refuses longer ones with 400 (FastCGI cannot carry a parameter
// over 64 KB: nginx would answer 500).
const nginxFront = `
  large_client_header_buffers 4 32k;
  server {
    listen 127.0.0.1:PORT;
    listen [::1]:PORT;
    root @WWW@;
    location / {
      include /etc/nginx/fastcgi_params;
      fastcgi_param HTTP_HOST $http_host;
      fastcgi_param HTTP_X_FORWARDED_FOR $http_x_forwarded_for if_not_empty;
      fastcgi_param SCRIPT_FILENAME @WWW@/@PAGE@;
      fastcgi_param RLD_SOCKET @SOCK@;
      fastcgi_param RLD_CLIENT @CLIENT@;
      fastcgi_param RLD_TIMEOUT 1.0;
      fastcgi_pass unix:@FPMSOCK@;
    }
  }`

// front is nginx + php-fpm serving every path with one page, in front of
// a daemon started with config.
type front struct {
	rld   *daemontest.Process
	fpm   *fpm
	nginx *nginxtest.Nginx
	port  string
}

func startFront(t *testing.T, config, page string) *front {
	t.Helper()
	rld, err := daemontest.StartProcess(config)
	require.NoError(t, err)
	t.Cleanup(rld.Close)
	f := &front{rld: rld, fpm: startFPM(t)}
	www := filepath.Join(phpDir, "testdata", "www")
	f.nginx = nginxtest.Start(t, false, strings.NewReplacer("@WWW@", www, "@PAGE@", page,
		"@FPMSOCK@", f.fpm.sock, "@CLIENT@", filepath.Join(phpDir, "Rld.php"), "@SOCK@", rld.Socket).Replace(nginxFront))
	_, f.port, err = net.SplitHostPort(f.nginx.Addr)
	require.NoError(t, err)
	return f
}

// send writes a raw HTTP/1.1 request (target as given, byte for byte)
// from the loopback address from (127.0.0.x or ::1) and returns the
// answer.
func (f *front) send(t *testing.T, from, target string, hdr ...string) nginxtest.Reply {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	to := "127.0.0.1"
	if strings.Contains(from, ":") {
		to = "::1"
	}
	c, err := d.Dial("tcp", net.JoinHostPort(to, f.port))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	var b strings.Builder
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n", target)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	b.WriteString("\r\n")
	_, err = io.WriteString(c, b.String())
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return nginxtest.Reply{Status: resp.StatusCode, Header: resp.Header, Body: string(body)}
}

// jwt returns a token for claims signed with key (EdDSA).
func jwt(t *testing.T, key ed25519.PrivateKey, claims map[string]any) string {
	t.Helper()
	enc := base64.RawURLEncoding
	p, err := json.Marshal(claims)
	require.NoError(t, err)
	signed := enc.EncodeToString([]byte(`{"alg":"EdDSA","typ":"JWT"}`)) + "." + enc.EncodeToString(p)
	return signed + "." + enc.EncodeToString(ed25519.Sign(key, []byte(signed)))
}

const abuseConfig = `
[request]
descriptors = { api_key = "header:x-api-key", user = "jwt:sub" }

[request.jwt]
keys_file = "@KEYS@"

[[rule]]
name = "perip"
match = { endpoint = "/v1/search" }
by = ["ip"]
limit = 2
period = "1h"

[[rule]]
name = "keyed"
match = { endpoint = "/v1/keyed" }
by = ["api_key"]
limit = 1
period = "1h"

[[rule]]
name = "users"
match = { endpoint = "/v1/me" }
by = ["user"]
limit = 1
period = "1h"
`

// TestPHPRequestCorpus replays clients/testdata/requests.tsv through nginx
// + php-fpm + front.php (Rld.php's attributes()) into a daemon started
// with requests.toml, and compares the descriptors the daemon logged for
// each request with the corpus's.
func TestPHPRequestCorpus(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "decisions.log")
	cfg, err := reqcorpus.Config(`[log]
decisions = "` + logPath + `"
allowed_rate = 1.0
denied_rate = 1.0
denied_per_second = 0
`)
	require.NoError(t, err)
	cases, err := reqcorpus.Load()
	require.NoError(t, err)
	f := startFront(t, cfg, "front.php")
	v4, v6 := net.JoinHostPort("127.0.0.1", f.port), net.JoinHostPort("::1", f.port)
	dl := reqcorpus.DecisionLog{Path: logPath}
	compared, refused := 0, 0
	for _, c := range cases {
		status, err := c.Send(v4, v6, 10*time.Second)
		require.NoError(t, err, c.Name)
		if status >= 400 && status < 500 && status != 403 && status != 429 {
			// nginx refused it before PHP ran.
			require.True(t, c.MayRefuse, "%s (line %d): %d, and the corpus does not allow a refusal", c.Name, c.Line, status)
			refused++
			t.Logf("%s: %d from nginx", c.Name, status)
			continue
		}
		var got []reqcorpus.Logged
		require.Eventually(t, func() bool {
			l, err := dl.Next()
			require.NoError(t, err)
			got = append(got, l...)
			return len(got) > 0
		}, 5*time.Second, time.Millisecond, "%s: no decision logged (status %d)\n%s", c.Name, status, f.fpm.phpLog())
		require.Len(t, got, 1, c.Name)
		if c.Oversize {
			assert.Equal(t, 403, status, c.Name)
			assert.Equal(t, "oversize", got[0].Rule, c.Name)
			assert.Equal(t, "blocked", got[0].Decision, c.Name)
			continue
		}
		assert.Equal(t, 200, status, c.Name)
		want := c.Want
		if c.Repeated {
			want = lastOccurrence(t, c)
		}
		assert.Equal(t, reqcorpus.Lines(want), reqcorpus.Lines(got[0].Descs), "%s (line %d)", c.Name, c.Line)
		compared++
	}
	t.Logf("%d cases: %d compared, %d refused by nginx", len(cases), compared, refused)
	assert.Greater(t, compared, len(cases)*3/4, "most cases reach the daemon")
}

// lastOccurrence returns what rld derives from c as nginx 1.22 passes it
// to PHP: of a header sent more than once, the last occurrence (PHP keeps
// the last FastCGI parameter of a name), except X-Forwarded-For, which
// nginx's $http_x_forwarded_for joins.
func lastOccurrence(t *testing.T, c reqcorpus.Case) []reqcorpus.Desc {
	t.Helper()
	text, err := reqcorpus.Config("")
	require.NoError(t, err)
	cfg, err := config.Parse([]byte(text), "requests.toml")
	require.NoError(t, err)
	d, err := derive.New(cfg.Request)
	require.NoError(t, err)
	var hs []reqcorpus.Header
	for i, h := range c.Headers {
		later := false
		for _, o := range c.Headers[i+1:] {
			later = later || strings.EqualFold(o.Name, h.Name)
		}
		if !later || strings.EqualFold(h.Name, "x-forwarded-for") {
			hs = append(hs, h)
		}
	}
	c.Headers = hs
	var s derive.Scratch
	var want []reqcorpus.Desc
	for _, ds := range d.Derive(c.Attributes(), time.Now(), &s).Descs {
		want = append(want, reqcorpus.Desc{Name: string(ds.Name), Value: string(ds.Value)})
	}
	return want
}

// TestPHPAbuse: through nginx + php-fpm + front.php, an address that a
// per-IP rule refused stays refused whatever it adds to its requests (long
// API keys, odd paths, a spoofed X-Forwarded-For, bearer tokens the daemon
// cannot verify), and requests without an API key share no bucket.
func TestPHPAbuse(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	keys := filepath.Join(t.TempDir(), "keys.pem")
	require.NoError(t, os.WriteFile(keys, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644))
	f := startFront(t, strings.Replace(abuseConfig, "@KEYS@", keys, 1), "front.php")

	const abuser = "127.0.0.7"
	for i := 0; i < 2; i++ {
		r := f.send(t, abuser, "/v1/search")
		require.Equal(t, 200, r.Status, "%s\n%s", r.Body, f.fpm.phpLog())
		assert.Equal(t, "served\n", r.Body)
	}
	r := f.send(t, abuser, "/v1/search")
	require.Equal(t, 429, r.Status, r.Body)
	assert.Contains(t, r.Header.Get("RateLimit"), `"perip"`)

	_, other, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	now := time.Now().Unix()
	forged := jwt(t, other, map[string]any{"sub": "admin", "exp": now + 3600})
	expired := jwt(t, priv, map[string]any{"sub": "admin", "exp": now - 3600})
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"admin"}`)) + "."
	for _, c := range []struct {
		name   string
		target string
		hdr    []string
	}{
		{"2 KB API key", "/v1/search", []string{"X-API-Key", strings.Repeat("k", 2<<10)}},
		{"20 KB API key", "/v1/search", []string{"X-API-Key", strings.Repeat("k", 20<<10)}},
		{"100 KB API key", "/v1/search", []string{"X-API-Key", strings.Repeat("k", 100<<10)}},
		{"100 KB of cookies", "/v1/search", []string{"Cookie", "sid=" + strings.Repeat("c", 100<<10)}},
		{"// leading", "//v1//search", nil},
		{"dot segments", "/v1/./x/../search", nil},
		{"dot segments above the root", "/../v1/search", nil},
		{"matrix parameters and a trailing slash", "/v1;x=1/search/", nil},
		{"percent-encoded slash", "/v1%2Fsearch", nil},
		{"percent-encoded letters", "/v1/%73earch", nil},
		{"a query", "/v1/search?page=2", nil},
		{"absolute form", "http://api.example/v1/search", nil},
		{"spoofed X-Forwarded-For", "/v1/search", []string{"X-Forwarded-For", "198.51.100.9"}},
		{"spoofed X-Real-IP", "/v1/search", []string{"X-Real-IP", "198.51.100.9"}},
		{"spoofed Forwarded", "/v1/search", []string{"Forwarded", "for=198.51.100.9"}},
		{"forged JWT", "/v1/search", []string{"Authorization", "Bearer " + forged}},
		{"expired JWT", "/v1/search", []string{"Authorization", "Bearer " + expired}},
		{"unsigned JWT", "/v1/search", []string{"Authorization", "Bearer " + none}},
		{"everything at once", "//v1/./search/", []string{"X-API-Key", strings.Repeat("k", 5000), "X-Forwarded-For", "198.51.100.9", "Authorization", "Bearer " + forged}},
	} {
		r := f.send(t, abuser, c.target, c.hdr...)
		if r.Status == 429 {
			assert.Contains(t, r.Header.Get("RateLimit"), `"perip"`, c.name)
			continue
		}
		// Only nginx may refuse first (a header line over 32 KB, a path
		// above the root), with 400: never PHP's 2xx or a 5xx.
		nginxRefuses := strings.Contains(c.name, "100 KB") || strings.Contains(c.name, "above the root")
		assert.True(t, nginxRefuses && r.Status == 400, "%s: %d %s (a refused address is never served)", c.name, r.Status, r.Body)
		assert.NotEqual(t, "served\n", r.Body, c.name)
	}
	assert.NotContains(t, f.fpm.phpLog(), "rld: cannot check", "nothing in a request makes the client fail to ask")

	// Another address is not refused: the rule counts per address.
	require.Equal(t, 200, f.send(t, "127.0.0.8", "/v1/search").Status)

	// No API key, no bucket: keyless requests from two addresses, three
	// times each, are served and "keyed" does not apply to them.
	for i := 0; i < 3; i++ {
		for _, from := range []string{"127.0.0.21", "127.0.0.22"} {
			r := f.send(t, from, "/v1/keyed")
			require.Equal(t, 200, r.Status, r.Body)
			assert.Empty(t, r.Header.Get("RateLimit"), "no rule applies to a request without a key")
		}
	}
	// An empty key is no key either.
	r = f.send(t, "127.0.0.23", "/v1/keyed", "X-API-Key", "")
	assert.Equal(t, 200, r.Status, r.Body)
	assert.Empty(t, r.Header.Get("RateLimit"))
	// A key is counted, whoever sends it.
	r = f.send(t, "127.0.0.21", "/v1/keyed", "X-API-Key", "k1")
	require.Equal(t, 200, r.Status, r.Body)
	assert.Contains(t, r.Header.Get("RateLimit"), `"keyed";r=0`)
	r = f.send(t, "127.0.0.22", "/v1/keyed", "X-API-Key", "k1")
	assert.Equal(t, 429, r.Status, r.Body)
	// A long key is counted as its digest, not refused or failed open.
	long := strings.Repeat("L", 5000)
	require.Equal(t, 200, f.send(t, "127.0.0.21", "/v1/keyed", "X-API-Key", long).Status)
	assert.Equal(t, 429, f.send(t, "127.0.0.22", "/v1/keyed", "X-API-Key", long).Status)

	// A verified token's subject is a user; an expired, forged or
	// unsigned one is no user: "users" does not apply to it.
	valid := jwt(t, priv, map[string]any{"sub": "alice", "exp": now + 3600})
	require.Equal(t, 200, f.send(t, "127.0.0.31", "/v1/me", "Authorization", "Bearer "+valid).Status)
	assert.Equal(t, 429, f.send(t, "127.0.0.32", "/v1/me", "Authorization", "Bearer "+valid).Status, "alice counted")
	for _, tok := range []string{forged, expired, none} {
		for i := 0; i < 2; i++ {
			r := f.send(t, "127.0.0.33", "/v1/me", "Authorization", "Bearer "+tok)
			assert.Equal(t, 200, r.Status, r.Body)
			assert.Empty(t, r.Header.Get("RateLimit"), "an unverified token names no user")
		}
	}
}

// TestPHPAttributes: the frame front.php's client would send (attrs.php
// prints it) carries what PHP got, raw, with long values digested, and
// the daemon's decoder reads it.
func TestPHPAttributes(t *testing.T) {
	f := startFront(t, "", "attrs.php")
	digest := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	frame := func(r nginxtest.Reply) map[string]string {
		t.Helper()
		require.Equal(t, 200, r.Status, "%s\n%s", r.Body, f.fpm.phpLog())
		b, err := hex.DecodeString(strings.TrimSpace(r.Body))
		require.NoError(t, err, r.Body)
		var req wire.Request
		require.NoError(t, wire.DecodeRequest(b, &req))
		m := map[string]string{}
		for _, d := range req.Descs {
			_, dup := m[string(d.Name)]
			require.False(t, dup, "%s twice", d.Name)
			m[string(d.Name)] = string(d.Value)
		}
		return m
	}
	key := strings.Repeat("k", 4097)
	target := "//v1//search/./x/../%2F?q=" + strings.Repeat("a", 100)
	got := frame(f.send(t, "127.0.0.9", target, "X-API-Key", key, "X-Forwarded-For", "198.51.100.9",
		"Authorization", "Bearer x.y.z", "X-Other", "not sent"))
	assert.Equal(t, map[string]string{
		":peer":              "127.0.0.9",
		":method":            "GET",
		":host":              "api.example",
		":target":            target,
		":h:x-api-key":       digest(key),
		":h:x-forwarded-for": "198.51.100.9",
		":h:authorization":   "Bearer x.y.z",
		"tenant":             digest(strings.Repeat("t", 2000)),
	}, got)

	// At the limits: a header of 4096 bytes goes as it is; a target of
	// 16384 bytes too, and one byte more is digested.
	long := "/" + strings.Repeat("p", 16383)
	got = frame(f.send(t, "::1", long, "X-API-Key", key[:4096]))
	assert.Equal(t, "::1", got[":peer"])
	assert.Equal(t, key[:4096], got[":h:x-api-key"])
	assert.Equal(t, long, got[":target"])
	got = frame(f.send(t, "::1", long+"p"))
	assert.Equal(t, digest(long+"p"), got[":target"])
	_, ok := got[":h:x-api-key"]
	assert.False(t, ok, "an absent header is not sent")

	// A header sent twice: X-Forwarded-For joined (the nginx config's
	// $http_x_forwarded_for), any other one its last occurrence (PHP).
	got = frame(f.send(t, "127.0.0.9", "/", "X-Forwarded-For", "192.0.2.1", "X-Forwarded-For", "192.0.2.2",
		"X-API-Key", "k1", "X-API-Key", "k2"))
	assert.Equal(t, "192.0.2.1, 192.0.2.2", got[":h:x-forwarded-for"])
	assert.Equal(t, "k2", got[":h:x-api-key"])

	// An absolute-form target: :host is the Host header, not the
	// target's host; nginx's $request_uri is the target's path.
	got = frame(f.send(t, "127.0.0.9", "http://evil.example/v1/login"))
	assert.Equal(t, "api.example", got[":host"])
	assert.Equal(t, "/v1/login", got[":target"])
}
