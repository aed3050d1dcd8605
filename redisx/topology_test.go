package redisx_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

// otherPrimary returns a primary of cl other than from.
func otherPrimary(cl *redistest.Cluster, from *redistest.Server) *redistest.Server {
	for _, pr := range cl.Primaries() {
		if pr != from {
			return pr
		}
	}
	return nil
}

// TestClusterRedirect: a Cluster call goes to the primary the Client's
// slot map names. When a slot has moved to another primary and the map
// does not know it yet, the node answers MOVED; while a slot is being
// migrated, it answers ASK for a key it does not hold. Either way the
// call is made again through rueidis, which follows the redirection, and
// it is decided where the key is now: a single take, a batch's share of
// one op, and one of two ops. The new owner has lost its scripts
// (SCRIPT FLUSH), so a redirected op meets NOSCRIPT there too.
func TestClusterRedirect(t *testing.T) {
	cl := redistest.StartCluster(t)
	c := newClient(t, redisx.Options{Addrs: cl.Addrs()[:1], Mode: redisx.Cluster})
	rs := redisx.NewStore(c)
	ctx := context.Background()
	p := algo.Params{Kind: algo.TokenBucket, Limit: 100, Period: time.Hour}
	ids := map[string]string{} // node ID by address
	for _, n := range cl.Nodes() {
		ids[n.Addr] = n.ID
	}
	calls := []struct {
		name string
		call func(key []byte) error
	}{
		{"take", func(key []byte) error {
			_, err := rs.Take(ctx, key, p, 1, time.Now(), false)
			return err
		}},
		{"do-one", func(key []byte) error {
			ops := []algo.Op{{Kind: algo.OpTake, Key: key, Params: p, N: 1}}
			return errors.Join(rs.Do(ctx, ops), ops[0].Err)
		}},
		{"do-two", func(key []byte) error {
			ops := []algo.Op{{Kind: algo.OpTake, Key: key, Params: p, N: 1}, {Kind: algo.OpPeek, Key: key, Params: p}}
			return errors.Join(rs.Do(ctx, ops), ops[0].Err, ops[1].Err)
		}},
	}
	setslot := func(t *testing.T, on *redistest.Server, args ...string) {
		t.Helper()
		_, err := redistest.Do(on.Addr, append([]string{"CLUSTER", "SETSLOT"}, args...)...)
		require.NoError(t, err, "SETSLOT %v on %s", args, on.Addr)
	}
	for _, how := range []string{"moved", "ask"} {
		for _, tc := range calls {
			t.Run(how+"/"+tc.name, func(t *testing.T) {
				// The slot map may refresh between a move and the call
				// (every second): then the call is not redirected, and
				// the case is tried again on another slot.
				for attempt := 0; ; attempt++ {
					require.Less(t, attempt, 5, "the slot map never lagged behind a move")
					key := []byte(fmt.Sprintf("redirect-%s-%s-%d", how, tc.name, attempt))
					rkey := string(redisx.AppendKey(nil, "t:", key, p.Kind))
					slot := strconv.Itoa(redistest.Slot(rkey))
					from := cl.PrimaryFor(rkey)
					to := otherPrimary(cl, from)
					redistest.WaitFor(t, "the slot map to name "+from.Addr, func() bool { return c.SlotNode(rkey) == from.Addr })
					_, err := redistest.Do(to.Addr, "SCRIPT", "FLUSH")
					require.NoError(t, err)
					if how == "moved" {
						// The slot holds no key: it moves at once, the new
						// owner first, as a migration ends.
						for _, n := range append([]*redistest.Server{to, from}, cl.Primaries()...) {
							setslot(t, n, slot, "NODE", ids[to.Addr])
						}
					} else {
						setslot(t, to, slot, "IMPORTING", ids[from.Addr])
						setslot(t, from, slot, "MIGRATING", ids[to.Addr])
					}
					before := c.Redirects()
					require.NoError(t, tc.call(key), "the call after the move")
					// (COUNTKEYSINSLOT: an importing node redirects a key's
					// commands without ASKING.)
					n, err := redistest.Do(to.Addr, "CLUSTER", "COUNTKEYSINSLOT", slot)
					require.NoError(t, err)
					require.Equal(t, "1", n, "%q is decided on %s, where the slot is going", rkey, to.Addr)
					if c.Redirects() > before {
						t.Logf("attempt %d: %s redirected the call to %s", attempt, from.Addr, to.Addr)
						break
					}
					require.Equal(t, "moved", how, "a migrating slot's node answers ASK whatever the map")
				}
			})
		}
	}
}
