package openresty_test

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/clients/internal/nginxtest"
)

// jwtKey is the key the daemon of startLua trusts for bearer tokens.
var jwtKey = sync.OnceValue(func() ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		panic(err)
	}
	return k
})

// jwtPublicPEM is jwtKey's public key as PEM, for request.jwt.keys_file.
func jwtPublicPEM(t *testing.T) []byte {
	der, err := x509.MarshalPKIXPublicKey(jwtKey().Public())
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// token returns an EdDSA JWT for sub expiring at exp, signed with key.
func token(t *testing.T, key ed25519.PrivateKey, sub string, exp time.Time) string {
	enc := base64.RawURLEncoding
	claims, err := json.Marshal(map[string]any{"sub": sub, "exp": exp.Unix()})
	require.NoError(t, err)
	signing := enc.EncodeToString([]byte(`{"alg":"EdDSA","typ":"JWT"}`)) + "." + enc.EncodeToString(claims)
	return signing + "." + enc.EncodeToString(ed25519.Sign(key, []byte(signing)))
}

// TestAttributes: rld.attributes is what nginx saw, raw: the peer, the
// method, the Host header, the target as received (doubled slashes, dot
// segments, %2F), the six default headers when present, several
// occurrences joined with ", " in order, a header found behind 150 others,
// and values past their limit (a 5000-byte API key, a 17000-byte target)
// as sha256:HEX. rld.request_frame is, byte for byte, encode of that list,
// with and without by-hand descriptors (a long one digested too), for
// CHECK, PEEK and ACQUIRE; more than 8 headers is an error.
func TestAttributes(t *testing.T) {
	n := nginxtest.Start(t, true, `
  large_client_header_buffers 4 32k;
  server {
    listen 127.0.0.1:PORT;
    location / {
      content_by_lua_block {
        local rld = require "rld"
        local opts = ({
          default = {},
          two = { headers = { "X-Tenant", "x-api-key" } },
          none = { headers = {} },
          nine = { headers = { "a", "b", "c", "d", "e", "f", "g", "h", "i" } },
          extra = { descriptors = { tier = "free", note = string.rep("n", 1025) } },
          extrafn = { descriptors_fn = function() return { { "user", "u1" } } end },
        })[ngx.req.get_headers()["x-opts"] or "default"]
        local d, err = rld.attributes(opts)
        if not d then
          return ngx.say("error ", err)
        end
        for _, op in ipairs({ 1, 2, 5 }) do
          local got, gerr = rld.request_frame(opts, 7, op, 3)
          local want, werr = rld.encode(7, op, 3, d)
          if got ~= want or gerr ~= werr then
            return ngx.say("differ ", op, ": ", tostring(gerr), " ", tostring(werr))
          end
        end
        for _, p in ipairs(d) do
          ngx.say(p[1], "=", p[2])
        end
      }
    }
  }`)
	key5000 := strings.Repeat("k", 5000)
	sum := sha256.Sum256([]byte(key5000))
	longTarget := "/" + strings.Repeat("t", 16999)
	tsum := sha256.Sum256([]byte(longTarget))
	nsum := sha256.Sum256([]byte(strings.Repeat("n", 1025)))
	var junk strings.Builder
	for i := range 150 {
		fmt.Fprintf(&junk, "\r\nX-Junk-%d: %d", i, i)
	}
	for _, c := range []struct {
		name, src, req string
		want           []string
	}{
		{"plain", "127.0.0.1", "GET /v1/search?q=1 HTTP/1.1\r\nHost: api.test",
			[]string{":peer=127.0.0.1", ":method=GET", ":host=api.test", ":target=/v1/search?q=1"}},
		{"raw target and headers", "127.0.0.3", "DELETE //a/./b/../c%2Fd;p=1?x=%41 HTTP/1.1\r\nHost: API.test:8080\r\nX-API-Key: sk_1\r\n" +
			"Authorization: Bearer abc\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2\r\nX-Real-IP: 3.3.3.3\r\n" +
			"Forwarded: for=4.4.4.4\r\nCookie: a=1\r\nCookie: sid=2\r\nX-Other: o",
			[]string{":peer=127.0.0.3", ":method=DELETE", ":host=API.test:8080", ":target=//a/./b/../c%2Fd;p=1?x=%41",
				":h:x-api-key=sk_1", ":h:authorization=Bearer abc", ":h:x-forwarded-for=1.1.1.1, 2.2.2.2",
				":h:x-real-ip=3.3.3.3", ":h:forwarded=for=4.4.4.4", ":h:cookie=a=1, sid=2"}},
		{"no host", "127.0.0.1", "GET / HTTP/1.0",
			[]string{":peer=127.0.0.1", ":method=GET", ":target=/"}},
		{"long values", "127.0.0.1", "GET " + longTarget + " HTTP/1.1\r\nHost: h\r\nX-API-Key: " + key5000,
			[]string{":peer=127.0.0.1", ":method=GET", ":host=h", ":target=sha256:" + hex.EncodeToString(tsum[:]),
				":h:x-api-key=sha256:" + hex.EncodeToString(sum[:])}},
		{"behind 150 headers", "127.0.0.1", "GET /a HTTP/1.1\r\nHost: h" + junk.String() + "\r\nX-API-Key: hidden",
			[]string{":peer=127.0.0.1", ":method=GET", ":host=h", ":target=/a", ":h:x-api-key=hidden"}},
		{"headers option", "127.0.0.1", "GET /a HTTP/1.1\r\nHost: h\r\nX-Opts: two\r\nX-API-Key: k\r\nX-Tenant: t\r\nCookie: c=1",
			[]string{":peer=127.0.0.1", ":method=GET", ":host=h", ":target=/a", ":h:x-tenant=t", ":h:x-api-key=k"}},
		{"no headers", "127.0.0.1", "GET /a HTTP/1.1\r\nHost: h\r\nX-Opts: none\r\nX-API-Key: k",
			[]string{":peer=127.0.0.1", ":method=GET", ":host=h", ":target=/a"}},
		{"nine headers", "127.0.0.1", "GET /a HTTP/1.1\r\nHost: h\r\nX-Opts: nine",
			[]string{"error headers: 9 names, at most 8"}},
		{"by hand", "127.0.0.1", "GET /a HTTP/1.1\r\nHost: h\r\nX-Opts: extra",
			[]string{":peer=127.0.0.1", ":method=GET", ":host=h", ":target=/a", "note=sha256:" + hex.EncodeToString(nsum[:]), "tier=free"}},
		{"by hand fn", "127.0.0.1", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\nX-Opts: extrafn",
			[]string{":peer=127.0.0.1", ":method=POST", ":host=h", ":target=/a", "user=u1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := nginxtest.RawFrom(t, c.src, n.Addr, c.req)
			require.Equal(t, 200, r.Status, "%s\n%s", r.Body, n.ErrorLog())
			assert.Equal(t, strings.Join(c.want, "\n")+"\n", r.Body)
		})
	}
}

// TestSHA256: rld.sha256_hex, through libcrypto, is Go's SHA-256, and
// rld.digest keeps a value at its limit and digests one byte more.
func TestSHA256(t *testing.T) {
	n := nginxtest.Start(t, true, `
  server {
    listen 127.0.0.1:PORT;
    location / {
      content_by_lua_block {
        local rld = require "rld"
        local n = tonumber(ngx.var.arg_n)
        local v = string.rep("v", n)
        ngx.say(rld.sha256_hex(v), " ", rld.digest(v, 1024))
      }
    }
  }`)
	for _, size := range []int{0, 1, 1024, 1025, 70000} {
		v := strings.Repeat("v", size)
		sum := sha256.Sum256([]byte(v))
		want := hex.EncodeToString(sum[:])
		digest := v
		if size > 1024 {
			digest = "sha256:" + want
		}
		r := get(t, fmt.Sprintf("%s/?n=%d", n.URL, size))
		assert.Equal(t, want+" "+digest+"\n", r.Body, "size %d", size)
	}
}

// TestLuaAbuse: an address refused by a per-IP rule (127.0.0.2, an
// untrusted peer) stays refused whatever it adds to the request: long API
// keys (the 100 KB one nginx itself refuses, never 2xx), doubled slashes,
// dot segments, %2F, spoofed X-Forwarded-For, X-Real-IP and Forwarded, a
// forged and an expired bearer token, another Host. Keyless requests do
// not share a bucket: the keyed rule does not apply to them, from any
// address, while a key is limited.
func TestLuaAbuse(t *testing.T) {
	_, n := startLua(t, "")
	const abuser = "127.0.0.2"
	for i := 1; i <= 3; i++ {
		r := nginxtest.RawFrom(t, abuser, n.Addr, "GET /free HTTP/1.1\r\nHost: h")
		require.Equal(t, 200, r.Status, "request %d: %s\n%s", i, r.Body, n.ErrorLog())
		assert.Equal(t, "3", r.Header.Get("X-RateLimit-Limit"))
	}
	_, wrong, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	forged := token(t, wrong, "victim", time.Now().Add(time.Hour))
	expired := token(t, jwtKey(), "victim", time.Now().Add(-time.Hour))
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
		{"forged JWT", "GET /free HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + forged},
		{"expired JWT", "GET /free HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + expired},
		{"garbage bearer", "GET /free HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + strings.Repeat("x.", 3000)},
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
	assert.NotContains(t, n.ErrorLog(), "rld: cannot check", "no check failed open")

	// Keyless: no shared empty-key bucket; the keyed rule does not apply.
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
