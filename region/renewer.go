package region

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/rueidis"
)

// renewerTTLIntervals is the renewer key's TTL in intervals: a renewer
// that stops extending it is replaced after at most this long, plus one
// interval until another daemon's tick tries.
const renewerTTLIntervals = 3

// Scripts on the regional Redis.
var (
	// extendScript extends the renewer key when ARGV[1] holds it.
	extendScript = rueidis.NewLuaScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0`)
	// resignScript deletes the renewer key when ARGV[1] holds it.
	resignScript = rueidis.NewLuaScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1]) end
return 0`)
	// takeDemandScript returns the demand hash and deletes it, at once.
	takeDemandScript = rueidis.NewLuaScript(`local h = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return h`)
)

// renewer is the renewer's own state, kept by the loop's goroutine.
type renewer struct {
	held     bool
	lastPass time.Time
	// idle counts the passes since a key last had demand; a key is
	// renewed idle once (its share shrinks and returns units), then
	// left to expire.
	idle map[string]int
	// last is each key's demand per period measured at the last pass,
	// for the trend of the next.
	last map[string]int64
	// sent is each key's last renewal (its want and grant), for the
	// early renewals a daemon asks for between passes.
	sent map[string]sent
	// early is when each key was last renewed early.
	early map[string]time.Time
	// rtt is the last renewal's round trip to the global store.
	rtt time.Duration
}

// sent is one key's last renewal.
type sent struct {
	want  Want
	grant Grant
}

// elect keeps or takes the renewer role and reports whether r holds it.
func (r *Region) elect(ctx context.Context) bool {
	c, ttl := r.local, (renewerTTLIntervals * r.o.Interval).Milliseconds()
	var held bool
	if r.renewer.held {
		n, err := extendScript.Exec(ctx, c, []string{RenewerKey}, []string{r.o.ID, itoa(ttl)}).AsInt64()
		held = err == nil && n == 1
	} else {
		err := c.Do(ctx, c.B().Set().Key(RenewerKey).Value(r.o.ID).Nx().PxMilliseconds(ttl).Build()).Error()
		held = err == nil
	}
	if held != r.renewer.held {
		r.o.Logger.Info("region: renewer role", "region", r.o.Region, "id", r.o.ID, "held", held)
		if held {
			renewerG.Add(1)
			r.renewer.idle = map[string]int{}
			r.renewer.last = map[string]int64{}
			r.renewer.sent = map[string]sent{}
			r.renewer.early = map[string]time.Time{}
			r.asked.take() // asks from before the role: stale
			r.renewer.lastPass = time.Time{}
		} else {
			renewerG.Add(-1)
		}
		r.renewer.held = held
		r.renewerHeld.Store(held)
	}
	return held
}

// Renewer reports whether r held the renewer role at its last tick.
func (r *Region) Renewer() bool { return r.renewerHeld.Load() }

// resign gives up the renewer role (on Close).
func (r *Region) resign(ctx context.Context) {
	if r.renewer.held && r.local != nil {
		resignScript.Exec(ctx, r.local, []string{RenewerKey}, []string{r.o.ID})
		r.renewer.held = false
		renewerG.Add(-1)
	}
	r.renewerHeld.Store(false)
}

// pass takes the region's demand, renews every key with demand or a live
// share on the global store, and writes the grants to the shares hash.
// A failed renewal changes nothing: the key keeps its share until expiry.
// Each of its three round trips (read, renew, write) has an interval.
// Keys whose grant was capped well below their target (the other regions
// still held the units), and keys a daemon asked to renew early, are
// renewed once more at once when that can end before deadline (see
// again): the other regions' renewals of the same tick have reached the
// global store by then, and returned what they no longer need.
func (r *Region) pass(deadline time.Time) {
	r.st.passes.Add(1)
	now := time.Now()
	elapsed := r.o.Interval
	if !r.renewer.lastPass.IsZero() {
		elapsed = windows(now.Sub(r.renewer.lastPass), r.o.Interval)
	}
	r.renewer.lastPass = now
	var demand map[string]int64
	var shares map[string]string
	err := r.step(func(ctx context.Context) (err error) {
		demand, shares, err = r.read(ctx)
		return err
	})
	if err != nil {
		r.o.Logger.Warn("region: renewal pass", "err", err)
		return
	}
	fields, wants := r.wants(demand, shares, now, elapsed)
	if len(wants) == 0 {
		return
	}
	l := r.ledgerOf()
	if l == nil {
		r.st.renewErrs.Add(int64(len(wants)))
		renewErrsM.Add(len(wants))
		return
	}
	sent := time.Now()
	grants := r.renew(l, fields, wants, shares, now)
	if time.Now().Add(time.Since(sent)).After(deadline) {
		return
	}
	fs, ws, old := r.again(fields, wants, grants, shares)
	if len(ws) > 0 {
		r.st.retries.Add(int64(len(ws)))
		r.renew(l, fs, ws, old, now)
	}
}

