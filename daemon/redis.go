package daemon

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/breaker"
	"github.com/rld/rld/config"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redisx"
	"github.com/rld/rld/shardcache"
)

// Heartbeats: every daemon on a Redis says it is live every
// heartbeatEvery; one that has not for heartbeatTTL no longer counts.
const (
	heartbeatEvery = time.Second
	heartbeatTTL   = 3 * time.Second
)

// syncTimeout bounds the heartbeat's and the last sync's calls, as a
// sync's own.
const syncTimeout = redisx.DefaultSyncTimeout

// fleet is the daemon's part in a fleet sharing one Redis: the Redis
// store, the hot-key cache in front of it, the heartbeats that count the
// live daemons, and the local fallback of the rules whose Redis calls
// fail. It implements policy.Health.
type fleet struct {
	c        *redisx.Client
	rs       *redisx.Store
	cache    *shardcache.Cache
	recalls  *redisx.Recalls
	fallback *policy.Fallback
	id       string
	// password and tls are the store's credentials, as read at start
	// (the region's connections to the same Redis use them).
	password string
	tls      *tls.Config
	peers    atomic.Int64 // live daemons at the last heartbeat (1 until known)
	stop     context.CancelFunc
	done     sync.WaitGroup
}

// redisOptions returns the options of the Redis client that sc
// describes, authenticating with password, over TLS with tc when set.
func redisOptions(sc *config.Store, password string, tc *tls.Config) redisx.Options {
	return redisx.Options{
		TLS:       tc,
		Addrs:     sc.Redis,
		Mode:      redisx.Mode(sc.Mode),
		MasterSet: sc.MasterSet,
		Username:  sc.Username,
		Password:  password,
		KeyPrefix: sc.KeyPrefix,
		Timeout:   time.Duration(sc.Timeout),
		Breaker: breaker.Options{
			FailureRate: sc.BreakerFailureRate,
			MinCalls:    sc.BreakerMinCalls,
			Failures:    sc.BreakerFailures,
			Window:      time.Duration(sc.BreakerWindow),
			Cooldown:    time.Duration(sc.BreakerCooldown),
		},
	}
}

// newFleet builds the store, the cache and the fallback on the Redis
// client c as sc configures them. The cache and the fallback wait on
// Redis as long as c does: its timeout, store.timeout or redisx's default.
func newFleet(c *redisx.Client, sc *config.Store) *fleet {
	f := &fleet{c: c, rs: redisx.NewStore(c), recalls: redisx.NewRecalls(c), id: daemonID()}
	timeout := c.Options().Timeout
	f.peers.Store(1)
	f.cache = shardcache.New(f.rs, shardcache.Options{
		SyncInterval: time.Duration(sc.SyncInterval),
		MaxEntries:   sc.MaxKeys,
		Timeout:      timeout,
		Peers:        func() int { return int(f.peers.Load()) },
		Clock:        time.Now,
		Holder:       f.id,
		Recall: func(ctx context.Context, key []byte, kind algo.Kind) error {
			_, err := f.recalls.Publish(ctx, redisx.Recall{Kind: kind, Key: key, From: f.id})
			return err
		},
		Refunded: func(ctx context.Context, key []byte, kind algo.Kind) error {
			_, err := f.recalls.Publish(ctx, redisx.Recall{Kind: kind, Key: key, From: f.id, Refunded: true})
			return err
		},
	})
	f.fallback = policy.NewFallback(policy.FallbackOptions{
		Health: f,
		NewLocal: func() policy.LocalStore {
			return memstore.New(memstore.Options{MaxKeys: sc.MaxKeys})
		},
		Timeout: timeout,
		Seed:    f.cache.Known, // an outage starts from what the cache knew
		Clock:   time.Now,
	})
	return f
}

// stores returns the policy's stores on the fleet: the cache for cached
// rules, its strict side for strict rules, and the fallback for the
// rules whose Redis calls fail.
func (f *fleet) stores() policy.Stores {
	return policy.Stores{Cached: f.cache, Strict: f.cache.Strict(), Fallback: f.fallback}
}

// Peers returns the live daemons at the last heartbeat that reached
// Redis (1 until one has). It implements policy.Health.
func (f *fleet) Peers() int { return int(f.peers.Load()) }

// RetryAt returns when the next probe of an open circuit breaker may go,
// or the zero time when all are closed. It implements policy.Health.
func (f *fleet) RetryAt() time.Time { return f.c.RetryAt() }

