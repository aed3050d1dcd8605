// Package derive turns a request's raw attributes — the peer address,
// method, host, raw target and named headers that a client sends as
// ":"-named descriptors (see wire.IsAttr) — into the descriptors the rules
// match on: ip, method, host, endpoint and those that rld.toml's
// [request.descriptors] names. It is the one place where a request is
// read; policy never sees a raw request.
//
// Whatever the attributes hold, derivation yields descriptors: a long
// value is replaced by its digest (see AppendValue), an absent or empty
// source yields no descriptor, malformed encodings are normalised by the
// path rule (AppendPath). Only a target too long to have been sent whole
// is refused (Result.Oversize), since no endpoint can be derived from it.
package derive

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/wire"
)

// Attribute names, as clients send them.
const (
	AttrPeer   = ":peer"
	AttrMethod = ":method"
	AttrHost   = ":host"
	AttrTarget = ":target"
	// AttrHeaderPrefix starts a header's attribute: ":h:x-api-key".
	AttrHeaderPrefix = ":h:"
)

// Value limits, by the rule for long values (wire.AppendValue).
const (
	// MaxValue is the longest derived descriptor value, and the limit of
	// every attribute without one of its own.
	MaxValue = descriptor.MaxValueLen
	// MaxTarget is the longest :target a client sends.
	MaxTarget = wire.MaxTargetLen
	// MaxHeader is the longest :h: value a client sends.
	MaxHeader = wire.MaxHeaderLen
	// MaxHeaders is the most headers a client sends.
	MaxHeaders = wire.MaxHeaders
)

// AppendValue appends v to dst by the rule for long values: see
// wire.AppendValue.
func AppendValue(dst, v []byte, limit int) []byte { return wire.AppendValue(dst, v, limit) }

// isDigest reports whether v is a digest that replaced a long value.
func isDigest(v []byte) bool { return wire.IsDigest(v) }

// Names of the descriptors derived from the fixed attributes.
const (
	NameIP       = "ip"
	NameMethod   = "method"
	NameHost     = "host"
	NameEndpoint = "endpoint"
)

// source kinds of [request.descriptors].
type sourceKind uint8

const (
	fromHeader sourceKind = iota
	fromQuery
	fromCookie
	fromJWT
)

type source struct {
	name []byte
	kind sourceKind
	arg  string // header name (lower case), parameter, cookie or claim
}

// Deriver derives descriptors by one configuration. It is immutable and
// safe for concurrent use; a reload builds a new one.
type Deriver struct {
	proxies  []netip.Prefix
	ipHeader string
	v4Bits   int
	v6Bits   int
	routes   []route
	sources  []source
	jwt      *verifier
	// headers lists every header attribute derivation reads, for docs
	// and explain.
	headers []string
}

// Defaults of the [request] table, for a zero value of a field: config
// leaves a key the file does not set zero.
const (
	DefaultIPHeader   = "x-forwarded-for"
	DefaultIPv4Prefix = 32
	DefaultIPv6Prefix = 64
)

// New compiles the [request] table. It returns every problem it finds,
// each naming its field.
func New(c config.Request) (*Deriver, error) {
	d := &Deriver{ipHeader: strings.ToLower(c.ClientIPHeader), v4Bits: c.IPv4Prefix, v6Bits: c.IPv6Prefix}
	var errs []error
	if d.ipHeader == "" {
		d.ipHeader = DefaultIPHeader
	}
	switch d.ipHeader {
	case "x-forwarded-for", "x-real-ip", "forwarded":
	default:
		errs = append(errs, fmt.Errorf("request.client_ip_header = %q: want x-forwarded-for, x-real-ip or forwarded", c.ClientIPHeader))
	}
	if d.v4Bits == 0 {
		d.v4Bits = DefaultIPv4Prefix
	}
	if d.v6Bits == 0 {
		d.v6Bits = DefaultIPv6Prefix
	}
	if d.v4Bits < 8 || d.v4Bits > 32 {
		errs = append(errs, fmt.Errorf("request.ipv4_prefix = %d: want 8 to 32", c.IPv4Prefix))
	}
	if d.v6Bits < 16 || d.v6Bits > 128 {
		errs = append(errs, fmt.Errorf("request.ipv6_prefix = %d: want 16 to 128", c.IPv6Prefix))
	}
	for _, e := range c.TrustedProxies {
		p, err := parsePrefix(e)
		if err != nil {
			errs = append(errs, fmt.Errorf("request.trusted_proxies: %w", err))
			continue
		}
		d.proxies = append(d.proxies, p)
	}
	for _, r := range c.Routes {
		rt, err := parseRoute(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("request.routes: %w", err))
			continue
		}
		d.routes = append(d.routes, rt)
	}
	d.headers = []string{d.ipHeader}
	needJWT := false
	for _, name := range sortedKeys(c.Descriptors) {
		s, err := parseSource(name, c.Descriptors[name])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		switch s.kind {
		case fromHeader:
			d.headers = appendNew(d.headers, s.arg)
		case fromCookie:
			d.headers = appendNew(d.headers, "cookie")
		case fromJWT:
			needJWT = true
			d.headers = appendNew(d.headers, "authorization")
		}
		d.sources = append(d.sources, s)
	}
	if len(d.headers) > MaxHeaders {
		errs = append(errs, fmt.Errorf("request: derivation reads %d headers (%s); a client sends at most %d", len(d.headers), strings.Join(d.headers, ", "), MaxHeaders))
	}
	switch {
	case needJWT && c.JWT.KeysFile == "":
		errs = append(errs, errors.New("request.descriptors: a jwt: source needs request.jwt.keys_file"))
	case c.JWT.KeysFile != "":
		v, err := newVerifier(c.JWT)
		if err != nil {
			errs = append(errs, err)
		}
		d.jwt = v
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return d, nil
}

