package daemon_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// slotCfg is a daemon on store with one concurrency rule "slots" of
// limit slots per api_key, held a minute when not released, its leases
// signed with the key in keyFile.
func slotCfg(store, keyFile string, limit int) string {
	return fmt.Sprintf(`[server]
max_connections = 1000

[store]
%s
timeout = "2s"
lease_key_file = %q

[[rule]]
name = "slots"
by = ["api_key"]
algorithm = "concurrency"
limit = %d
timeout = "1m"
`, store, keyFile, limit)
}

// slotsKey is the Redis key of the slots rule's counter of api_key v
// (the default key prefix; the value's length is one byte).
func slotsKey(v string) string { return fmt.Sprintf("rld:{slots\x00%c%s}:cc", len(v), v) }

// slotMembers returns the members of key: "<At>:<Slot>:<Cost>" each.
func slotMembers(t testing.TB, addr, key string) []string {
	t.Helper()
	out, err := redistest.Do(addr, "ZRANGE", key, "0", "-1")
	require.NoError(t, err)
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// sharedTimes counts the members of ms whose time another member shares.
func sharedTimes(ms []string) int {
	at := map[string]int{}
	for _, m := range ms {
		a, _, _ := strings.Cut(m, ":")
		at[a]++
	}
	n := 0
	for _, k := range at {
		if k > 1 {
			n += k
		}
	}
	return n
}

// releaseCode releases lease through c and returns the answer's code:
// CodeNone when it was released.
func releaseCode(t testing.TB, c *client.Client, lease string) wire.Code {
	t.Helper()
	_, err := c.Release(context.Background(), lease)
	var re *client.ResponseError
	if errors.As(err, &re) {
		return re.Code
	}
	require.NoError(t, err)
	return wire.CodeNone
}

// TestReleaseCoalescedAcquires: acquires answered in one Redis call (the
// acquires that arrive while one is in flight go together in the next:
// 30 ms of latency on Redis makes it so, and the members in Redis show
// it) share an acquire time; each lease released twice frees its own
// slot once, the second release is not_found and frees nothing, the
// slots in Redis never exceed the limit, and a lease with its signature
// flipped frees nothing.
func TestReleaseCoalescedAcquires(t *testing.T) {
	srv := redistest.Standalone(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	s, err := daemontest.Start(slotCfg(fmt.Sprintf("redis = [%q]", proxy.Addr()), leaseKeyFile(t), 3))
	require.NoError(t, err)
	t.Cleanup(s.Close)
	c := client.New(s.Socket)
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	key := []client.Descriptor{{Name: "api_key", Value: "sk_pair"}}
	rkey := slotsKey("sk_pair")

	proxy.Delay(30 * time.Millisecond)
	var leases []string
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 20, "no two acquires went in one Redis call")
		leases = make([]string, 3)
		var wg sync.WaitGroup
		for i := range leases {
			wg.Go(func() {
				r, err := c.Acquire(ctx, key, 1)
				if assert.NoError(t, err) && assert.True(t, r.Allowed(), "%+v", r) {
					leases[i] = r.Lease
				}
			})
		}
		wg.Wait()
		require.False(t, t.Failed())
		if sharedTimes(slotMembers(t, srv.Addr, rkey)) >= 2 {
			break
		}
		for _, l := range leases {
			require.Equal(t, wire.CodeNone, releaseCode(t, c, l))
		}
	}
	proxy.Delay(0)
	t.Logf("in Redis: %q", slotMembers(t, srv.Addr, rkey))

	// A flipped signature frees nothing.
	raw, err := base64.RawURLEncoding.DecodeString(leases[0])
	require.NoError(t, err)
	raw[len(raw)-1] ^= 0x40
	assert.Equal(t, wire.CodeNotFound, releaseCode(t, c, base64.RawURLEncoding.EncodeToString(raw)))
	require.Len(t, slotMembers(t, srv.Addr, rkey), 3)

	for i, l := range leases {
		held := 3 - 1
		assert.Equal(t, wire.CodeNone, releaseCode(t, c, l), "lease %d", i)
		assert.Len(t, slotMembers(t, srv.Addr, rkey), held, "lease %d: its slot went back", i)
		assert.Equal(t, wire.CodeNotFound, releaseCode(t, c, l), "lease %d released twice", i)
		assert.Len(t, slotMembers(t, srv.Addr, rkey), held, "lease %d released twice: no other slot went", i)
		// The freed slot is taken again; no more fits.
		r, err := c.Acquire(ctx, key, 1)
		require.NoError(t, err)
		require.True(t, r.Allowed())
		r2, err := c.Acquire(ctx, key, 1)
		require.NoError(t, err)
		assert.Equal(t, wire.StatusLimited, r2.Status, "lease %d: beyond the limit", i)
		assert.Len(t, slotMembers(t, srv.Addr, rkey), 3)
		leases[i] = r.Lease
	}
	for _, l := range leases {
		require.Equal(t, wire.CodeNone, releaseCode(t, c, l))
	}
	assert.Empty(t, slotMembers(t, srv.Addr, rkey))
}