// daemonID names this daemon in the heartbeats: host, pid and a random
// suffix, so that a restarted daemon is a new member.
func daemonID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// start runs the sync loop and the heartbeats until close.
func (f *fleet) start(log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	f.done.Add(3)
	go func() {
		defer f.done.Done()
		f.cache.Run(ctx)
	}()
	go func() {
		defer f.done.Done()
		f.watchRecalls(ctx, log)
	}()
	go func() {
		defer f.done.Done()
		f.heartbeat(ctx, log)
	}()
}

// heartbeat writes this daemon's heartbeat every heartbeatEvery and keeps
// the count of live daemons; while Redis fails, the last count stands. A
// lower count is taken only once no higher one has been seen for
// heartbeatTTL (peerCount): a Redis that restarted empty counts 1, then
// 2, … as the daemons beat again, and a divisor briefly too small would
// give each daemon too large a share.
// It also logs when Redis calls start and stop being refused (a circuit
// breaker not closed), and drops the fallback's local state once unused.
func (f *fleet) heartbeat(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	degraded := false
	var pc peerCount
	for {
		hctx, cancel := context.WithTimeout(ctx, syncTimeout)
		n, err := f.rs.Heartbeat(hctx, f.id, heartbeatTTL)
		cancel()
		if err == nil && n > 0 {
			n = pc.next(n, time.Now())
			if old := f.peers.Swap(int64(n)); old != int64(n) {
				log.Info("live daemons on redis", slog.Int("daemons", n))
			}
			livePeers.Set(float64(n))
		}
		if now := f.c.Degraded(); now != degraded {
			degraded = now
			if now {
				log.Warn("redis fails: circuit breaker open; rules follow their fail modes (open: local fair share, closed: deny)",
					slog.Int("daemons", f.Peers()), slog.Any("breakers", f.openBreakers()))
			} else {
				log.Info("redis answers again: circuit breakers closed")
			}
		}
		f.fallback.Sweep(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// peerCount smooths the heartbeat's count of live daemons: it follows a
// rise at once and a fall once the higher count has not been seen for
// heartbeatTTL: a daemon that left is counted out that much later (a
// share too small meanwhile, never too large).
type peerCount struct {
	n      int       // the count in force
	highAt time.Time // when a count ≥ n was last seen
}

// next returns the count in force after the heartbeat counted n at now.
func (pc *peerCount) next(n int, now time.Time) int {
	if n >= pc.n || now.Sub(pc.highAt) >= heartbeatTTL {
		pc.n, pc.highAt = n, now
	}
	return pc.n
}

// watchRecalls hands the other daemons' lease recalls, and their
// refunds' announcements, to the cache until ctx is done, subscribing
// again (with a backoff) when the subscription fails or is lost. A
// recall missed meanwhile costs at most a refusal: the holder's sync
// returns an idle lease within one interval; a refund's announcement
// missed, the key's denial here (a sync interval, or a hammered key's
// retry-after).
func (f *fleet) watchRecalls(ctx context.Context, log *slog.Logger) {
	redisx.Resubscribe(ctx, func(subscribed func()) error {
		return f.recalls.Subscribe(ctx, subscribed, func(r redisx.Recall) {
			switch {
			case r.From == f.id:
			case r.Refunded:
				f.cache.Corrected(r.Key, r.Kind)
			default:
				f.cache.Recalled(r.Key, r.Kind, time.Now())
			}
		})
	}, func(again bool) {
		if again {
			log.Info("subscribed to lease recalls again")
		}
	}, func(err error, first bool) {
		if first {
			log.Warn("no subscription to lease recalls; subscribing again", slog.Any("error", err))
		}
	})
}

// openBreakers returns the nodes whose breaker is not closed, with its
// state.
func (f *fleet) openBreakers() []string {
	var out []string
	for _, b := range f.c.Breakers() {
		if b.State != breaker.Closed {
			out = append(out, b.Node+" "+b.State.String())
		}
	}
	return out
}

// close stops the loops, returns every lease and leaves the heartbeats.
func (f *fleet) close(log *slog.Logger) {
	if f.stop != nil {
		f.stop()
		f.done.Wait()
	}
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	if err := f.cache.Close(ctx); err != nil {
		log.Warn("could not return every lease", slog.Any("error", err))
	}
	_ = f.rs.Leave(ctx, f.id)
}
