package derive

import (
	"net/netip"
	"unsafe"
)

// parseAddr reads an address as a peer or a forwarding header gives it:
// with or without brackets, with or without a port, IPv4-mapped IPv6
// unmapped, zone dropped. ok is false when s is not an address.
func parseAddr(s []byte) (netip.Addr, bool) {
	t := trimOWS(s)
	if len(t) > 1 && t[0] == '"' && t[len(t)-1] == '"' {
		t = t[1 : len(t)-1]
	}
	if len(t) > 0 && t[0] == '[' {
		end := indexByte(t, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		t = t[1:end]
	} else if i := indexByte(t, ':'); i >= 0 && indexByte(t[i+1:], ':') < 0 {
		t = t[:i] // IPv4 with a port
	}
	if len(t) == 0 {
		return netip.Addr{}, false
	}
	// ParseAddr keeps nothing of its argument but a zone, which is
	// dropped: the bytes need no copy.
	a, err := netip.ParseAddr(unsafe.String(&t[0], len(t)))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}

// clientIP returns the request's client address: the peer, or, when the
// peer is a trusted proxy, the right-most address of the forwarding
// header that is not itself a trusted proxy.
func (d *Deriver) clientIP(peer netip.Addr, hdr []byte) netip.Addr {
	if !d.trusted(peer) || len(hdr) == 0 {
		return peer
	}
	switch d.ipHeader {
	case "x-real-ip":
		if a, ok := parseAddr(hdr); ok {
			return a
		}
		return peer
	case "forwarded":
		return d.walk(peer, hdr, forwardedFor)
	}
	return d.walk(peer, hdr, func(s []byte) []byte { return s })
}

// walk goes through the comma-separated hops of hdr from the right: the
// first one that is not a trusted proxy is the client. A hop that is not
// an address ends the walk: the hop that forwarded it (the last trusted
// one seen) is the client. When every hop is trusted, the left-most is.
func (d *Deriver) walk(peer netip.Addr, hdr []byte, hop func([]byte) []byte) netip.Addr {
	last := peer
	end := len(hdr)
	for end >= 0 {
		i := end - 1
		for i >= 0 && hdr[i] != ',' {
			i--
		}
		item := hdr[i+1 : end]
		end = i
		if len(trimOWS(item)) == 0 {
			continue
		}
		a, ok := parseAddr(hop(item))
		if !ok {
			return last
		}
		if !d.trusted(a) {
			return a
		}
		last = a
		if i < 0 {
			break
		}
	}
	return last
}

// forwardedFor returns the for= parameter of one element of a Forwarded
// header (RFC 7239), or nil.
func forwardedFor(elem []byte) []byte {
	for len(elem) > 0 {
		pair := elem
		if i := indexByte(elem, ';'); i >= 0 {
			pair, elem = elem[:i], elem[i+1:]
		} else {
			elem = nil
		}
		if i := indexByte(pair, '='); i >= 0 && equalFold(trimOWS(pair[:i]), "for") {
			return trimOWS(pair[i+1:])
		}
	}
	return nil
}

// trusted reports whether a is a trusted proxy.
func (d *Deriver) trusted(a netip.Addr) bool {
	for _, p := range d.proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// appendIP appends a, aggregated to the configured prefix, to dst: the
// address itself at full length, else the prefix ("2001:db8::/64").
func (d *Deriver) appendIP(dst []byte, a netip.Addr) []byte {
	bits := d.v6Bits
	if a.Is4() {
		bits = d.v4Bits
	}
	if bits >= a.BitLen() {
		return a.AppendTo(dst)
	}
	p, _ := a.Prefix(bits)
	return p.AppendTo(dst)
}
