package envoyrls_test

import (
	"context"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/config"
	"github.com/rld/rld/envoyrls"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
)

// BenchmarkShouldRateLimit is the face's own cost per call, without the
// network: mapping, one check on the embedded store, the response and its
// headers.
func BenchmarkShouldRateLimit(b *testing.B) {
	cfg, err := config.Parse([]byte(`[[rule]]
name = "bench"
match = { domain = "bench", envoy_keys = "remote_address" }
by = ["remote_address"]
algorithm = "fixed_window"
limit = 100000000
period = "1s"
`), "bench.toml")
	require.NoError(b, err)
	p, err := policy.New(cfg, memstore.New(memstore.Options{}))
	require.NoError(b, err)
	c := newClock()
	srv, err := envoyrls.New(envoyrls.Options{Policy: func() *policy.Policy { return p }, Now: c.now})
	require.NoError(b, err)
	req := &pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "hot"}}},
	}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := srv.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