// again lists a pass's second renewals: the keys whose grant was capped
// at least the floor below its target, and the keys a daemon asked to
// renew early (see boost). It returns the fields, the wants and the
// shares before the pass of those keys.
func (r *Region) again(fields []string, wants []Want, grants []Grant, shares map[string]string) ([]string, []Want, map[string]string) {
	asked := r.asked.take()
	var fs []string
	var ws []Want
	old := map[string]string{}
	for i, g := range grants {
		if g.Err != nil {
			continue
		}
		w, capped := wants[i], g.Target-g.Share >= max(wants[i].Floor, 1)
		_, early := asked[fields[i]]
		if early {
			units, _, _ := parseShare(shares[fields[i]])
			w, early = boost(w, g, units)
		}
		if capped || early {
			if early {
				r.countEarly(fields[i])
			}
			fs, ws = append(fs, fields[i]), append(ws, w)
			old[fields[i]] = shares[fields[i]]
		}
	}
	return fs, ws, old
}

// boost returns the want of an early renewal of a key last renewed with
// w and granted g, whose share before that was units, and whether to
// renew it: only while the regions' demand is within the limit (else
// the regions contend for it, and refusals are due). Its demand is
// raised to twice its share (the larger of g's and units), but not so
// far that the regions' demand exceeds the limit: a region whose demand
// outruns its measure grows at once, as far as the free units go.
func boost(w Want, g Grant, units int64) (Want, bool) {
	if g.Demand > w.Limit {
		return w, false
	}
	d := min(2*max(units, g.Share, 1), w.Limit-(g.Demand-w.Demand))
	if d <= w.Demand {
		return w, false
	}
	w.Demand = d
	return w, true
}

// countEarly counts an early renewal of field f.
func (r *Region) countEarly(f string) {
	r.renewer.early[f] = time.Now()
	r.st.early.Add(1)
	earlyM.Inc()
}

// early renews at once the keys the region's daemons asked for (they
// refused them under their share) when that can end before deadline,
// the next pass; else the pass's second renewals take the asks. A key
// is renewed early at most once per askGap, from its last renewal (see
// boost).
func (r *Region) early(deadline time.Time) {
	l := r.ledger.Load()
	if l == nil || time.Now().Add(r.renewer.rtt).After(deadline) {
		return
	}
	now := time.Now()
	var fs []string
	var ws []Want
	old := map[string]string{}
	for f := range r.asked.take() {
		last, ok := r.renewer.sent[f]
		if !ok || now.Sub(r.renewer.early[f]) < r.askGap() || !now.Before(last.grant.Expiry) {
			continue
		}
		w, ok := boost(last.want, last.grant, last.grant.Share)
		if !ok {
			continue
		}
		r.countEarly(f)
		fs, ws = append(fs, f), append(ws, w)
		old[f] = formatShare(last.grant.Share, last.grant.Expiry, last.want.Demand, last.grant.Stamp)
	}
	if len(ws) > 0 {
		r.renew(l, fs, ws, old, now)
	}
}

// windows returns the span of the daemons' flushes a pass takes, d
// after the last pass: a whole number of intervals i (at least one), as
// the daemons flush at each multiple of i, whatever the renewer's own
// lateness; the nearest to d.
func windows(d, i time.Duration) time.Duration {
	return max((d+i/2)/i, 1) * i
}

// renew renews wants on l and writes their grants; shares holds the
// keys' previous values.
func (r *Region) renew(l *Ledger, fields []string, wants []Want, shares map[string]string, now time.Time) []Grant {
	var grants []Grant
	r.step(func(ctx context.Context) error {
		start := time.Now()
		grants = l.Renew(ctx, wants)
		r.renewer.rtt = time.Since(start)
		return nil
	})
	for i, g := range grants {
		if g.Err == nil {
			r.renewer.sent[fields[i]] = sent{want: wants[i], grant: g}
		}
	}
	r.step(func(ctx context.Context) error {
		r.write(ctx, fields, wants, shares, grants, now)
		return nil
	})
	return grants
}

// read takes the demand hash and reads the shares hash.
func (r *Region) read(ctx context.Context) (demand map[string]int64, shares map[string]string, err error) {
	c := r.local
	if demand, err = takeDemandScript.Exec(ctx, c, []string{DemandKey}, nil).AsIntMap(); err != nil {
		return nil, nil, fmt.Errorf("region: take demand: %w", err)
	}
	if shares, err = c.Do(ctx, c.B().Hgetall().Key(SharesKey).Build()).AsStrMap(); err != nil {
		return nil, nil, fmt.Errorf("region: read shares: %w", err)
	}
	return demand, shares, nil
}

