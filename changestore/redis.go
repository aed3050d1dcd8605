package changestore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/policy"
	"github.com/rld/rld/redisx"
)

// Redis keeps a fleet's changes in Redis (redisx.Changes): each
// daemon writes the changes it receives there, and applies every change
// on the announcement, or at the next poll of the version when it missed
// it. Expiries are in Redis TIME; skew is this daemon's offset to it.
//
// Each daemon keeps the set in force as Redis gave it, with the
// tombstones of the entries deleted, and the epoch and version it came
// with. A load that finds another epoch (Redis restarted without
// persistence: the hash is gone, or begun again by a change since) or
// the version lower (a failover to a replica that missed the last
// writes) writes that set back (restore) before it applies anything, so
// that the changes in force, blocks first, never lapse.
type Redis struct {
	rc      *redisx.Changes
	log     *slog.Logger
	skewNs  atomic.Int64
	version atomic.Int64 // the version of the set in force; -1 before the first load

	// Guarded by mu: the set in force as loaded, its tombstones and its
	// epoch ("" before the first load that found one).
	mu      sync.Mutex
	epoch   string
	entries map[string]redisx.ChangeEntry
	tombs   map[string]time.Time
}

var (
	changesLoadsAnnounced = metrics.NewCounter(`rld_changes_loads_total{via="announce"}`)
	changesLoadsPolled    = metrics.NewCounter(`rld_changes_loads_total{via="poll"}`)
	changesLoadErrors     = metrics.NewCounter(`rld_changes_load_errors_total`)
	// changesLost counts the times this daemon found that Redis had
	// lost the fleet's changes and began their restore; changesJoined
	// the times it added its set to a restore another daemon began.
	changesLost     = metrics.NewCounter(`rld_changes_restores_total{role="began"}`)
	changesJoined   = metrics.NewCounter(`rld_changes_restores_total{role="joined"}`)
	changesRestored = metrics.NewCounter(`rld_changes_restored_entries_total`)
)

// A change whose call times out or does not reach Redis is sent again
// until its context ends (the daemon bounds an admin op), waiting putRetry, then
// twice as long each time up to putRetryMax: a Cluster failover takes a
// few seconds to reach every client's topology.
const (
	putRetry    = 200 * time.Millisecond
	putRetryMax = time.Second
)

// LoadRetry is how soon a load of the changes that failed is tried
// again.
const LoadRetry = 250 * time.Millisecond

// NewRedis returns the store of the changes of the fleet on c; log gets
// its restores and the failures of Watch.
func NewRedis(c *redisx.Client, log *slog.Logger) *Redis {
	s := &Redis{rc: redisx.NewChanges(c), log: log}
	s.version.Store(-1)
	return s
}

// redisEntry is one entry's JSON in Redis: an override or a block.
type redisEntry struct {
	O *policy.Override `json:"o,omitempty"`
	B *policy.Block    `json:"b,omitempty"`
}

// Skew implements Store: Redis TIME minus the local clock, as of the
// last call.
func (s *Redis) Skew() time.Duration { return time.Duration(s.skewNs.Load()) }

func (s *Redis) stamp(st redisx.Stamp) { s.skewNs.Store(int64(st.Skew())) }

// Load implements Store. When Redis has lost changes of the set
// loaded before, it writes that set back first (see Redis).
func (s *Redis) Load(ctx context.Context) (*policy.Changes, error) {
	entries, tombs, st, err := s.rc.Load(ctx)
	if err == nil && s.forgot(st) {
		// Not applied: what Redis has lost stays in force here until
		// it has it back.
		if err = s.restore(ctx, st); err == nil {
			entries, tombs, st, err = s.rc.Load(ctx)
		}
	}
	if err != nil {
		changesLoadErrors.Inc()
		return nil, fmt.Errorf("cannot load the overrides and blocks from redis: %w", err)
	}
	s.stamp(st)
	s.mu.Lock()
	s.epoch, s.entries, s.tombs = st.Epoch, entries, tombs
	s.mu.Unlock()
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

// forgot reports whether Redis, at st, has lost changes of the set in
// force: its epoch is not the set's (gone, or new), or its version is
// below the set's.
func (s *Redis) forgot(st redisx.Stamp) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epoch == "" {
		return false // nothing known yet, or a hash from before epochs
	}
	return st.Epoch != s.epoch || st.Version < s.version.Load()
}

