package envoyrls_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rld/rld/config"
	"github.com/rld/rld/envoyrls"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
)

// clock is a settable clock for the server.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// newClock starts 10.5 s into a minute (and an hour, and a day): no
// window of the tests ends during them unless a test moves the clock.
func newClock() *clock { return &clock{t: time.Date(2026, 3, 2, 10, 0, 10, 5e8, time.UTC)} }

// serve starts a Server for the rld.toml text on a Unix socket and
// returns its address ("unix:PATH").
func serve(t *testing.T, toml string, c *clock) string {
	t.Helper()
	cfg, err := config.Parse([]byte(toml), "test.toml")
	require.NoError(t, err)
	p, err := policy.New(cfg, memstore.New(memstore.Options{}))
	require.NoError(t, err)
	srv, err := envoyrls.New(envoyrls.Options{Policy: func() *policy.Policy { return p }, Now: c.now})
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "rls")
	require.NoError(t, err)
	sock := filepath.Join(dir, "rls.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Drain(ctx)
		assert.NoError(t, <-served)
		os.RemoveAll(dir)
	})
	return "unix:" + sock
}

func dial(t *testing.T, addr string) *envoyrls.Client {
	t.Helper()
	c, err := envoyrls.Dial(addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// one returns a request of one descriptor with the entries kv (key,
// value, key, value...).
func one(kv ...string) [][]envoyrls.Entry {
	var d []envoyrls.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		d = append(d, envoyrls.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return [][]envoyrls.Entry{d}
}

const treeYAML = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: remote_address
    value: 10.0.0.1
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: path
    value: /api/*
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: path
    value: /api/admin
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: path
    rate_limit:
      unit: second
      requests_per_unit: 5
  - key: client
    descriptors:
      - key: path
        rate_limit:
          unit: minute
          requests_per_unit: 2
      - key: quiet
        shadow_mode: true
        rate_limit:
          unit: minute
          requests_per_unit: 1
`

func importOne(t *testing.T, yaml string) string {
	t.Helper()
	out, err := envoyrls.Import([]envoyrls.File{{Name: "test.yaml", Data: []byte(yaml)}})
	require.NoError(t, err)
	return string(out)
}

// TestTreeSelection: a domain and a descriptor's entries select the rule
// of the tree node that envoyproxy/ratelimit would select: an exact value
// before a wildcard value before the key alone, the depth exactly, and
// every value of a key alone counted apart.
func TestTreeSelection(t *testing.T) {
	c := dial(t, serve(t, importOne(t, treeYAML), newClock()))
	ctx := context.Background()
	check := func(descs [][]envoyrls.Entry) envoyrls.Response {
		t.Helper()
		r, err := c.Check(ctx, "edge", descs, 1)
		require.NoError(t, err)
		return r
	}
	// The exact value 10.0.0.1: 1 a minute.
	r := check(one("remote_address", "10.0.0.1"))
	assert.Equal(t, envoyrls.Status{Code: "OK", Limit: 1, Unit: "MINUTE", Remaining: 0, Reset: 50 * time.Second}, r.Statuses[0])
	assert.Equal(t, "OVER_LIMIT", check(one("remote_address", "10.0.0.1")).Code)
	// Any other address: 3 a minute each, apart.
	for i := range 3 {
		r = check(one("remote_address", "10.0.0.2"))
		assert.Equal(t, envoyrls.Status{Code: "OK", Limit: 3, Unit: "MINUTE", Remaining: uint32(2 - i), Reset: 50 * time.Second}, r.Statuses[0])
	}
	assert.Equal(t, "OVER_LIMIT", check(one("remote_address", "10.0.0.2")).Code)
	assert.Equal(t, "OK", check(one("remote_address", "10.0.0.3")).Code)
	// /api/admin exact (1/h), /api/* wildcard (2/h per value), other paths 5/s.
	assert.Equal(t, uint32(1), check(one("path", "/api/admin")).Statuses[0].Limit)
	assert.Equal(t, "HOUR", check(one("path", "/api/users")).Statuses[0].Unit)
	assert.Equal(t, uint32(2), check(one("path", "/api/users")).Statuses[0].Limit)
	assert.Equal(t, uint32(5), check(one("path", "/static/x")).Statuses[0].Limit)
	// Depth: client alone has no limit; client+path has 2/min; a third
	// entry selects nothing.
	r = check(one("client", "a"))
	assert.Equal(t, envoyrls.Status{Code: "OK"}, r.Statuses[0])
	assert.Equal(t, uint32(2), check(one("client", "a", "path", "/x")).Statuses[0].Limit)
	assert.Equal(t, envoyrls.Status{Code: "OK"}, check(one("client", "a", "path", "/x", "extra", "1")).Statuses[0])
	// An unknown domain: no limit.
	r, err := c.Check(ctx, "other", one("remote_address", "10.0.0.1"), 1)
	require.NoError(t, err)
	assert.Equal(t, "OK", r.Code)
	assert.Equal(t, envoyrls.Status{Code: "OK"}, r.Statuses[0])
}

// TestShadowReportedOK: a shadow_mode descriptor over its limit is
// answered OK, and counted as shadow_limited in rld_checks_total.
func TestShadowReportedOK(t *testing.T) {
	toml := importOne(t, treeYAML)
	c := dial(t, serve(t, toml, newClock()))
	shadow := metrics.GetOrCreateCounter(`rld_checks_total{rule="edge.client.quiet",decision="shadow_limited"}`)
	before := shadow.Get()
	for range 3 {
		r, err := c.Check(context.Background(), "edge", one("client", "a", "quiet", "q"), 1)
		require.NoError(t, err)
		assert.Equal(t, "OK", r.Code)
	}
	assert.Equal(t, before+2, shadow.Get(), "the 2nd and 3rd checks would have been refused")
}

// TestMultipleDescriptorsAndHeaders: one status per descriptor, the
// overall code OVER_LIMIT when one is, hits_addend as the cost, and the
// headers of the refusing limit.
func TestMultipleDescriptorsAndHeaders(t *testing.T) {
	c := dial(t, serve(t, importOne(t, treeYAML), newClock()))
	descs := [][]envoyrls.Entry{
		{{Key: "remote_address", Value: "192.0.2.1"}},
		{{Key: "client", Value: "b"}, {Key: "path", Value: "/p"}},
	}
	r, err := c.Check(context.Background(), "edge", descs, 2)
	require.NoError(t, err)
	assert.Equal(t, "OK", r.Code)
	assert.Equal(t, uint32(1), r.Statuses[0].Remaining, "hits_addend 2 of 3")
	assert.Equal(t, uint32(0), r.Statuses[1].Remaining, "hits_addend 2 of 2")
	assert.Equal(t, "0", r.Headers["X-RateLimit-Remaining"], "the least remaining decides the headers")
	r, err = c.Check(context.Background(), "edge", descs, 1)
	require.NoError(t, err)
	assert.Equal(t, "OVER_LIMIT", r.Code)
	assert.Equal(t, "OK", r.Statuses[0].Code)
	assert.Equal(t, "OVER_LIMIT", r.Statuses[1].Code)
	assert.Equal(t, "2", r.Headers["X-RateLimit-Limit"])
	assert.Equal(t, "0", r.Headers["X-RateLimit-Remaining"])
	assert.Equal(t, "50", r.Headers["Retry-After"])
	assert.Contains(t, r.Headers["RateLimit"], "r=0")
}

// TestBadRequestTakesNothing: an empty domain, no descriptors, an empty
// key or a negative hit get InvalidArgument, and no descriptor of the
// request is counted.
func TestBadRequestTakesNothing(t *testing.T) {
	addr := serve(t, importOne(t, treeYAML), newClock())
	conn, err := grpc.NewClient("unix://"+addr[len("unix:"):], grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	rls := pb.NewRateLimitServiceClient(conn)
	good := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.9.9.9"}}}
	bad := []*pb.RateLimitRequest{
		{Domain: "", Descriptors: []*rlv3.RateLimitDescriptor{good}},
		{Domain: "edge"},
		{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{good, {}}},
		{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{good, {Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "", Value: "x"}}}}},
		{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{good, {Entries: good.Entries, IsNegativeHits: true}}},
	}
	for i, req := range bad {
		_, err := rls.ShouldRateLimit(context.Background(), req)
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "request %d: %v", i, err)
	}
	resp, err := rls.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{good}})
	require.NoError(t, err)
	assert.Equal(t, uint32(2), resp.Statuses[0].LimitRemaining, "the refused requests took nothing")
}

// TestImportRefusesWithLine: what rld cannot express is refused, naming
// the file and line.
func TestImportRefusesWithLine(t *testing.T) {
	cases := map[string]string{
		"quota_mode":  "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
		"replaces":    "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1, replaces: [{name: x}]}\n",
		"block":       "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 0}\n",
		"unit":        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
		"unknown":     "domain: d\ndescriptors:\n  - key: a\n    colour: red\n",
		"duplicate":   "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
		"dotted key":  "domain: d\ndescriptors:\n  - key: a.b\n",
		"domain name": "domain: d\ndescriptors:\n  - key: domain\n",
	}
	for name, y := range cases {
		_, err := envoyrls.Import([]envoyrls.File{{Name: "x.yaml", Data: []byte(y)}})
		if assert.Error(t, err, name) {
			assert.Contains(t, err.Error(), "x.yaml: line ", name)
		}
	}
	// The line of a nested node is its line in the file.
	nested := "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit:\n          unit: minute\n          colour: 1\n"
	_, err := envoyrls.Import([]envoyrls.File{{Name: "n.yaml", Data: []byte(nested)}})
	assert.ErrorContains(t, err, `n.yaml: line 8: unknown field "colour"`)
	nested = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit:\n          unit: fortnight\n          requests_per_unit: 1\n"
	_, err = envoyrls.Import([]envoyrls.File{{Name: "n.yaml", Data: []byte(nested)}})
	assert.ErrorContains(t, err, `n.yaml: line 5: domain "d": unit "fortnight"`)
	_, err = envoyrls.Import([]envoyrls.File{{Name: "a.yaml", Data: []byte("domain: d\n")}, {Name: "b.yaml", Data: []byte("domain: d\n")}})
	assert.ErrorContains(t, err, `domain "d" is already defined in a.yaml`)
}