// wants lists the renewals of a pass: every key with demand, and each
// key with a live share renewed once idle.
func (r *Region) wants(demand map[string]int64, shares map[string]string, now time.Time, elapsed time.Duration) ([]string, []Want) {
	var fields []string
	var wants []Want
	add := func(f string, units int64) {
		m, key, err := parseField(f)
		if err != nil {
			r.o.Logger.Warn("region: skip field", "err", err)
			return
		}
		// Demand per period of the limit, projected one interval ahead.
		period := m.periodMs * int64(time.Millisecond)
		per := project(mulDiv(units, period, int64(elapsed)), mulDiv(2, period, int64(elapsed)), r.renewer.last, f)
		floor := m.limit / int64(10*len(r.o.Regions))
		fields = append(fields, f)
		wants = append(wants, Want{Key: key, Demand: per, Limit: m.limit, Fallback: m.fallback, Floor: floor})
	}
	for f, units := range demand {
		delete(r.renewer.idle, f)
		add(f, max(units, 0))
	}
	for f, v := range shares {
		if _, busy := demand[f]; busy {
			continue
		}
		_, exp, err := parseShare(v)
		if err != nil || exp <= now.UnixMilli() {
			continue
		}
		if r.renewer.idle[f]++; r.renewer.idle[f] == 1 {
			add(f, 0)
		}
	}
	return fields, wants
}

// project returns the demand per period measured now for field f,
// projected along its trend since the last pass. A key's share is in
// force from about half an interval after its demand's window to one and
// a half after: a demand is projected to the end of that span, now + 2 ×
// (now − last) (rising: at most 3 × now; falling: at least now/2, so
// that the units a falling region will not use are free for a rising
// one a renewal sooner, its headroom and its bucket's level covering a
// fall that stops). A change of at most
// noise (the demand of two checks in the interval: a small key's count
// moves by that much at a steady rate) is no trend, and a larger one is
// projected less noise. It records now in last.
func project(now, noise int64, last map[string]int64, f string) int64 {
	prev, ok := last[f]
	last[f] = now
	if !ok {
		return now
	}
	switch d := now - prev; {
	case d > noise:
		return now + 2*(d-noise)
	case d < -noise:
		return max(now+2*(d+noise), now/2)
	}
	return now
}

// write stores the grants in the shares hash, counts them, and deletes
// the shares that expired with no renewal.
func (r *Region) write(ctx context.Context, fields []string, wants []Want, shares map[string]string, grants []Grant, now time.Time) {
	puts := make([]string, 0, 2*len(grants))
	renewed := make(map[string]bool, len(fields))
	for i, g := range grants {
		if g.Err != nil {
			r.st.renewErrs.Add(1)
			renewErrsM.Inc()
			r.o.Logger.Warn("region: renew", "err", g.Err)
			continue
		}
		renewed[fields[i]] = true
		r.count(shares[fields[i]], g, now)
		puts = append(puts, fields[i], formatShare(g.Share, g.Expiry, wants[i].Demand, g.Stamp))
	}
	var gone []string
	for f, v := range shares {
		if _, exp, err := parseShare(v); !renewed[f] && (err != nil || exp <= now.UnixMilli()) {
			gone = append(gone, f)
			delete(r.renewer.idle, f)
			delete(r.renewer.last, f)
			delete(r.renewer.sent, f)
			delete(r.renewer.early, f)
		}
	}
	if len(puts) == 0 && len(gone) == 0 {
		return
	}
	// One script: a grant that a strict key's renewal (another daemon's)
	// overtook stays out, an expired share renewed since stays in, and
	// the announcement follows the writes (a daemon that loads on it
	// reads them; on a Cluster, a late message only delays the load to
	// the next one or to the interval's load).
	if err := putShares(ctx, r.local, puts, gone, now); err != nil {
		r.o.Logger.Warn("region: write shares", "err", err)
	}
}

// count counts one grant: a renewal, a return when it lowered the live
// share old, a reclaim when it took expired shares.
func (r *Region) count(old string, g Grant, now time.Time) {
	r.st.renewals.Add(1)
	renewalsM.Inc()
	if units, exp, err := parseShare(old); err == nil && exp > now.UnixMilli() && g.Share < units {
		r.st.returns.Add(1)
		returnsM.Inc()
	}
	if g.Reclaimed > 0 {
		r.st.reclaims.Add(1)
		reclaimsM.Inc()
	}
}
