package redisx_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// takeUntilDenied takes cost 1 from key until it is denied and returns
// how many were admitted.
func takeUntilDenied(t *testing.T, rs *redisx.Store, key []byte, p algo.Params) int64 {
	t.Helper()
	for n := int64(0); ; n++ {
		r, err := rs.Take(context.Background(), key, p, 1, time.Now(), false)
		require.NoError(t, err)
		if !r.Allowed {
			return n
		}
		require.LessOrEqual(t, n, p.Limit, "admitted more than the limit")
	}
}

// TestSentinel: the store finds the primary through the sentinels,
// decides there, and follows a failover to the promoted replica.
func TestSentinel(t *testing.T) {
	g := redistest.StartSentinel(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{
		Addrs: g.SentinelAddrs(), Mode: redisx.Sentinel, MasterSet: g.MasterSet,
	}))
	ctx := context.Background()
	for _, k := range kinds {
		p := algo.Params{Kind: k, Limit: 5, Period: time.Hour}
		key := []byte("sentinel-" + k.String())
		assert.Equal(t, p.Limit, takeUntilDenied(t, rs, key, p), k.String())
		n, err := redistest.Do(g.Primary().Addr, "EXISTS", string(redisx.AppendKey(nil, "t:", key, k)))
		require.NoError(t, err)
		assert.Equal(t, "1", n, "%s: the key is on the primary %s", k, g.Primary().Addr)
	}

	g.Primary().Kill()
	promoted := g.WaitFailover(t)
	p := algo.Params{Kind: algo.TokenBucket, Limit: 5, Period: time.Hour}
	redistest.WaitFor(t, "the store to follow the failover", func() bool {
		_, err := rs.Take(ctx, []byte("after-failover"), p, 0, time.Now(), true)
		return err == nil
	})
	assert.Equal(t, p.Limit, takeUntilDenied(t, rs, []byte("after-failover-2"), p))
	n, err := redistest.Do(promoted.Addr, "EXISTS", string(redisx.AppendKey(nil, "t:", []byte("after-failover-2"), algo.TokenBucket)))
	require.NoError(t, err)
	assert.Equal(t, "1", n, "the key is on the promoted replica %s", promoted.Addr)
}

// TestCluster: keys of every shard are decided on the primary that
// serves their slot.
func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: c.Addrs()[:2], Mode: redisx.Cluster}))
	covered := map[string]bool{}
	for i := 0; len(covered) < len(c.Primaries()); i++ {
		require.Less(t, i, 100, "no key found for every primary")
		key := []byte(fmt.Sprintf("cluster-%d", i))
		for _, k := range kinds {
			p := algo.Params{Kind: k, Limit: 3, Period: time.Hour}
			assert.Equal(t, p.Limit, takeUntilDenied(t, rs, key, p), k.String())
			rkey := string(redisx.AppendKey(nil, "t:", key, k))
			primary := c.PrimaryFor(rkey)
			n, err := redistest.Do(primary.Addr, "EXISTS", rkey)
			require.NoError(t, err)
			assert.Equal(t, "1", n, "%q is on %s", rkey, primary.Addr)
			covered[primary.Addr] = true
		}
	}
}
