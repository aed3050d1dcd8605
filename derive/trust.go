package derive

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/rld/rld/config"
)

// Proxies is server.trusted_proxies parsed: the CIDRs of the TCP peers
// whose forwarding headers (and ip= argument) name the client, and
// whether the peers of the HTTP Unix socket are trusted ("unix").
type Proxies struct {
	unix     bool
	prefixes []netip.Prefix
}

// ParseProxies parses the entries of server.trusted_proxies (the forms of
// config.ParseTrusted); an entry that is not one is an error naming it.
func ParseProxies(entries []string) (Proxies, error) {
	var t Proxies
	for i, e := range entries {
		p, err := config.ParseTrusted(e)
		switch {
		case err != nil:
			return Proxies{}, fmt.Errorf("server.trusted_proxies[%d] = %q: %w", i, e, err)
		case !p.IsValid():
			t.unix = true
		default:
			t.prefixes = append(t.prefixes, p)
		}
	}
	return t, nil
}

// Unix reports whether the peers of the HTTP Unix socket are trusted.
func (t *Proxies) Unix() bool { return t.unix }

// Contains reports whether a (IPv4-mapped IPv6 unmapped) is in a trusted
// CIDR.
func (t *Proxies) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ForwardedFor returns the right-most address of an X-Forwarded-For list
// (a trusted proxy's) that is not itself a trusted proxy, or the
// left-most when all are. An item that is not an address, or a list with
// none, is an error: a trusted proxy that sends one is misconfigured.
func (t *Proxies) ForwardedFor(list string) (netip.Addr, error) {
	var last netip.Addr
	for rest := list; rest != ""; {
		i := strings.LastIndexByte(rest, ',')
		item := strings.TrimSpace(rest[i+1:])
		rest = rest[:max(i, 0)]
		a, err := netip.ParseAddr(item)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("X-Forwarded-For %q from a trusted proxy: %q is not an IP address", list, item)
		}
		last = a.Unmap()
		if !t.Contains(last) {
			return last, nil
		}
		if i < 0 {
			break
		}
	}
	if !last.IsValid() {
		return netip.Addr{}, fmt.Errorf("X-Forwarded-For %q from a trusted proxy names no address", list)
	}
	return last, nil
}
