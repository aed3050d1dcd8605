package daemon

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/policy"
	"github.com/rld/rld/redisx"
)

// redisChanges keeps a fleet's changes in Redis (redisx.Changes): each
// daemon writes the changes it receives there, and applies every change
// on the announcement, or at the next poll of the version when it missed
// it. Expiries are in Redis TIME; skew is this daemon's offset to it.
type redisChanges struct {
	rc      *redisx.Changes
	skewNs  atomic.Int64
	version atomic.Int64 // the version of the set in force; -1 before the first load
}

var (
	changesLoadsAnnounced = metrics.NewCounter(`rld_changes_loads_total{via="announce"}`)
	changesLoadsPolled    = metrics.NewCounter(`rld_changes_loads_total{via="poll"}`)
	changesLoadErrors     = metrics.NewCounter(`rld_changes_load_errors_total`)
)

// A change whose call times out or does not reach Redis is sent again
// until its context ends (an admin op has changeTimeout), waiting putRetry, then
// twice as long each time up to putRetryMax: a Cluster failover takes a
// few seconds to reach every client's topology.
const (
	putRetry    = 200 * time.Millisecond
	putRetryMax = time.Second
)

// loadRetry is how soon a load of the changes that failed is tried
// again.
const loadRetry = 250 * time.Millisecond

func newRedisChanges(c *redisx.Client) *redisChanges {
	s := &redisChanges{rc: redisx.NewChanges(c)}
	s.version.Store(-1)
	return s
}

// redisEntry is one entry's JSON in Redis: an override or a block.
type redisEntry struct {
	O *policy.Override `json:"o,omitempty"`
	B *policy.Block    `json:"b,omitempty"`
}

func (s *redisChanges) skew() time.Duration { return time.Duration(s.skewNs.Load()) }

func (s *redisChanges) stamp(st redisx.Stamp) { s.skewNs.Store(int64(st.Skew())) }

func (s *redisChanges) load(ctx context.Context) (*policy.Changes, error) {
	entries, st, err := s.rc.Load(ctx)
	if err != nil {
		changesLoadErrors.Inc()
		return nil, fmt.Errorf("cannot load the overrides and blocks from redis: %w", err)
	}
	s.stamp(st)
	ch := &policy.Changes{Skew: st.Skew()}
	for id, e := range entries {
		var re redisEntry
		if err := json.Unmarshal([]byte(e.Value), &re); err != nil {
			// Written by another version, or by hand: skip it, say so.
			changesLoadErrors.Inc()
			continue
		}
		switch {
		case re.O != nil:
			re.O.ID, re.O.Expires = id, e.Expires
			ch.Overrides = append(ch.Overrides, *re.O)
		case re.B != nil:
			re.B.ID, re.B.Expires = id, e.Expires
			ch.Blocks = append(ch.Blocks, *re.B)
		}
	}
	// A hash has no order: the order of creation decides which glob
	// override applies first, on every daemon the same.
	slices.SortFunc(ch.Overrides, func(a, b policy.Override) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	slices.SortFunc(ch.Blocks, func(a, b policy.Block) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	s.version.Store(st.Version)
	return ch, nil
}

func (s *redisChanges) put(ctx context.Context, id string, e redisEntry, expires *time.Time, ttl time.Duration) error {
	v, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("cannot encode the change: %w", err)
	}
	at := *expires
	if ttl > 0 {
		at = time.Time{}
	}
	// A put is idempotent (the same id and value): try again after a
	// timeout or a failure to reach Redis (on Cluster, right after a
	// failover, the first call may go to the node that failed) rather
	// than refuse the operator's change. A refusal by Redis is final.
	var exp time.Time
	var st redisx.Stamp
	var sent error // an attempt that timed out: it may have been applied
	wait := putRetry
	for try := 0; ; try++ {
		if try > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			wait = min(2*wait, putRetryMax)
		}
		exp, st, err = s.rc.Put(ctx, id, string(v), at, ttl)
		if redisx.IsTimeout(err) {
			sent = err
		}
		if err == nil || redisx.IsReply(err) || ctx.Err() != nil {
			break
		}
	}
	if err != nil && sent != nil {
		return fmt.Errorf("cannot store the change in redis (a call timed out, so it may still be stored as %s: see rld admin list): %w", id, err)
	}
	if err != nil {
		return fmt.Errorf("cannot store the change in redis: %w", err)
	}
	s.stamp(st)
	*expires = exp
	return nil
}

func (s *redisChanges) addOverride(ctx context.Context, o *policy.Override, ttl time.Duration) error {
	return s.put(ctx, o.ID, redisEntry{O: o}, &o.Expires, ttl)
}

func (s *redisChanges) addBlock(ctx context.Context, b *policy.Block, ttl time.Duration) error {
	return s.put(ctx, b.ID, redisEntry{B: b}, &b.Expires, ttl)
}

func (s *redisChanges) remove(ctx context.Context, override bool, id string) (bool, error) {
	if prefix := map[bool]string{true: "o-", false: "b-"}[override]; !strings.HasPrefix(id, prefix) {
		return false, nil
	}
	ok, st, err := s.rc.Delete(ctx, id)
	if err != nil {
		return false, fmt.Errorf("cannot delete the change in redis: %w", err)
	}
	s.stamp(st)
	return ok, nil
}

// watchChanges applies the fleet's changes until ctx is done: at each
// announcement on the pub/sub channel, at each (re)subscription (a
// message may have been missed), and when a poll of the version every
// interval finds it moved (the subscription may be lost without anyone
// knowing). Without Redis it does nothing.
func (d *Daemon) watchChanges(ctx context.Context, interval time.Duration) {
	rs, ok := d.chStore.(*redisChanges)
	if !ok {
		return
	}
	kick := make(chan *metrics.Counter, 1)
	signal := func(via *metrics.Counter) {
		select {
		case kick <- via:
		default:
		}
	}
	go redisx.Resubscribe(ctx, func(subscribed func()) error {
		return rs.rc.Subscribe(ctx, subscribed, func(v int64) {
			if v != rs.version.Load() {
				signal(changesLoadsAnnounced)
			}
		})
	}, func(again bool) {
		if again {
			d.log.Info("changes: subscribed to the announcements again", slog.String("channel", rs.rc.Key()))
		}
		signal(changesLoadsAnnounced)
	}, func(err error, first bool) {
		if first {
			d.log.Warn("changes: no subscription to the announcements; the poll of the version applies changes meanwhile",
				slog.String("channel", rs.rc.Key()), slog.Duration("poll", interval), slog.Any("error", err))
		}
	})
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var via *metrics.Counter
		select {
		case <-ctx.Done():
			return
		case via = <-kick:
		case <-t.C:
			st, err := rs.rc.Version(ctx)
			if err != nil || st.Version == rs.version.Load() {
				if err == nil {
					rs.stamp(st)
				}
				continue
			}
			via = changesLoadsPolled
		}
		d.reloadMu.Lock()
		err := d.reloadChangesLocked(ctx)
		d.reloadMu.Unlock()
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				d.log.Warn("changes: cannot apply the fleet's changes; keeping those in force, trying again soon", slog.Any("error", err))
			}
			// Again soon, not at the next poll only: Redis may be
			// back in a moment (the announcement that failed is not
			// sent again).
			time.AfterFunc(loadRetry, func() { signal(via) })
			continue
		}
		via.Inc()
	}
}
