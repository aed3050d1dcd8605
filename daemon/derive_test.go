package daemon_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/internal/reqcorpus"
	"github.com/rld/rld/wire"
)

// attrFrame encodes a CHECK of the attributes of c.
func attrFrame(id uint32, c *reqcorpus.Case) []byte {
	attrs := c.Attributes()
	descs := make([]wire.Descriptor, len(attrs))
	for i := range attrs {
		descs[i] = wire.Descriptor(attrs[i])
	}
	return wire.AppendRequest(nil, &wire.Request{Op: wire.OpCheck, ID: id, Cost: 1, Descs: descs})
}

// TestDerivedCorpus sends every request of clients/testdata/requests.tsv
// as attributes over the socket and checks the descriptors the daemon
// decided on, as its decision log shows them.
func TestDerivedCorpus(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "decisions.log")
	cfg, err := reqcorpus.Config(`[log]
decisions = "` + logPath + `"
allowed_rate = 1.0
denied_rate = 1.0
denied_per_second = 0
`)
	require.NoError(t, err)
	s := start(t, cfg)
	cases, err := reqcorpus.Load()
	require.NoError(t, err)
	rc := dialRaw(t, s.Socket)
	dl := reqcorpus.DecisionLog{Path: logPath}
	for i, c := range cases {
		rc.write(attrFrame(uint32(i), &c))
		res := rc.mustRead()
		if c.Oversize {
			assert.Equal(t, wire.StatusBlocked, res.Status, c.Name)
			assert.Equal(t, "oversize", string(res.Rule), c.Name)
		} else {
			assert.Equal(t, wire.StatusAllowed, res.Status, c.Name)
		}
		got := nextLogged(t, &dl)
		require.Len(t, got, 1, c.Name)
		if !c.Oversize {
			assert.Equal(t, reqcorpus.Lines(c.Want), reqcorpus.Lines(got[0].Descs), "%s (line %d)", c.Name, c.Line)
		}
	}
}

// TestAttributesNeverLiftALimit refuses an address by a per-IP rule and
// then sends, from the same peer, requests an abuser would craft: each is
// still refused.
func TestAttributesNeverLiftALimit(t *testing.T) {
	cfg, err := reqcorpus.Config(`
[[rule]]
name = "per-ip"
by = ["ip"]
limit = 1
period = "1h"

[[rule]]
name = "login"
match = { endpoint = "/v1/login" }
by = ["ip"]
limit = 100
period = "1h"

[[rule]]
name = "per-key"
by = ["api_key"]
limit = 1000
period = "1h"
`)
	require.NoError(t, err)
	s := start(t, cfg)
	rc := dialRaw(t, s.Socket)
	base := reqcorpus.Case{Peer: "127.0.0.9", Method: "GET", Host: "api.example.com", Target: "/v1/search"}
	rc.write(attrFrame(1, &base))
	require.Equal(t, wire.StatusAllowed, rc.mustRead().Status)
	rc.write(attrFrame(2, &base))
	require.Equal(t, wire.StatusLimited, rc.mustRead().Status)

	valid := "Bearer eyJhbGciOiJFZERTQSIsImtpZCI6ImNvcnB1cy0xIiwidHlwIjoiSldUIn0.eyJleHAiOjQxMDI0NDQ4MDAsInN1YiI6Im1hbGxvcnkifQ.eGAVvK28JNZJwc0zX9XA0twtFwJG3cdIZrytSAe-6bLyJLpcbFAZXJREu0wlpuIxMOwesU9hYjMOFkKeNnT2Dg"
	abuses := map[string]func(c *reqcorpus.Case){
		"api key 1025 bytes": func(c *reqcorpus.Case) { c.Headers = hdr("X-API-Key", strings.Repeat("a", 1025)) },
		"api key 2 KB":       func(c *reqcorpus.Case) { c.Headers = hdr("X-API-Key", strings.Repeat("b", 2048)) },
		"api key 100 KB":     func(c *reqcorpus.Case) { c.Headers = hdr("X-API-Key", strings.Repeat("c", 100<<10)) },
		"double slash":       func(c *reqcorpus.Case) { c.Target = "//v1//search" },
		"dot segments":       func(c *reqcorpus.Case) { c.Target = "/v1/x/../login/." },
		"encoded slash":      func(c *reqcorpus.Case) { c.Target = "/v1%2Flogin" },
		"nul":                func(c *reqcorpus.Case) { c.Target = "/v1/login\x00" },
		"long query":         func(c *reqcorpus.Case) { c.Target = "/v1/search?q=" + strings.Repeat("q", 15000) },
		"target 20 KB":       func(c *reqcorpus.Case) { c.Target = "/" + strings.Repeat("t", 20<<10) },
		"spoofed xff":        func(c *reqcorpus.Case) { c.Headers = hdr("X-Forwarded-For", "198.51.100.7") },
		"spoofed real ip":    func(c *reqcorpus.Case) { c.Headers = hdr("X-Real-IP", "198.51.100.7") },
		"spoofed forwarded":  func(c *reqcorpus.Case) { c.Headers = hdr("Forwarded", "for=198.51.100.7") },
		"forged jwt":         func(c *reqcorpus.Case) { c.Headers = hdr("Authorization", valid) },
		"huge jwt":           func(c *reqcorpus.Case) { c.Headers = hdr("Authorization", "Bearer "+strings.Repeat("j", 50000)) },
		"many headers": func(c *reqcorpus.Case) {
			for _, n := range reqcorpus.ClientHeaders {
				c.Headers = append(c.Headers, reqcorpus.Header{Name: n, Value: strings.Repeat("h", 30000)})
			}
		},
	}
	id := uint32(10)
	for name, abuse := range abuses {
		c := base
		abuse(&c)
		f := attrFrame(id, &c)
		require.LessOrEqual(t, len(f), wire.MaxFrame, name)
		rc.write(f)
		res := rc.mustRead()
		assert.Equal(t, id, res.ID)
		assert.False(t, res.Status.Allowed(), "%s: %s rule=%s", name, res.Status, res.Rule)
		assert.NotEqual(t, wire.StatusError, res.Status, "%s: %s", name, res.Message)
		id++
	}

	// A keyless request is not counted in a shared empty-key bucket: keyless
	// requests from many addresses are all allowed by per-key's limit of 1000,
	// and the decision log shows no api_key.
	for i := range 5 {
		c := reqcorpus.Case{Peer: "127.0.0." + string(rune('1'+i)), Method: "GET", Host: "h", Target: "/v1/search", Headers: hdr("X-API-Key", "")}
		rc.write(attrFrame(id, &c))
		res := rc.mustRead()
		require.Equal(t, wire.StatusAllowed, res.Status)
		assert.Equal(t, "per-ip", string(res.Rule), "the per-key rule does not apply")
		id++
	}
}

