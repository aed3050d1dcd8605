package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHTTPSocketAndTrustedProxies(t *testing.T) {
	c, err := Parse([]byte("[server]\nhttp_socket = \"/run/rld/http.sock\"\ntrusted_proxies = [\"unix\", \"127.0.0.1\", \"10.0.0.0/8\", \"::1\"]\n"), "t.toml")
	require.NoError(t, err)
	assert.Equal(t, "/run/rld/http.sock", c.Server.HTTPSocket)
	assert.Equal(t, []string{"unix", "127.0.0.1", "10.0.0.0/8", "::1"}, c.Server.TrustedProxies)

	d, err := Parse(nil, "t.toml")
	require.NoError(t, err)
	assert.Equal(t, "", d.Server.HTTPSocket, "the HTTP socket is off by default")
	assert.Empty(t, d.Server.TrustedProxies, "no peer is trusted by default")

	for _, tc := range []struct{ name, toml, want string }{
		{"long path", "http_socket = \"/" + strings.Repeat("a", 107) + "\"", "longer than the 107"},
		{"same as socket", "socket = \"/tmp/x.sock\"\nhttp_socket = \"/tmp/x.sock\"", "same path as server.socket"},
		{"bad cidr", "trusted_proxies = [\"10.0.0.0/33\"]", `server.trusted_proxies[0] = "10.0.0.0/33"`},
		{"bad address", "trusted_proxies = [\"localhost\"]", `server.trusted_proxies[0] = "localhost"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte("[server]\n"+tc.toml+"\n"), "t.toml")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestParseTrusted(t *testing.T) {
	p, err := ParseTrusted("unix")
	require.NoError(t, err)
	assert.False(t, p.IsValid())
	p, err = ParseTrusted("192.168.1.7/16")
	require.NoError(t, err)
	assert.Equal(t, "192.168.0.0/16", p.String())
	p, err = ParseTrusted("::ffff:127.0.0.1")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1/32", p.String())
}
