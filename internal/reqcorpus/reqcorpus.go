// Package reqcorpus reads clients/testdata/requests.tsv, the corpus of raw
// requests and the descriptors rld derives from them, and replays a case
// as raw bytes against a real HTTP server. The derive package's tests and
// every client's tests (through nginx, php-fpm, Python servers) use it.
//
// The file has one case a line, fields separated by TAB:
//
//	NAME  PEER  METHOD  HOST  TARGET  HEADERS  WANT  FLAGS
//
// A field "-" is empty. Fields hold escapes: \t, \n, \\, \xHH, and \{N},
// which repeats the byte before it until it stands N times in a row.
// HEADERS is "Name: value" lines (separated by \n); WANT is "name=value"
// lines in the order rld derives them (ip, method, host, endpoint, then
// [request.descriptors] by name), or "!oversize" for a request refused
// as too long. FLAGS is a comma-separated list: "may_refuse" marks a
// request that a server may refuse itself (4xx) before any client code
// runs — a header over its limit, a byte it forbids; "dup" marks a request
// that repeats a header (see Case.Repeated).
package reqcorpus

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/rld/rld/derive"
	"github.com/rld/rld/descriptor"
)

// Header is one header field of a case.
type Header struct {
	Name, Value string
}

// Desc is one expected descriptor.
type Desc struct {
	Name, Value string
}

// Case is one raw request and what rld derives from it.
type Case struct {
	Name    string
	Line    int
	Peer    string // the client's address as the server sees it: 127.0.0.0/8 or ::1
	Method  string
	Host    string // "" sends no Host field
	Target  string
	Headers []Header
	// Want is the derived descriptors, in order; nil with Oversize.
	Want []Desc
	// Oversize: the request is refused as too long to derive.
	Oversize bool
	// MayRefuse: a server may refuse the request itself.
	MayRefuse bool
	// Repeated: the request repeats a header. A server that passes on
	// only one occurrence (nginx before 1.23 to FastCGI) derives
	// otherwise.
	Repeated bool
}

// Dir returns the absolute path of clients/testdata.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "clients", "testdata")
}

// Load reads requests.tsv.
func Load() ([]Case, error) {
	path := filepath.Join(Dir(), "requests.tsv")
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var cases []Case
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		c, err := parse(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		c.Line = n
		cases = append(cases, c)
	}
	return cases, sc.Err()
}

func parse(line string) (Case, error) {
	f := strings.Split(line, "\t")
	if len(f) != 8 {
		return Case{}, fmt.Errorf("%d fields, want 8", len(f))
	}
	var u [8]string
	for i, s := range f {
		v, err := Unescape(s)
		if err != nil {
			return Case{}, fmt.Errorf("field %d: %w", i+1, err)
		}
		u[i] = v
	}
	c := Case{Name: u[0], Peer: u[1], Method: u[2], Host: u[3], Target: u[4]}
	for _, h := range lines(u[5]) {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			return Case{}, fmt.Errorf("header %q has no colon", h)
		}
		c.Headers = append(c.Headers, Header{name, strings.TrimPrefix(value, " ")})
	}
	if u[6] == "!oversize" {
		c.Oversize = true
	} else {
		for _, d := range lines(u[6]) {
			name, value, ok := strings.Cut(d, "=")
			if !ok {
				return Case{}, fmt.Errorf("descriptor %q has no =", d)
			}
			c.Want = append(c.Want, Desc{name, value})
		}
	}
	for _, fl := range strings.Split(u[7], ",") {
		switch fl {
		case "":
		case "may_refuse":
			c.MayRefuse = true
		case "dup":
			c.Repeated = true
		default:
			return Case{}, fmt.Errorf("unknown flag %q", fl)
		}
	}
	return c, nil
}

func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// Unescape decodes a field: "-" is empty; \t, \n, \\, \xHH and \{N}.
func Unescape(s string) (string, error) {
	if s == "-" {
		return "", nil
	}
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			b = append(b, c)
			continue
		}
		if i+1 >= len(s) {
			return "", fmt.Errorf("a lone \\ at the end")
		}
		i++
		switch s[i] {
		case 't':
			b = append(b, '\t')
		case 'n':
			b = append(b, '\n')
		case '\\':
			b = append(b, '\\')
		case 'x':
			if i+2 >= len(s) {
				return "", fmt.Errorf("short \\x escape")
			}
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil {
				return "", fmt.Errorf("bad \\x escape %q", s[i+1:i+3])
			}
			b = append(b, byte(v))
			i += 2
		case '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 || len(b) == 0 {
				return "", fmt.Errorf("bad \\{N} repeat")
			}
			n, err := strconv.Atoi(s[i+1 : i+end])
			if err != nil || n < 1 || n > 1<<20 {
				return "", fmt.Errorf("bad \\{N} repeat count %q", s[i+1:i+end])
			}
			last := b[len(b)-1]
			run := 0
			for j := len(b) - 1; j >= 0 && b[j] == last; j-- {
				run++
			}
			for ; run < n; run++ {
				b = append(b, last)
			}
			i += end
		default:
			return "", fmt.Errorf("unknown escape \\%c", s[i])
		}
	}
	return string(b), nil
}

