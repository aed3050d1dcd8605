package daemon

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rld/rld/config"
	"github.com/rld/rld/derive"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/policy"
)

// listenHTTPSocket serves the HTTP endpoints on server.http_socket too,
// when it is set, with the same handler as the TCP listener. The socket
// is created like the main one (parent directory, socket_mode) and is
// removed when the HTTP server shuts down.
func (d *Daemon) listenHTTPSocket(srv config.Server) error {
	if srv.HTTPSocket == "" {
		return nil
	}
	ln, err := listenUnix(srv.HTTPSocket, srv.SocketFileMode())
	if err != nil {
		return fmt.Errorf("http_socket: %w", err)
	}
	if d.httpSrv == nil {
		d.httpSrv = d.newHTTPServer()
	}
	d.httpSockLn = ln
	go func() {
		if err := d.httpSrv.Serve(ln); err != nil {
			d.log.Error("http socket server stopped", slog.Any("error", err))
		}
	}()
	return nil
}

// HTTPSocket returns the path of the HTTP Unix socket, or "" when it is
// off or not listening yet.
func (d *Daemon) HTTPSocket() string {
	select {
	case <-d.ready:
	default:
		return ""
	}
	if d.httpSockLn == nil {
		return ""
	}
	return d.cfg().Server.HTTPSocket
}

// addClientIP gives an HTTP check its ip descriptor and returns "" or why
// the request is refused.
//
//   - A peer in server.trusted_proxies (a TCP peer in one of its CIDRs, or
//     a peer of the HTTP socket when it lists "unix") names the client:
//     an ip= query argument wins, then X-Real-IP, then the right-most
//     address of X-Forwarded-For that is not itself a trusted proxy (the
//     left-most when all are). With none of them, a TCP peer's own
//     address is the ip.
//   - Any other peer is the client: its TCP address is the ip (a peer of
//     the Unix socket has none, and the check gets no ip descriptor); an
//     ip= argument is refused, and the headers are ignored.
func (d *Daemon) addClientIP(ctx *fasthttp.RequestCtx, s *httpScratch) string {
	var peer netip.Addr
	trusted := false
	if ta, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		peer, _ = netip.AddrFromSlice(ta.IP)
		peer = peer.Unmap()
		trusted = d.trust.Contains(peer)
	} else {
		trusted = d.trust.Unix()
	}
	for _, ds := range s.descs {
		if string(ds.Name) == "ip" {
			if !trusted {
				return "ip= is accepted only from a peer listed in server.trusted_proxies; other peers are identified by their address"
			}
			return ""
		}
	}
	ip := peer
	if trusted {
		realIP, fwd := forwardHeaders(&ctx.Request.Header)
		if v := realIP; len(v) > 0 {
			a, err := netip.ParseAddr(strings.TrimSpace(string(v)))
			if err != nil {
				return fmt.Sprintf("X-Real-IP %q from a trusted proxy is not an IP address", v)
			}
			ip = a.Unmap()
		} else if v := fwd; len(v) > 0 {
			a, err := d.trust.ForwardedFor(string(v))
			if err != nil {
				return err.Error()
			}
			ip = a
		}
	}
	if !ip.IsValid() {
		return ""
	}
	if len(s.descs) == descriptor.MaxDescriptors {
		return fmt.Sprintf("too many descriptors (at most %d, the client's ip included)", descriptor.MaxDescriptors)
	}
	start := len(s.vals)
	s.vals = ip.AppendTo(s.vals)
	s.descs = append(s.descs, descriptor.Descriptor{Name: ipName, Value: s.vals[start:len(s.vals):len(s.vals)]})
	return ""
}

var ipName = []byte("ip")

// forwardHeaders returns the X-Real-IP and X-Forwarded-For fields, their
// names matched in any case (the server keeps names as sent).
func forwardHeaders(h *fasthttp.RequestHeader) (realIP, fwd []byte) {
	for k, v := range h.All() {
		switch {
		case bytes.EqualFold(k, xRealIP):
			realIP = v
		case bytes.EqualFold(k, xForwardedFor):
			if len(fwd) > 0 {
				// Several fields make one list, in order.
				fwd = append(append(append([]byte(nil), fwd...), ','), v...)
			} else {
				fwd = v
			}
		}
	}
	return realIP, fwd
}

var (
	xRealIP       = []byte("X-Real-IP")
	xForwardedFor = []byte("X-Forwarded-For")
)