// nextLogged waits for the decision lines written since the last call.
func nextLogged(t *testing.T, dl *reqcorpus.DecisionLog) []reqcorpus.Logged {
	t.Helper()
	var got []reqcorpus.Logged
	require.Eventually(t, func() bool {
		l, err := dl.Next()
		require.NoError(t, err)
		got = append(got, l...)
		return len(got) > 0
	}, 5*time.Second, time.Millisecond)
	return got
}

func hdr(name, value string) []reqcorpus.Header {
	return []reqcorpus.Header{{Name: name, Value: value}}
}

// TestJWTKeysRotateOnReload: a token signed by a key the JWKS file does
// not hold yet gives no claim; once the file holds it, a reload (SIGHUP,
// the configuration itself unchanged) picks it up.
func TestJWTKeysRotateOnReload(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "jwks.json")
	old, oldTok := newJWKS(t, "k-old", "alice")
	require.NoError(t, os.WriteFile(keys, old, 0o644))
	logPath := filepath.Join(dir, "decisions.log")
	s := start(t, `
[request.descriptors]
user = "jwt:sub"
[request.jwt]
keys_file = "`+keys+`"
[log]
decisions = "`+logPath+`"
allowed_rate = 1.0
`)
	dl := reqcorpus.DecisionLog{Path: logPath}
	rc := dialRaw(t, s.Socket)
	user := func(tok string) string {
		c := reqcorpus.Case{Peer: "127.0.0.9", Method: "GET", Target: "/", Headers: hdr("Authorization", "Bearer "+tok)}
		rc.write(attrFrame(1, &c))
		rc.mustRead()
		got := nextLogged(t, &dl)
		for _, d := range got[len(got)-1].Descs {
			if d.Name == "user" {
				return d.Value
			}
		}
		return ""
	}
	assert.Equal(t, "alice", user(oldTok))
	fresh, freshTok := newJWKS(t, "k-new", "bob")
	assert.Equal(t, "", user(freshTok), "a key not in the file yet")
	require.NoError(t, os.WriteFile(keys, fresh, 0o644))
	require.NoError(t, s.Daemon.Reload())
	assert.Equal(t, "bob", user(freshTok), "the rotated key, after a reload")
	assert.Equal(t, "", user(oldTok), "the key rotated out")
}

