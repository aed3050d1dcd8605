package nginxtest

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/internal/reqcorpus"
)

// CorpusLog is the [log] table a daemon replaying the request corpus
// needs: every decision, with its descriptors, in the file path.
func CorpusLog(path string) string {
	return fmt.Sprintf("[log]\ndecisions = %q\nallowed_rate = 1.0\ndenied_rate = 1.0\ndenied_per_second = 0\n", path)
}

// Replayer sends raw requests to an nginx listening on 127.0.0.1 and
// [::1] on one port, each from its own peer address, and reads what the
// daemon behind it decided from its decision log. After each request it
// sends a marker request (endpoint /rld-marker/N), so the decisions logged
// for the request are exactly those before the marker's: none when nginx
// refused the request itself.
type Replayer struct {
	t      *testing.T
	v4, v6 string
	log    reqcorpus.DecisionLog
	marks  int
	// Allowed are the statuses nginx answers an allowed request with.
	Allowed []int
}

// NewReplayer returns a Replayer for n, whose daemon writes its decision
// log to logPath; allowed are the statuses of an allowed request.
func NewReplayer(t *testing.T, n *Nginx, logPath string, allowed ...int) *Replayer {
	_, port, err := net.SplitHostPort(n.Addr)
	require.NoError(t, err)
	return &Replayer{t: t, v4: n.Addr, v6: net.JoinHostPort("::1", port), log: reqcorpus.DecisionLog{Path: logPath}, Allowed: allowed}
}

// Decisions runs send (one request), then the marker, and returns send's
// status and the decisions logged before the marker's.
func (r *Replayer) Decisions(send func(v4, v6 string) (int, error)) (int, []reqcorpus.Logged) {
	t := r.t
	t.Helper()
	status, err := send(r.v4, r.v6)
	require.NoError(t, err)
	r.marks++
	marker := "/rld-marker/" + strconv.Itoa(r.marks)
	m := reqcorpus.Case{Peer: "127.0.0.9", Method: "GET", Host: "marker", Target: marker}
	ms, err := m.Send(r.v4, r.v6, 10*time.Second)
	require.NoError(t, err)
	require.Contains(t, r.Allowed, ms, "the marker request %s", marker)
	var got []reqcorpus.Logged
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := r.log.Next()
		require.NoError(t, err)
		got = append(got, l...)
		for i, d := range got {
			for _, desc := range d.Descs {
				if desc.Name == "endpoint" && desc.Value == marker {
					require.Len(t, got, i+1, "decisions logged after the marker %s", marker)
					return status, got[:i]
				}
			}
		}
		require.True(t, time.Now().Before(deadline), "the marker %s was not logged: %v", marker, got)
		time.Sleep(2 * time.Millisecond) // polling the decision log
	}
}

// Case sends c from its peer and checks it against what the daemon
// logged: an Oversize case is refused (403 or 429, rule oversize); any
// other case is allowed with exactly c.Want; a MayRefuse case may instead
// be refused by nginx itself (4xx, nothing logged). It reports whether
// nginx refused it.
func (r *Replayer) Case(c reqcorpus.Case) (refused bool) {
	t := r.t
	t.Helper()
	status, got := r.Decisions(func(v4, v6 string) (int, error) { return c.Send(v4, v6, 10*time.Second) })
	what := fmt.Sprintf("%s (line %d): status %d", c.Name, c.Line, status)
	switch {
	case len(got) == 0:
		assert.True(t, c.MayRefuse, "%s: nothing logged", what)
		assert.True(t, status >= 400 && status < 500, "%s: nothing logged, so nginx refused it (4xx), never served it", what)
		return true
	case len(got) > 1:
		t.Errorf("%s: %d decisions logged: %v", what, len(got), got)
	case c.Oversize:
		assert.Contains(t, []int{403, 429}, status, "%s: refused as oversize", what)
		assert.Equal(t, "oversize", got[0].Rule, what)
		assert.NotEqual(t, "allowed", got[0].Decision, what)
	default:
		assert.Contains(t, r.Allowed, status, what)
		assert.Equal(t, "allowed", got[0].Decision, what)
		assert.Equal(t, reqcorpus.Lines(c.Want), reqcorpus.Lines(got[0].Descs), what)
	}
	return false
}