// restore writes the set in force back to Redis, which at st has lost
// changes of it, and logs and counts what it did.
func (s *Redis) restore(ctx context.Context, st redisx.Stamp) error {
	s.mu.Lock()
	entries, tombs, epoch := s.entries, s.tombs, s.epoch
	s.mu.Unlock()
	known := s.version.Load()
	res, after, err := s.rc.Restore(ctx, known, entries, tombs)
	if err != nil {
		s.log.Error("changes: redis has lost overrides and blocks, and they cannot be written back yet; those in force here stay in force",
			slog.Any("error", err))
		return err
	}
	changesRestored.Add(res.Entries)
	overrides, blocks := countKinds(entries)
	attrs := []any{
		slog.Int("held_overrides", overrides), slog.Int("held_blocks", blocks),
		slog.Int("deleted_held", len(tombs)), slog.Int("written_back", res.Entries),
		slog.String("epoch_was", epoch), slog.String("epoch_found", st.Epoch), slog.String("epoch", after.Epoch),
		slog.Int64("version_was", known), slog.Int64("version_found", st.Version), slog.Int64("version", after.Version),
	}
	if res.Began {
		changesLost.Inc()
		s.log.Error("changes: redis lost the fleet's overrides and blocks (restarted without persistence, or failed over to a replica that missed writes): restored them from this daemon's copy; give redis persistence (docs/operations.md)", attrs...)
		return nil
	}
	changesJoined.Inc()
	s.log.Warn("changes: redis lost the fleet's overrides and blocks and another daemon restored them: added this daemon's copy", attrs...)
	return nil
}

// countKinds counts the overrides and the blocks of entries, by id.
func countKinds(entries map[string]redisx.ChangeEntry) (overrides, blocks int) {
	for id := range entries {
		if strings.HasPrefix(id, "o-") {
			overrides++
		} else {
			blocks++
		}
	}
	return overrides, blocks
}

func (s *Redis) put(ctx context.Context, id string, e redisEntry, expires *time.Time, ttl time.Duration) error {
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

// AddOverride implements Store; a call that times out or does not
// reach Redis is sent again until ctx ends.
func (s *Redis) AddOverride(ctx context.Context, o *policy.Override, ttl time.Duration) error {
	return s.put(ctx, o.ID, redisEntry{O: o}, &o.Expires, ttl)
}

// AddBlock implements Store as AddOverride.
func (s *Redis) AddBlock(ctx context.Context, b *policy.Block, ttl time.Duration) error {
	return s.put(ctx, b.ID, redisEntry{B: b}, &b.Expires, ttl)
}

// Remove implements Store: an id without the prefix of its kind
// ("o-", "b-") names nothing.
func (s *Redis) Remove(ctx context.Context, override bool, id string) (bool, error) {
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

// current reports whether st is the version and epoch of the set in
// force.
func (s *Redis) current(st redisx.Stamp) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return st.Version == s.version.Load() && st.Epoch == s.epoch
}

// Watch calls apply, which loads the changes from s and installs them,
// until ctx is done: at each announcement on the pub/sub channel, at
// each (re)subscription (a message may have been missed), and when a
// poll of the version every interval finds it moved (the subscription
// may be lost without anyone knowing). A failed apply is logged and
// tried again after LoadRetry.
func (s *Redis) Watch(ctx context.Context, interval time.Duration, apply func(ctx context.Context) error) {
	kick := make(chan *metrics.Counter, 1)
	signal := func(via *metrics.Counter) {
		select {
		case kick <- via:
		default:
		}
	}
	go redisx.Resubscribe(ctx, func(subscribed func()) error {
		return s.rc.Subscribe(ctx, subscribed, func(v int64) {
			if v != s.version.Load() {
				signal(changesLoadsAnnounced)
			}
		})
	}, func(again bool) {
		if again {
			s.log.Info("changes: subscribed to the announcements again", slog.String("channel", s.rc.Key()))
		}
		signal(changesLoadsAnnounced)
	}, func(err error, first bool) {
		if first {
			s.log.Warn("changes: no subscription to the announcements; the poll of the version applies changes meanwhile",
				slog.String("channel", s.rc.Key()), slog.Duration("poll", interval), slog.Any("error", err))
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
			st, err := s.rc.Version(ctx)
			if err != nil || s.current(st) {
				if err == nil {
					s.stamp(st)
				}
				continue
			}
			via = changesLoadsPolled
		}
		if err := apply(ctx); err != nil {
			if !errors.Is(err, context.Canceled) {
				s.log.Warn("changes: cannot apply the fleet's changes; keeping those in force, trying again soon", slog.Any("error", err))
			}
			// Again soon, not at the next poll only: Redis may be
			// back in a moment (the announcement that failed is not
			// sent again).
			time.AfterFunc(LoadRetry, func() { signal(via) })
			continue
		}
		via.Inc()
	}
}