// TestHTTPAttributes: the HTTP check endpoints take a request's
// attributes from the X-Rld-* fields and the request's own header
// fields, from a trusted peer only, and a long value never makes a 400.
func TestHTTPAttributes(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "decisions.log")
	cfg, err := reqcorpus.Config(`[server]
trusted_proxies = ["127.0.0.1"]
[log]
decisions = "` + logPath + `"
allowed_rate = 1.0
denied_rate = 1.0
denied_per_second = 0
`)
	require.NoError(t, err)
	s := start(t, cfg)
	dl := reqcorpus.DecisionLog{Path: logPath}
	get := func(path string, hdrs ...string) (int, []reqcorpus.Desc) {
		req, err := http.NewRequest("GET", "http://"+s.HTTP+path, nil)
		require.NoError(t, err)
		for i := 0; i+1 < len(hdrs); i += 2 {
			req.Header.Add(hdrs[i], hdrs[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		if resp.StatusCode == http.StatusBadRequest {
			return resp.StatusCode, nil
		}
		got := nextLogged(t, &dl)
		return resp.StatusCode, got[len(got)-1].Descs
	}
	code, descs := get("/v1/auth", "X-Rld-Peer", "127.0.0.5", "X-Rld-Method", "GET", "X-Rld-Host", "Api.Example.com",
		"X-Rld-Target", "//v1/./orders/12?page=3", "X-Forwarded-For", "198.51.100.7", "X-API-Key", "k1", "X-API-Key", "k2")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, reqcorpus.Lines([]reqcorpus.Desc{{Name: "ip", Value: "198.51.100.7"}, {Name: "method", Value: "GET"}, {Name: "host", Value: "api.example.com"},
		{Name: "endpoint", Value: "/v1/orders/{id}"}, {Name: "api_key", Value: "k1, k2"}, {Name: "page", Value: "3"}}), reqcorpus.Lines(descs))

	long := strings.Repeat("k", 20000)
	code, descs = get("/v1/check", "X-Rld-Peer", "127.0.0.9", "X-Rld-Target", "/v1/search", "X-API-Key", long)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, reqcorpus.Lines(descs), `api_key="sha256:`)

	code, descs = get("/v1/check?tenant=" + strings.Repeat("t", 3000))
	require.Equal(t, http.StatusOK, code, "a long query value is digested, not refused")
	assert.Contains(t, reqcorpus.Lines(descs), `tenant="sha256:`)

	code, _ = get("/v1/auth", "X-Rld-Peer", "127.0.0.9", "X-Rld-Target", "/"+strings.Repeat("a", 17000))
	assert.Equal(t, http.StatusForbidden, code, "a target too long to derive is refused")
}

// TestHTTPAttributesUntrusted: a peer not in server.trusted_proxies may
// not send attributes.
func TestHTTPAttributesUntrusted(t *testing.T) {
	s := start(t, testConfig)
	req, err := http.NewRequest("GET", "http://"+s.HTTP+"/v1/check", nil)
	require.NoError(t, err)
	req.Header.Set("X-Rld-Peer", "203.0.113.1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

// TestRuleOnVerifiedClaim: a rule keyed on a JWT claim counts each
// verified subject in a bucket of its own and never counts a token that
// does not verify (per-IP rules still do).
func TestRuleOnVerifiedClaim(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "jwks.json")
	doc, alice := newJWKS(t, "k1", "alice")
	require.NoError(t, os.WriteFile(keys, doc, 0o644))
	_, forged := newJWKS(t, "k1", "alice") // same kid and subject, another key
	s := start(t, `
[request.descriptors]
user = "jwt:sub"
[request.jwt]
keys_file = "`+keys+`"

[[rule]]
name = "per-user"
by = ["user"]
limit = 2
period = "1h"

[[rule]]
name = "per-ip"
by = ["ip"]
limit = 100
period = "1h"
`)
	rc := dialRaw(t, s.Socket)
	check := func(tok string) wire.Response {
		c := reqcorpus.Case{Peer: "127.0.0.9", Method: "GET", Target: "/", Headers: hdr("Authorization", "Bearer "+tok)}
		rc.write(attrFrame(1, &c))
		return rc.mustRead()
	}
	for i := range 2 {
		res := check(alice)
		require.True(t, res.Status.Allowed(), "alice's check %d", i+1)
		assert.Equal(t, "per-user", string(res.Rule))
	}
	res := check(alice)
	assert.Equal(t, wire.StatusLimited, res.Status)
	assert.Equal(t, "per-user", string(res.Rule))
	for range 5 {
		res := check(forged)
		require.Equal(t, wire.StatusAllowed, res.Status, "a forged token is not alice's")
		assert.Equal(t, "per-ip", string(res.Rule), "per-user does not count a token that does not verify")
	}
}