// Corpus replays every case of clients/testdata/requests.tsv (Case) and
// returns the names of those nginx refused itself.
func (r *Replayer) Corpus() []string {
	r.t.Helper()
	cases, err := reqcorpus.Load()
	require.NoError(r.t, err)
	require.NotEmpty(r.t, cases)
	var refused []string
	for _, c := range cases {
		if r.Case(c) {
			refused = append(refused, c.Name)
		}
	}
	return refused
}

// SendRaw writes req (the request line and header fields, CRLF-separated,
// without the final empty line) from the loopback address peer to addr,
// adding "Connection: close", and returns the answer's status.
func SendRaw(peer, addr, req string) (int, error) {
	local, err := net.ResolveTCPAddr("tcp", net.JoinHostPort(peer, "0"))
	if err != nil {
		return 0, fmt.Errorf("peer %q: %w", peer, err)
	}
	d := net.Dialer{LocalAddr: local, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return 0, err
	}
	if _, err := c.Write([]byte(req + "\r\nConnection: close\r\n\r\n")); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("reading the status line: %w", err)
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0, fmt.Errorf("status line %q", line)
	}
	return strconv.Atoi(f[1])
}

// RldFields sends requests that carry X-Rld-Peer, X-Rld-Method,
// X-Rld-Host and X-Rld-Target fields of their own (from an untrusted peer,
// from a trusted proxy, in lower case and repeated, and without a Host
// of its own) and checks that the daemon derived what nginx saw, never
// what the fields say.
func (r *Replayer) RldFields() {
	t := r.t
	t.Helper()
	forged := []reqcorpus.Header{{Name: "X-Rld-Peer", Value: "198.51.100.10"}, {Name: "X-Rld-Method", Value: "DELETE"},
		{Name: "X-Rld-Host", Value: "evil.example"}, {Name: "X-Rld-Target", Value: "/v1/login?page=9"}}
	want := func(ip string) []reqcorpus.Desc {
		return []reqcorpus.Desc{{Name: "ip", Value: ip}, {Name: "method", Value: "GET"},
			{Name: "host", Value: "api.example.com"}, {Name: "endpoint", Value: "/v1/search"}}
	}
	for _, c := range []reqcorpus.Case{
		{Name: "x-rld-fields", Peer: "127.0.0.9", Headers: forged, Want: want("127.0.0.9")},
		{Name: "x-rld-fields-from-a-proxy", Peer: "127.0.0.5", Headers: forged, Want: want("127.0.0.5")},
		{Name: "x-rld-fields-lower-case-twice", Peer: "::1", Headers: []reqcorpus.Header{
			{Name: "x-rld-peer", Value: "198.51.100.10"}, {Name: "x-rld-peer", Value: "198.51.100.11"},
			{Name: "x-rld-target", Value: "/v1/login"}, {Name: "x-rld-target", Value: "/v1/login"}}, Want: want("::/64")},
	} {
		c.Method, c.Host, c.Target = "GET", "api.example.com", "/v1/search"
		assert.False(t, r.Case(c), "%s: nginx refused it", c.Name)
	}
	status, got := r.Decisions(func(v4, _ string) (int, error) {
		return SendRaw("127.0.0.9", v4, "GET /v1/search HTTP/1.0\r\nX-Rld-Host: evil.example\r\nX-Rld-Peer: 198.51.100.10")
	})
	assert.Contains(t, r.Allowed, status, "no Host")
	if assert.Len(t, got, 1, "no Host") {
		assert.Equal(t, reqcorpus.Lines([]reqcorpus.Desc{{Name: "ip", Value: "127.0.0.9"}, {Name: "method", Value: "GET"},
			{Name: "endpoint", Value: "/v1/search"}}), reqcorpus.Lines(got[0].Descs), "no Host: no host descriptor")
	}
}