// writeAuth answers a check of /v1/auth, for nginx's auth_request, which
// passes only 2xx, 401 and 403: 200 when allowed, 403 otherwise, with the
// same rate-limit header fields as /v1/check and X-RateLimit-Decision
// (allowed, allowed-degraded, limited, blocked or error) saying which.
// The body is empty: nginx discards a subrequest's body.
func (d *Daemon) writeAuth(ctx *fasthttp.RequestCtx, s *httpScratch, now time.Time, dec *policy.Decision) {
	setDecisionHeaders(ctx, s, now, dec)
	switch dec.Status {
	case policy.StatusAllowed, policy.StatusAllowedDegraded:
		ctx.SetStatusCode(fasthttp.StatusOK)
	default:
		if dec.Status == policy.StatusError {
			ctx.Response.Header.Set("X-RateLimit-Error", dec.Code.String())
		}
		ctx.SetStatusCode(fasthttp.StatusForbidden)
	}
}

// maxHTTPHeaders bounds the header of a request to the HTTP endpoints.
const maxHTTPHeaders = 128 << 10

// The header fields that carry a request's attributes to the HTTP check
// endpoints (an nginx auth_request subrequest sets them), and the header
// fields of the request itself that derivation reads, passed on as they
// came.
var (
	hdrRldPeer   = []byte("X-Rld-Peer")
	hdrRldMethod = []byte("X-Rld-Method")
	hdrRldHost   = []byte("X-Rld-Host")
	hdrRldTarget = []byte("X-Rld-Target")
)

// addAttributes reads the attributes of the request that an HTTP check
// is made for, when it carries any (the X-Rld-* fields), into s.in: the
// query's descriptors, then :peer, :method, :host, :target from the
// X-Rld-* fields and a :h: attribute for each header field derivation
// reads (several fields of one name joined by ", "). Only a peer in
// server.trusted_proxies may send attributes.
func (d *Daemon) addAttributes(ctx *fasthttp.RequestCtx, s *httpScratch) (bool, string) {
	h := &ctx.Request.Header
	found := false
	for k := range h.AllInOrder() {
		if isRldAttr(k) {
			found = true
			break
		}
	}
	if !found {
		return false, ""
	}
	if !d.trustedPeer(ctx) {
		return false, "X-Rld-* attributes are accepted only from a peer listed in server.trusted_proxies"
	}
	s.in = append(s.in[:0], s.descs...)
	add := func(name string, start int) {
		s.in = append(s.in, descriptor.Descriptor{Name: []byte(name), Value: s.avals[start:len(s.avals):len(s.avals)]})
	}
	for k, v := range h.AllInOrder() {
		var name string
		limit := derive.MaxValue
		switch {
		case bytes.EqualFold(k, hdrRldPeer):
			name = derive.AttrPeer
		case bytes.EqualFold(k, hdrRldMethod):
			name = derive.AttrMethod
		case bytes.EqualFold(k, hdrRldHost):
			name = derive.AttrHost
		case bytes.EqualFold(k, hdrRldTarget):
			name, limit = derive.AttrTarget, derive.MaxTarget
		default:
			continue
		}
		start := len(s.avals)
		s.avals = derive.AppendValue(s.avals, v, limit)
		add(name, start)
	}
	for _, name := range d.dv().Headers() {
		start, n := len(s.avals), 0
		var joined []byte
		for k, v := range h.AllInOrder() {
			if !equalFoldString(k, name) {
				continue
			}
			if n > 0 {
				joined = append(joined, ", "...)
			}
			joined = append(joined, v...)
			n++
		}
		if n == 0 {
			continue
		}
		s.avals = derive.AppendValue(s.avals, joined, derive.MaxHeader)
		add(derive.AttrHeaderPrefix+name, start)
	}
	return true, ""
}

// isRldAttr reports whether k is one of the X-Rld-* attribute fields.
func isRldAttr(k []byte) bool {
	return bytes.EqualFold(k, hdrRldPeer) || bytes.EqualFold(k, hdrRldMethod) ||
		bytes.EqualFold(k, hdrRldHost) || bytes.EqualFold(k, hdrRldTarget)
}

func equalFoldString(b []byte, s string) bool {
	return len(b) == len(s) && strings.EqualFold(string(b), s)
}

// trustedPeer reports whether the HTTP request's peer is in
// server.trusted_proxies.
func (d *Daemon) trustedPeer(ctx *fasthttp.RequestCtx) bool {
	if ta, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		peer, _ := netip.AddrFromSlice(ta.IP)
		return d.trust.Contains(peer.Unmap())
	}
	return d.trust.Unix()
}

// bearerToken returns the token of an Authorization field value of the
// Bearer scheme, whose name is case-insensitive (RFC 9110 §11.1): "Bearer
// T", "bearer T" and "BEARER  T" all give T. It reports false for another
// scheme, or no token.
func bearerToken(auth []byte) (string, bool) {
	const scheme = "bearer"
	if len(auth) <= len(scheme) || !equalFoldString(auth[:len(scheme)], scheme) ||
		(auth[len(scheme)] != ' ' && auth[len(scheme)] != '\t') {
		return "", false
	}
	tok := strings.Trim(string(auth[len(scheme):]), " \t")
	return tok, tok != ""
}