// TestSlotsLoadDoubleRelease: 60 clients over 3 daemons on one Redis,
// for about 5 s, acquire slots of one key (limit 5), hold them briefly,
// release each through a random daemon and a third of them a second
// time: the slots held in Redis (ZCARD, sampled every 10 ms) never exceed
// the limit, nor do the holds the clients count; every first release
// frees its slot, every second one is not_found; at the end no slot is
// held.
func TestSlotsLoadDoubleRelease(t *testing.T) {
	t.Parallel()
	const (
		limit   = 5
		clients = 60
		run     = 5 * time.Second
	)
	srv := redistest.Standalone(t)
	cfg := slotCfg(fmt.Sprintf("redis = [%q]", srv.Addr), leaseKeyFile(t), limit)
	var cs []*client.Client
	for range 3 {
		p, err := daemontest.StartProcess(cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		c := client.New(p.Socket)
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	ctx := context.Background()
	key := []client.Descriptor{{Name: "api_key", Value: "sk_load"}}
	rkey := slotsKey("sk_load")

	var inFlight, maxInFlight, holds, doubles, shared atomic.Int64
	var maxZcard, samples atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			out, err := redistest.Do(srv.Addr, "ZCARD", rkey)
			if err != nil {
				t.Errorf("ZCARD: %v", err)
				return
			}
			n, err := strconv.ParseInt(out, 10, 64)
			if err != nil {
				t.Errorf("ZCARD %q: %v", out, err)
				return
			}
			samples.Add(1)
			for m := maxZcard.Load(); n > m && !maxZcard.CompareAndSwap(m, n); m = maxZcard.Load() {
			}
			if samples.Load()%10 == 0 {
				shared.Add(int64(sharedTimes(slotMembers(t, srv.Addr, rkey))))
			}
		}
	}()

	end := time.Now().Add(run)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 31))
			for time.Now().Before(end) {
				r, err := cs[i%len(cs)].Acquire(ctx, key, 1)
				if err != nil {
					t.Errorf("client %d: acquire: %v", i, err)
					return
				}
				if !r.Allowed() {
					time.Sleep(time.Duration(1+rng.IntN(3)) * time.Millisecond) // a refused caller comes back later
					continue
				}
				n := inFlight.Add(1)
				for m := maxInFlight.Load(); n > m && !maxInFlight.CompareAndSwap(m, n); m = maxInFlight.Load() {
				}
				holds.Add(1)
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond) // the request's work
				inFlight.Add(-1)
				if code := releaseCode(t, cs[rng.IntN(len(cs))], r.Lease); code != wire.CodeNone {
					t.Errorf("client %d: release: %v", i, code)
					return
				}
				if rng.IntN(3) == 0 {
					doubles.Add(1)
					if code := releaseCode(t, cs[rng.IntN(len(cs))], r.Lease); code != wire.CodeNotFound {
						t.Errorf("client %d: a second release answered %v, want not_found", i, code)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	t.Logf("%d holds, %d double releases, %d ZCARD samples, at most %d slots in Redis and %d holds counted; %d members sharing a time in the sampled sets",
		holds.Load(), doubles.Load(), samples.Load(), maxZcard.Load(), maxInFlight.Load(), shared.Load())
	require.Positive(t, samples.Load())
	assert.LessOrEqual(t, maxZcard.Load(), int64(limit), "slots in Redis beyond the limit")
	assert.LessOrEqual(t, maxInFlight.Load(), int64(limit), "holds beyond the limit")
	assert.Positive(t, doubles.Load())
	assert.Empty(t, slotMembers(t, srv.Addr, rkey), "every slot released")
}
