package region

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// ErrGlobalUnanswered is wrapped in the error of a check of a strict
// key with no live share when the global store gave no share within the
// bound (strictWait): the rule's fail mode then decides the check.
var ErrGlobalUnanswered = errors.New("region: no share from the global store in time for a strict key")

//go:embed shares.lua
var sharesSource string

// sharesScript writes grants to the regional shares hash unless it holds
// later ones, deletes expired shares, and announces a change (shares.lua).
var sharesScript = rueidis.NewLuaScript(sharesSource)

// putShares writes puts (field, value pairs) to the regional shares hash
// on c, each unless the hash holds a later grant of its key, and deletes
// the fields of gone whose share expired by now; a change is announced
// on SharesChannel.
func putShares(ctx context.Context, c rueidis.Client, puts, gone []string, now time.Time) error {
	args := make([]string, 0, 3+len(puts)+len(gone))
	args = append(args, SharesChannel, strconv.FormatInt(now.UnixMilli(), 10), strconv.Itoa(len(puts)/2))
	args = append(append(args, puts...), gone...)
	if err := sharesScript.Exec(ctx, c, []string{SharesKey}, args).Error(); err != nil {
		return fmt.Errorf("region: write shares: %w", err)
	}
	return nil
}

// strictWaitIntervals is how long, in intervals, a check of a strict key
// with no live share waits for the key's renewal: a renewal fits in one
// interval (see docs/regions.md), the second covers the script's load on
// a global store that lost it (EVALSHA, then EVAL: two round trips).
const strictWaitIntervals = 2

// strictWait is the bound on a strict key's renewal for the checks that
// wait for it.
func (r *Region) strictWait() time.Duration { return strictWaitIntervals * r.o.Interval }

// flights holds the strict keys' renewals in flight: one per key.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

// flight is one strict key's renewal; done is closed when it ends.
type flight struct {
	start time.Time
	done  chan struct{}
	err   error
}

// join returns key's flight and whether the caller started it (and
// must run it).
func (fs *flights) join(key string) (*flight, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f := fs.m[key]; f != nil {
		return f, false
	}
	if fs.m == nil {
		fs.m = map[string]*flight{}
	}
	f := &flight{start: time.Now(), done: make(chan struct{})}
	fs.m[key] = f
	return f, true
}

// land ends key's flight f.
func (fs *flights) land(key string, f *flight) {
	fs.mu.Lock()
	delete(fs.m, key)
	fs.mu.Unlock()
	close(f.done)
}

// strictShare gives key (a strict rule's, limited by m) a share of its
// own when it has no live one: it renews the key on the global store at
// once, one renewal in flight per key (later checks wait for it), and
// installs the grant. It waits at most strictWait from the renewal's
// start (or until ctx is done), then fails with ErrGlobalUnanswered; the
// renewal goes on for up to a lease, and installs a late grant.
func (r *Region) strictShare(ctx context.Context, key []byte, m *meta, cost int64) error {
	k := string(key)
	f, lead := r.flights.join(k)
	if lead {
		go r.fly(k, *m, cost, f)
	}
	var err error
	select {
	case <-f.done: // landed already: its answer, whatever the time
		if err = f.err; err == nil {
			return nil
		}
		return r.unanswered(k, err)
	default:
	}
	t := time.NewTimer(time.Until(f.start.Add(r.strictWait())))
	defer t.Stop()
	select {
	case <-f.done:
		if err = f.err; err == nil {
			return nil
		}
	case <-t.C:
		err = fmt.Errorf("%w: no answer within %s", ErrGlobalUnanswered, r.strictWait())
	case <-ctx.Done():
		err = ctx.Err()
	}
	return r.unanswered(k, err)
}

// unanswered counts a check of strict key k that got no share, and
// returns its error.
func (r *Region) unanswered(k string, err error) error {
	r.st.strictUnanswered.Add(1)
	strictUnansweredM.Inc()
	return fmt.Errorf("region: strict key %q: %w", k, err)
}

// fly runs flight f: the renewal of strict key k.
func (r *Region) fly(k string, m meta, cost int64, f *flight) {
	defer r.flights.land(k, f)
	ctx, cancel := context.WithTimeout(context.Background(), r.o.Lease)
	defer cancel()
	if f.err = r.renewStrict(ctx, k, m, cost); f.err != nil {
		r.o.Logger.Warn("region: strict renewal", "key", k, "err", f.err)
	}
}

// renewStrict renews strict key k on the global store, with a demand of
// at least cost and the floor, installs the grant in the table and
// writes it to the regional shares hash (as the renewer writes it), so
// that the region's other daemons load it and the renewer renews it
// from its next pass on while the key is busy.
func (r *Region) renewStrict(ctx context.Context, k string, m meta, cost int64) error {
	l := r.ledgerOf()
	if l == nil {
		return fmt.Errorf("%w: global store not connected", ErrGlobalUnanswered)
	}
	floor := m.limit / int64(10*len(r.o.Regions))
	w := Want{Key: k, Demand: min(max(cost, floor, 1), m.limit), Limit: m.limit, Fallback: m.fallback, Floor: floor}
	g := l.Renew(ctx, []Want{w})[0]
	if g.Err != nil {
		r.st.renewErrs.Add(1)
		renewErrsM.Inc()
		return fmt.Errorf("%w: %w", ErrGlobalUnanswered, g.Err)
	}
	r.table.put(k, m, g.Share, g.Expiry, g.Stamp)
	r.st.strict.Add(1)
	strictM.Inc()
	if c := r.shared.Load(); c != nil {
		if err := putShares(ctx, *c, []string{m.field(k), formatShare(g.Share, g.Expiry, w.Demand, g.Stamp)}, nil, time.Now()); err != nil {
			r.o.Logger.Warn("region: write a strict key's share", "key", k, "err", err)
		}
	}
	return nil
}