// Headers returns the headers derivation reads, in lower case: the ones a
// client must send.
func (d *Deriver) Headers() []string { return d.headers }

func appendNew(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// parsePrefix reads a trusted proxy: a CIDR or an address.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR: %w", s, err)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither an address nor a CIDR", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parseSource reads one [request.descriptors] entry: "header:NAME",
// "query:NAME", "cookie:NAME" or "jwt:CLAIM".
func parseSource(name, spec string) (source, error) {
	if err := validName(name); err != nil {
		return source{}, fmt.Errorf("request.descriptors.%s: %w", name, err)
	}
	kind, arg, ok := strings.Cut(spec, ":")
	if !ok || arg == "" {
		return source{}, fmt.Errorf("request.descriptors.%s = %q: want header:NAME, query:NAME, cookie:NAME or jwt:CLAIM", name, spec)
	}
	s := source{name: []byte(name), arg: arg}
	switch kind {
	case "header":
		s.kind, s.arg = fromHeader, strings.ToLower(arg)
		if len(AttrHeaderPrefix)+len(s.arg) > descriptor.MaxNameLen || strings.ContainsAny(s.arg, " \t:\r\n") {
			return source{}, fmt.Errorf("request.descriptors.%s = %q: not a header name of at most %d bytes", name, spec, descriptor.MaxNameLen-len(AttrHeaderPrefix))
		}
	case "query":
		s.kind = fromQuery
	case "cookie":
		s.kind = fromCookie
	case "jwt":
		s.kind = fromJWT
	default:
		return source{}, fmt.Errorf("request.descriptors.%s = %q: unknown source %q (header, query, cookie or jwt)", name, spec, kind)
	}
	return s, nil
}

// validName checks a derived descriptor's name.
func validName(name string) error {
	switch {
	case name == "" || len(name) > descriptor.MaxNameLen:
		return fmt.Errorf("a name of 1 to %d bytes", descriptor.MaxNameLen)
	case name[0] == wire.AttrPrefix:
		return errors.New("a name may not start with ':' (attributes' names)")
	case name == NameIP || name == NameMethod || name == NameHost || name == NameEndpoint:
		return fmt.Errorf("%s is derived already", name)
	}
	return nil
}

// Scratch is one request's derivation buffers, reused from request to
// request by one goroutine.
type Scratch struct {
	buf   []byte
	spans []span
	out   []descriptor.Descriptor
	attrs attrs
}

type span struct {
	name       []byte
	start, end int
}

type attrs struct {
	peer, method, host, target []byte
	hasTarget                  bool
	headers                    [MaxHeaders * 2]descriptor.Descriptor // by name; later ones beyond the array are ignored
	nh                         int
}

func (a *attrs) header(name string) []byte {
	for i := 0; i < a.nh; i++ {
		if string(a.headers[i].Name[len(AttrHeaderPrefix):]) == name {
			return a.headers[i].Value
		}
	}
	return nil
}

// add records the value that s.buf holds from start on as descriptor
// name's, unless it is empty.
func (s *Scratch) add(name []byte, start int) {
	if len(s.buf) > start {
		s.spans = append(s.spans, span{name, start, len(s.buf)})
	}
}

// Result is what Derive found.
type Result struct {
	// Descs are the descriptors to decide on: the derived ones, then the
	// request's own that derivation did not produce and that are not
	// empty. They alias
	// the Scratch and the request until the next Derive with the Scratch.
	Descs []descriptor.Descriptor
	// Derived is true when the request carried attributes.
	Derived bool
	// Oversize is true when the target was too long to be sent whole: no
	// endpoint can be derived, and the request is refused.
	Oversize bool
}

// HasAttrs reports whether descs carry any attribute.
func HasAttrs(descs []descriptor.Descriptor) bool {
	for i := range descs {
		if wire.IsAttr(descs[i].Name) {
			return true
		}
	}
	return false
}

// Derive derives the descriptors of a request from the attributes among
// in, at now (for tokens' expiry). A request without attributes is
// returned as it is.
func (d *Deriver) Derive(in []descriptor.Descriptor, now time.Time, s *Scratch) Result {
	if !HasAttrs(in) {
		return Result{Descs: in}
	}
	a := &s.attrs
	a.peer, a.method, a.host, a.target, a.hasTarget, a.nh = nil, nil, nil, nil, false, 0
	for i := range in {
		n, v := in[i].Name, in[i].Value
		switch string(n) {
		case AttrPeer:
			a.peer = v
		case AttrMethod:
			a.method = v
		case AttrHost:
			a.host = v
		case AttrTarget:
			a.target, a.hasTarget = v, true
		default:
			if len(n) > len(AttrHeaderPrefix) && string(n[:len(AttrHeaderPrefix)]) == AttrHeaderPrefix && a.nh < len(a.headers) {
				a.headers[a.nh] = in[i]
				a.nh++
			}
		}
	}
	if a.hasTarget && (isDigest(a.target) || len(a.target) > MaxTarget) {
		return Result{Derived: true, Oversize: true}
	}
	s.buf, s.spans = s.buf[:0], s.spans[:0]
	if peer, ok := parseAddr(a.peer); ok && len(a.peer) > 0 {
		start := len(s.buf)
		s.buf = d.appendIP(s.buf, d.clientIP(peer, a.header(d.ipHeader)))
		s.add(nameIP, start)
	}
	if len(a.method) > 0 {
		start := len(s.buf)
		s.buf = AppendValue(s.buf, a.method, MaxValue)
		s.add(nameMethod, start)
	}
	if h := hostOf(a.host); len(h) > 0 {
		start := len(s.buf)
		s.buf = appendLower(s.buf, h)
		s.add(nameHost, start)
	}
	var query []byte
	if a.hasTarget {
		start := len(s.buf)
		s.buf = AppendPath(s.buf, a.target)
		if r := d.route(s.buf[start:]); r != nil {
			s.buf = append(s.buf[:start], r...)
		}
		s.add(nameEndpoint, start)
		query = queryOf(a.target)
	}
	for i := range d.sources {
		src := &d.sources[i]
		start := len(s.buf)
		switch src.kind {
		case fromHeader:
			s.buf = appendHeaderValue(s.buf, a.header(src.arg))
		case fromQuery:
			s.buf = appendQueryParam(s.buf, query, src.arg)
		case fromCookie:
			if c := a.header("cookie"); !isDigest(c) {
				s.buf = AppendValue(s.buf, cookie(c, src.arg), MaxValue)
			}
		case fromJWT:
			s.buf = d.jwt.appendClaim(s.buf, a.header("authorization"), src.arg, now)
		}
		s.add(src.name, start)
	}
	s.out = s.out[:0]
	for _, sp := range s.spans {
		s.out = append(s.out, descriptor.Descriptor{Name: sp.name, Value: s.buf[sp.start:sp.end:sp.end]})
	}
	derived := len(s.out)
	for i := range in {
		n := in[i].Name
		if wire.IsAttr(n) || len(in[i].Value) == 0 || has(s.out[:derived], n) {
			continue
		}
		if len(s.out) == descriptor.MaxDescriptors {
			break
		}
		s.out = append(s.out, in[i])
	}
	return Result{Descs: s.out, Derived: true}
}

var (
	nameIP       = []byte(NameIP)
	nameMethod   = []byte(NameMethod)
	nameHost     = []byte(NameHost)
	nameEndpoint = []byte(NameEndpoint)
)

func has(descs []descriptor.Descriptor, name []byte) bool {
	for i := range descs {
		if string(descs[i].Name) == string(name) {
			return true
		}
	}
	return false
}

// hostOf returns the host of a Host header: without its port and a
// trailing dot; nil for a digest or an empty value.
func hostOf(h []byte) []byte {
	h = trimOWS(h)
	if len(h) == 0 || isDigest(h) {
		return nil
	}
	if h[0] == '[' {
		if i := indexByte(h, ']'); i > 0 {
			return h[:i+1]
		}
		return h
	}
	if i := indexByte(h, ':'); i >= 0 {
		h = h[:i]
	}
	for len(h) > 0 && h[len(h)-1] == '.' {
		h = h[:len(h)-1]
	}
	return h
}

func indexByte(b []byte, c byte) int {
	for i := range b {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func appendLower(dst, b []byte) []byte {
	for _, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// trimOWS trims spaces and tabs at both ends.
func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// queryOf returns the query of a raw target, without '?' and fragment.
func queryOf(t []byte) []byte {
	i := indexByte(t, '?')
	if i < 0 {
		return nil
	}
	q := t[i+1:]
	if j := indexByte(q, '#'); j >= 0 {
		q = q[:j]
	}
	return q
}

// appendQueryParam appends the value of the query parameter name
// (form-decoded: %XX and '+'), its values joined by ", " when it is given
// more than once, by the rule for long values.
func appendQueryParam(dst, q []byte, name string) []byte {
	start := len(dst)
	found := false
	for len(q) > 0 {
		var pair []byte
		if i := indexByte(q, '&'); i >= 0 {
			pair, q = q[:i], q[i+1:]
		} else {
			pair, q = q, nil
		}
		k, v := pair, []byte(nil)
		if i := indexByte(pair, '='); i >= 0 {
			k, v = pair[:i], pair[i+1:]
		}
		if !formEqual(k, name) {
			continue
		}
		if found {
			dst = append(dst, ", "...)
		}
		found = true
		dst = appendFormDecoded(dst, v)
	}
	if len(dst)-start > MaxValue {
		v := append([]byte(nil), dst[start:]...)
		dst = AppendValue(dst[:start], v, MaxValue)
	}
	return dst
}

// formEqual reports whether the form-encoded key k decodes to name.
func formEqual(k []byte, name string) bool {
	var buf [64]byte
	if len(k) > 3*len(buf) {
		return false
	}
	d := appendFormDecoded(buf[:0], k)
	return string(d) == name
}

func appendFormDecoded(dst, v []byte) []byte {
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '+':
			c = ' '
		case c == '%' && i+2 < len(v) && isHex(v[i+1]) && isHex(v[i+2]):
			c = unhex(v[i+1])<<4 | unhex(v[i+2])
			i += 2
		}
		dst = append(dst, c)
	}
	return dst
}

// cookie returns the value of the first cookie named name in a Cookie
// header, without surrounding double quotes. Cookies are separated by ';'
// and, where a client joined several Cookie fields by ", ", by ',' (no
// cookie value holds one).
func cookie(h []byte, name string) []byte {
	for len(h) > 0 {
		var c []byte
		i := 0
		for i < len(h) && h[i] != ';' && h[i] != ',' {
			i++
		}
		if i < len(h) {
			c, h = h[:i], h[i+1:]
		} else {
			c, h = h, nil
		}
		c = trimOWS(c)
		i = indexByte(c, '=')
		if i < 0 || string(trimOWS(c[:i])) != name {
			continue
		}
		v := trimOWS(c[i+1:])
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return v
	}
	return nil
}

// appendHeaderValue appends a header's value as a descriptor: trimmed,
// the elements of a comma-joined value (a header repeated, joined by its
// server with "," or ", ") trimmed and joined by ", ", empty elements
// dropped; then by the rule for long values.
func appendHeaderValue(dst, v []byte) []byte {
	v = trimOWS(v)
	if indexByte(v, ',') < 0 || isDigest(v) {
		return AppendValue(dst, v, MaxValue)
	}
	start := len(dst)
	for len(v) > 0 {
		var e []byte
		if i := indexByte(v, ','); i >= 0 {
			e, v = v[:i], v[i+1:]
		} else {
			e, v = v, nil
		}
		if e = trimOWS(e); len(e) == 0 {
			continue
		}
		if len(dst) > start {
			dst = append(dst, ", "...)
		}
		dst = append(dst, e...)
	}
	if len(dst)-start > MaxValue {
		long := append([]byte(nil), dst[start:]...)
		dst = AppendValue(dst[:start], long, MaxValue)
	}
	return dst
}
