package config

import (
	"fmt"
	"net/netip"
	"strings"
)

// TrustUnix is the entry of server.trusted_proxies that trusts the peers
// of server.http_socket.
const TrustUnix = "unix"

// validateHTTP checks http_socket and trusted_proxies.
func (s *Server) validateHTTP(p *problems) {
	if s.HTTPSocket != "" {
		switch {
		case len(s.HTTPSocket) > MaxSocketPath:
			p.add("server.http_socket = %q: %d bytes, longer than the %d a Unix socket path may have", s.HTTPSocket, len(s.HTTPSocket), MaxSocketPath)
		case s.HTTPSocket == s.Socket:
			p.add("server.http_socket = %q: the same path as server.socket", s.HTTPSocket)
		case strings.ContainsRune(s.HTTPSocket, 0):
			p.add("server.http_socket = %q: contains a NUL byte", s.HTTPSocket)
		}
	}
	for i, t := range s.TrustedProxies {
		if _, err := ParseTrusted(t); err != nil {
			p.add("server.trusted_proxies[%d] = %q: %v", i, t, err)
		}
	}
}

// ParseTrusted parses one entry of server.trusted_proxies: a CIDR
// ("10.0.0.0/8"), a bare address ("127.0.0.1", the same as /32 or /128),
// or "unix", returned as the invalid zero Prefix.
func ParseTrusted(s string) (netip.Prefix, error) {
	if s == TrustUnix {
		return netip.Prefix{}, nil
	}
	if strings.Contains(s, "/") {
		pf, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("not a CIDR such as \"10.0.0.0/8\", an address, or \"unix\": %w", err)
		}
		return pf.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("not a CIDR such as \"10.0.0.0/8\", an address, or \"unix\": %w", err)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}
