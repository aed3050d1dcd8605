package shardcache

import (
	"context"
	"fmt"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/deadline"
)

// Strict is the Store of strict rules: every decision is made by the
// store, and the checks of one key that arrive while its call is in
// flight go together in the next call. Nothing is leased, and nothing
// decides a check locally; the store's last answer for the key is kept
// (an entry with no lease, dropped after two idle syncs like any), so
// that Cache.Known tells a Fallback what the key had left when the
// store fails: a strict rule fails open from what was known before the
// outage, as a cached one does.
type Strict struct{ c *Cache }

// Strict returns the Store of strict rules, which shares c's store,
// timeout and coalescing.
func (c *Cache) Strict() *Strict { return &Strict{c: c} }

// Take decides cost units of p for key at the store; see Strict. It
// implements policy.Store.
func (s *Strict) Take(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error) {
	cost = max(cost, 1)
	if s.c.closed.Load() {
		return algo.Result{}, ErrClosed
	}
	if peek {
		storeDecided.Inc()
		return s.c.b.Take(ctx, key, p, cost, now, true)
	}
	// The deadline's timer is armed only if the check waits for a batch
	// (coalesce.Group.Do selects on Done then); a check that runs its
	// batch itself only passes the deadline on.
	dctx := deadline.New(ctx, time.Now().Add(s.c.o.Timeout))
	res, err := s.c.strict.Do(dctx, key, missReq{p: p, cost: cost, ns: now.UnixNano()})
	dctx.Stop()
	if err != nil {
		return algo.Result{}, fmt.Errorf("shardcache: strict: %w", err)
	}
	return res.r, nil
}

// Refund gives back cost units admitted at takenAt, at the store. It
// implements policy.Store.
func (s *Strict) Refund(ctx context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error {
	return s.c.b.Refund(ctx, key, p, cost, takenAt, now)
}

// runStrict decides one coalesced batch of strict checks of key in one
// store call: the costs in arrival order, the longest prefix that fits
// admitted.
func (c *Cache) runStrict(key string, reqs []missReq, out []missResp) error {
	p := reqs[0].p
	j := 0
	for j < len(reqs) && reqs[j].p == p {
		j++
	}
	costs := make([]int64, j)
	for k := range costs {
		costs[k] = reqs[k].cost
	}
	// All the run's calls together last at most the store's timeout: the
	// run holds the key's coalescing flight. (No timer unless a call
	// waits on Done: see package deadline.)
	dctx := deadline.New(context.Background(), time.Now().Add(c.o.Timeout))
	defer dctx.Stop()
	var ctx context.Context = dctx
	sent := c.o.Clock().UnixNano()
	admitted, _, r, err := c.b.TakeLease(ctx, []byte(key), p, costs, 0)
	storeCalls.Inc()
	batchSize.Update(float64(len(costs)))
	if err != nil {
		return err
	}
	storeDecided.Add(len(costs))
	c.noteStrict(key, p, r, sent, reqs[j-1].ns)
	for k := range costs {
		if k < admitted {
			out[k].r = algo.Result{Allowed: true, Limit: r.Limit, Remaining: r.Remaining, Reset: r.Reset, At: r.At}
		} else {
			out[k].r = r
		}
	}
	for k := j; k < len(reqs); k++ {
		r, err := c.b.Take(ctx, []byte(key), reqs[k].p, reqs[k].cost, time.Unix(0, reqs[k].ns), false)
		storeCalls.Inc()
		if err != nil {
			return err
		}
		out[k].r = r
	}
	return nil
}

// noteStrict keeps r, the store's answer at the call sent at sent to a
// batch of strict checks of key whose last came at ns, as the view of
// key's entry (see Strict): what Known tells a Fallback. One shard lock,
// and for a key new to the cache an entry.
func (c *Cache) noteStrict(key string, p algo.Params, r algo.Result, sent, ns int64) {
	sh := c.shard([]byte(key))
	sh.mu.Lock()
	e := c.entry(sh, key, p)
	c.learn(e, r, sent)
	c.touch(sh, e, ns, false) // kept while checked, dropped when idle
	sh.mu.Unlock()
}