// Config returns the text of requests.toml, the daemon configuration the
// replays run with, with @TESTDATA@ replaced by Dir() and extra appended
// (e.g. a [server] table naming the test's socket).
func Config(extra string) (string, error) {
	b, err := os.ReadFile(filepath.Join(Dir(), "requests.toml"))
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(string(b), "@TESTDATA@", Dir()) + "\n" + extra, nil
}

// Raw returns the request's bytes as an HTTP/1.1 client sends them, with
// "Connection: close".
func (c *Case) Raw() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\n", c.Method, c.Target)
	if c.Host != "" {
		fmt.Fprintf(&b, "Host: %s\r\n", c.Host)
	}
	for _, h := range c.Headers {
		fmt.Fprintf(&b, "%s: %s\r\n", h.Name, h.Value)
	}
	b.WriteString("Connection: close\r\n\r\n")
	return b.Bytes()
}

// Send writes the request's raw bytes from the case's peer address to the
// server at v4 (host:port, for a 127.0.0.0/8 peer) or v6 (for ::1) and
// returns the status code of the answer.
func (c *Case) Send(v4, v6 string, timeout time.Duration) (int, error) {
	addr := v4
	if strings.Contains(c.Peer, ":") {
		addr = v6
	}
	local, err := net.ResolveTCPAddr("tcp", net.JoinHostPort(c.Peer, "0"))
	if err != nil {
		return 0, fmt.Errorf("peer %q: %w", c.Peer, err)
	}
	d := net.Dialer{LocalAddr: local, Timeout: timeout}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write(c.Raw()); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("reading the status line: %w", err)
	}
	parts := strings.SplitN(line, " ", 3)
	if len(parts) < 2 {
		return 0, fmt.Errorf("status line %q", line)
	}
	return strconv.Atoi(parts[1])
}

// Lines formats descriptors as "name=value" lines, for comparing.
func Lines(ds []Desc) string {
	var b strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&b, "%s=%q\n", d.Name, d.Value)
	}
	return b.String()
}

// Logged is one decision line of rld's decision log, as far as the
// replays read it.
type Logged struct {
	Rule     string
	Decision string
	Descs    []Desc
}

// ParseDecision reads one line of the decision log; ok is false for a
// line that is not a decision (an admin change). The log writes each byte
// outside printable ASCII as \u00XX: it is turned back into that byte.
func ParseDecision(line []byte) (l Logged, ok bool, err error) {
	var raw struct {
		Kind        string      `json:"kind"`
		Rule        string      `json:"rule"`
		Decision    string      `json:"decision"`
		Descriptors [][2]string `json:"descriptors"`
	}
	if err := json.Unmarshal(line, &raw); err != nil {
		return Logged{}, false, fmt.Errorf("decision log line %q: %w", line, err)
	}
	if raw.Kind != "decision" {
		return Logged{}, false, nil
	}
	l = Logged{Rule: raw.Rule, Decision: raw.Decision}
	for _, d := range raw.Descriptors {
		l.Descs = append(l.Descs, Desc{latin1(d[0]), latin1(d[1])})
	}
	return l, true, nil
}

// latin1 turns each rune of s (all below 256) back into one byte.
func latin1(s string) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		b = append(b, byte(r))
	}
	return string(b)
}

// DecisionLog follows a decision log file: Next returns the decisions
// written since the last call.
type DecisionLog struct {
	Path string
	off  int64
}

// Next returns the decision lines appended since the last call.
func (d *DecisionLog) Next() ([]Logged, error) {
	b, err := os.ReadFile(d.Path)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) < d.off {
		d.off = 0
	}
	b = b[d.off:]
	end := bytes.LastIndexByte(b, '\n')
	if end < 0 {
		return nil, nil
	}
	d.off += int64(end + 1)
	var out []Logged
	for _, line := range bytes.Split(b[:end], []byte("\n")) {
		if l, ok, err := ParseDecision(line); err != nil {
			return nil, err
		} else if ok {
			out = append(out, l)
		}
	}
	return out, nil
}

// ClientHeaders is the clients' default list of headers to send.
var ClientHeaders = []string{"x-api-key", "authorization", "x-forwarded-for", "x-real-ip", "forwarded", "cookie"}

// Attributes returns the attributes a client sends for the case, by the
// client contract (docs/protocol.md, "Request attributes"): :peer,
// :method, :host, :target, then each header of ClientHeaders the request
// carries, its occurrences joined by ", ", every value by the rule for
// long values.
func (c *Case) Attributes() []descriptor.Descriptor {
	add := func(ds []descriptor.Descriptor, name, v string, limit int) []descriptor.Descriptor {
		return append(ds, descriptor.Descriptor{Name: []byte(name), Value: derive.AppendValue(nil, []byte(v), limit)})
	}
	var ds []descriptor.Descriptor
	ds = add(ds, derive.AttrPeer, c.Peer, derive.MaxValue)
	ds = add(ds, derive.AttrMethod, c.Method, derive.MaxValue)
	if c.Host != "" {
		ds = add(ds, derive.AttrHost, c.Host, derive.MaxValue)
	}
	ds = add(ds, derive.AttrTarget, c.Target, derive.MaxTarget)
	for _, name := range ClientHeaders {
		var vals []string
		for _, h := range c.Headers {
			if strings.EqualFold(h.Name, name) {
				vals = append(vals, h.Value)
			}
		}
		if vals != nil {
			ds = add(ds, derive.AttrHeaderPrefix+name, strings.Join(vals, ", "), derive.MaxHeader)
		}
	}
	return ds
}
