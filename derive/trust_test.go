package derive_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/derive"
)

// TestProxies: server.trusted_proxies parsed; membership by CIDR (mapped
// addresses unmapped), "unix" trusting the HTTP socket's peers, a bad
// entry refused with its index.
func TestProxies(t *testing.T) {
	p, err := derive.ParseProxies([]string{"10.0.0.0/8", "192.0.2.7", "unix"})
	require.NoError(t, err)
	assert.True(t, p.Unix())
	for a, want := range map[string]bool{
		"10.1.2.3": true, "::ffff:10.1.2.3": true, "192.0.2.7": true, "192.0.2.8": false, "2001:db8::1": false,
	} {
		assert.Equal(t, want, p.Contains(netip.MustParseAddr(a)), a)
	}
	none, err := derive.ParseProxies(nil)
	require.NoError(t, err)
	assert.False(t, none.Unix())
	assert.False(t, none.Contains(netip.MustParseAddr("10.0.0.1")))
	_, err = derive.ParseProxies([]string{"10.0.0.0/8", "nope"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `server.trusted_proxies[1] = "nope"`)
}

// TestProxiesForwardedFor: the right-most hop that is not a trusted
// proxy is the client, the left-most when all are; a hop that is not an
// address, or a list of none, is an error.
func TestProxiesForwardedFor(t *testing.T) {
	p, err := derive.ParseProxies([]string{"10.0.0.0/8"})
	require.NoError(t, err)
	for list, want := range map[string]string{
		"203.0.113.9":                         "203.0.113.9",
		"198.51.100.1, 203.0.113.9, 10.0.0.2": "203.0.113.9",
		"10.0.0.3,10.0.0.2":                   "10.0.0.3",
		" ::ffff:203.0.113.9 ":                "203.0.113.9",
	} {
		a, err := p.ForwardedFor(list)
		require.NoError(t, err, list)
		assert.Equal(t, want, a.String(), list)
	}
	for list, msg := range map[string]string{
		"203.0.113.9, junk": `"junk" is not an IP address`,
		",":                 `"" is not an IP address`,
		"":                  "names no address",
	} {
		_, err := p.ForwardedFor(list)
		require.Error(t, err, list)
		assert.Contains(t, err.Error(), msg, list)
	}
}
