package region

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// meta is what the renewer needs to know of a key besides its demand:
// the limit its share is of, the limit's period and its fallback share.
type meta struct {
	limit, periodMs, fallback int64
}

// field returns the id of key in the regional hashes (demand, shares):
// "limit:periodMs:fallback:" and the counter key. A key's limit is part of
// its id, as one rule's tiers give its keys different limits.
func (m meta) field(key string) string {
	return strconv.FormatInt(m.limit, 10) + ":" + strconv.FormatInt(m.periodMs, 10) + ":" +
		strconv.FormatInt(m.fallback, 10) + ":" + key
}

// parseField splits a field id into its meta and counter key.
func parseField(f string) (meta, string, error) {
	var m meta
	var nums [3]int64
	rest := f
	for i := range nums {
		s, after, ok := strings.Cut(rest, ":")
		if !ok {
			return m, "", fmt.Errorf("region: field %q: want limit:period:fallback:key", f)
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return m, "", fmt.Errorf("region: field %q: bad number %q", f, s)
		}
		nums[i], rest = n, after
	}
	if nums[0] <= 0 || nums[1] <= 0 || nums[2] > nums[0] {
		return m, "", fmt.Errorf("region: field %q: limit and period must be positive and the fallback at most the limit", f)
	}
	return meta{limit: nums[0], periodMs: nums[1], fallback: nums[2]}, rest, nil
}

// entry is one key's share, as the renewer last wrote it.
type entry struct {
	meta
	share  int64
	expiry int64 // unix nanoseconds, on this region's clocks
	stamp  int64 // the grant's Stamp (0: unknown)
	// demand counts the units asked of the key since the last flush.
	demand *atomic.Int64
	// ask is the key's early-renewal request state, kept across installs.
	ask *ask
	// lastDemand is the region's demand at the last renewal, per period.
	lastDemand int64
	// local marks a share this daemon installed itself (a strict key's
	// renewal), kept by Install until the shares hash holds the key or
	// the share expires.
	local bool
}

// ask is one key's request for an early renewal: a daemon that refuses
// a check of a key with a live share marks it, at most once per gap; the
// region's loop publishes the marked keys to the renewer.
type ask struct {
	at      atomic.Int64 // when the key was last marked, unix ns
	pending atomic.Bool  // marked, not published yet
}

// mark marks the key at ns unless it was marked less than gap before,
// and reports whether it did.
func (a *ask) mark(ns, gap int64) bool {
	last := a.at.Load()
	if ns-last < gap || !a.at.CompareAndSwap(last, ns) {
		return false
	}
	a.pending.Store(true)
	return true
}

// Share is a key's lease as the shares table holds it.
type Share struct {
	// Units is the share of the rule's limit.
	Units int64
	// Limit is the limit the share is of.
	Limit int64
	// Expiry is when the share lapses; the key is then decided with its
	// fallback share.
	Expiry time.Time
	// Demand is the region's demand at the last renewal, per period.
	Demand int64
}

// pendShards is the number of shards of the demand of keys with no entry.
const pendShards = 64

// pend is the demand of a key that has no entry in the table yet.
type pend struct {
	n atomic.Int64
	meta
}

// Table holds the shares of a region's global keys, for every daemon, and
// counts their demand. Lookups read a copy-on-write map with no lock and
// no allocation; the demand of a key with an entry is an atomic counter
// in it. A key with no entry (new, or gone from the renewer's hash)
// counts its demand under one shard lock, allocating once at first sight.
type Table struct {
	m       atomic.Pointer[map[string]*entry]
	pending [pendShards]struct {
		mu sync.Mutex
		m  map[string]*pend
	}
}

// NewTable returns an empty table: every key is decided with its
// fallback share until Install gives it one.
func NewTable() *Table {
	t := &Table{}
	m := map[string]*entry{}
	t.m.Store(&m)
	for i := range t.pending {
		t.pending[i].m = map[string]*pend{}
	}
	return t
}

// lookup returns key's entry when it has one for limit, else nil.
func (t *Table) lookup(key []byte, limit int64) *entry {
	e := (*t.m.Load())[string(key)]
	if e == nil || e.limit != limit {
		return nil
	}
	return e
}

// Get returns key's share of limit at now and whether it has a live one.
func (t *Table) Get(key []byte, limit int64, now time.Time) (Share, bool) {
	e := t.lookup(key, limit)
	if e == nil {
		return Share{}, false
	}
	s := Share{Units: e.share, Limit: e.limit, Expiry: time.Unix(0, e.expiry), Demand: e.lastDemand}
	return s, now.UnixNano() < e.expiry
}

// share returns the units key may use of m.limit at now: its live share,
// or m.fallback (fell true), and its entry (nil when it has none). With
// cost > 0 it counts cost as demand.
func (t *Table) share(key []byte, m *meta, now time.Time, cost int64) (units int64, fell bool, e *entry) {
	e = t.lookup(key, m.limit)
	if e != nil {
		if cost > 0 {
			e.demand.Add(cost)
		}
		if now.UnixNano() < e.expiry {
			return e.share, false, e
		}
		return m.fallback, true, e
	}
	if cost > 0 {
		t.pendOf(key, m).n.Add(cost)
	}
	return m.fallback, true, nil
}

// refused marks key's entry for an early renewal after a refusal at
// now, at most once per gap, and reports whether it did: only a key with
// a live share of limit asks (a key on its fallback share is renewed at
// the next pass).
func (t *Table) refused(key []byte, limit int64, now time.Time, gap time.Duration) bool {
	return t.lookup(key, limit).refused(now, gap)
}

// refused marks e (nil: none) as Table.refused does.
func (e *entry) refused(now time.Time, gap time.Duration) bool {
	ns := now.UnixNano()
	return e != nil && ns < e.expiry && e.ask.mark(ns, int64(gap))
}

// TakeAsks returns the fields of the keys marked for an early renewal
// since the last call, and clears their marks.
func (t *Table) TakeAsks() []string {
	var out []string
	for k, e := range *t.m.Load() {
		if e.ask.pending.Swap(false) {
			out = append(out, e.field(k))
		}
	}
	return out
}

// pendOf returns the pending demand counter of key, creating it.
func (t *Table) pendOf(key []byte, m *meta) *pend {
	sh := &t.pending[xxhash.Sum64(key)%pendShards]
	sh.mu.Lock()
	p := sh.m[string(key)]
	if p == nil || p.limit != m.limit {
		p = &pend{meta: *m}
		sh.m[string(key)] = p
	}
	sh.mu.Unlock()
	return p
}

// Demand is one key's demand since the last Take.
type Demand struct {
	// Field is the key's id in the regional hashes (see meta.field).
	Field string
	// Units is the units asked.
	Units int64
}

// TakeDemand returns and resets the demand counted since the last call,
// and forgets the pending counters that counted nothing.
func (t *Table) TakeDemand() []Demand {
	var out []Demand
	for k, e := range *t.m.Load() {
		if n := e.demand.Swap(0); n > 0 {
			out = append(out, Demand{Field: e.field(k), Units: n})
		}
	}
	for i := range t.pending {
		sh := &t.pending[i]
		sh.mu.Lock()
		for k, p := range sh.m {
			n := p.n.Swap(0)
			if n > 0 {
				out = append(out, Demand{Field: p.field(k), Units: n})
			} else {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// Install replaces the table's shares by those in hash, the regional
// shares hash (field id → "units:expiry_ms:demand:stamp"). A key keeps
// its demand counter across installs. Entries that do not parse are
// skipped and reported in the error; the others are installed. A live
// share this daemon installed itself (put) stays while the hash holds
// no later grant of the key (the hash was read before put's write).
func (t *Table) Install(hash map[string]string) error {
	cur := t.m.Load()
	old := *cur
	m := make(map[string]*entry, len(hash))
	var errs []error
	for f, v := range hash {
		md, key, err := parseField(f)
		if err == nil {
			var sv shareValue
			sv, err = parseShareValue(v)
			if err == nil {
				e := t.carry(old, key, md, sv.units, sv.expMs)
				e.lastDemand, e.stamp = sv.demand, sv.stamp
				m[key] = e
				continue
			}
		}
		errs = append(errs, err)
	}
	now := time.Now().UnixNano()
	for {
		for k, e := range *cur {
			if !e.local || now >= e.expiry {
				continue // only a live strict grant of this daemon's own is kept
			}
			if o, ok := m[k]; !ok || o.stamp < e.stamp {
				m[k] = e
			}
		}
		if t.m.CompareAndSwap(cur, &m) {
			return errors.Join(errs...)
		}
		cur = t.m.Load() // a put since: keep its entry
	}
}

// put installs key's share of md.limit until exp, granted to this daemon
// by a strict key's renewal with stamp, keeping the other entries.
func (t *Table) put(key string, md meta, share int64, exp time.Time, stamp int64) {
	e := t.carry(*t.m.Load(), key, md, share, exp.UnixMilli())
	e.local, e.stamp = true, stamp
	for {
		cur := t.m.Load()
		if o := (*cur)[key]; o != nil && o.limit == md.limit {
			e.demand, e.ask, e.lastDemand = o.demand, o.ask, o.lastDemand
		}
		m := make(map[string]*entry, len(*cur)+1)
		for k, v := range *cur {
			m[k] = v
		}
		m[key] = e
		if t.m.CompareAndSwap(cur, &m) {
			return
		}
	}
}

// live reports whether key has a live share of limit at now.
func (t *Table) live(key []byte, limit int64, now time.Time) bool {
	e := t.lookup(key, limit)
	return e != nil && now.UnixNano() < e.expiry
}

// carry returns key's new entry, with the demand counter of its old
// entry or of its pending demand.
func (t *Table) carry(old map[string]*entry, key string, md meta, share, expMs int64) *entry {
	e := &entry{meta: md, share: share, expiry: expMs * int64(time.Millisecond)}
	if o := old[key]; o != nil && o.limit == md.limit {
		e.demand, e.ask = o.demand, o.ask
		return e
	}
	e.ask = new(ask)
	sh := &t.pending[xxhash.Sum64String(key)%pendShards]
	sh.mu.Lock()
	if p := sh.m[key]; p != nil && p.limit == md.limit {
		e.demand = &p.n
		delete(sh.m, key)
	}
	sh.mu.Unlock()
	if e.demand == nil {
		e.demand = new(atomic.Int64)
	}
	return e
}

// formatShare is the shares hash's value of share units until exp,
// granted for demand with stamp (the grant's Stamp):
// "units:expiry_ms:demand:stamp".
func formatShare(units int64, exp time.Time, demand, stamp int64) string {
	return strconv.FormatInt(units, 10) + ":" + strconv.FormatInt(exp.UnixMilli(), 10) + ":" +
		strconv.FormatInt(demand, 10) + ":" + strconv.FormatInt(stamp, 10)
}

// shareValue is a parsed shares hash value.
type shareValue struct{ units, expMs, demand, stamp int64 }

// parseShare parses a shares hash value's units and expiry.
func parseShare(v string) (units, expMs int64, err error) {
	sv, err := parseShareValue(v)
	return sv.units, sv.expMs, err
}

// parseShareValue parses a shares hash value; the demand and the stamp
// may be left out (0).
func parseShareValue(v string) (shareValue, error) {
	var nums [4]int64
	rest, n := v, 0
	for more := true; more; n++ {
		var p string
		p, rest, more = strings.Cut(rest, ":")
		var err error
		if n < len(nums) {
			nums[n], err = strconv.ParseInt(p, 10, 64)
		}
		if n == len(nums) || err != nil || nums[n] < 0 {
			return shareValue{}, fmt.Errorf("region: share %q: want units:expiry_ms:demand:stamp", v)
		}
	}
	if n < 2 {
		return shareValue{}, fmt.Errorf("region: share %q: want units:expiry_ms:demand:stamp", v)
	}
	return shareValue{units: nums[0], expMs: nums[1], demand: nums[2], stamp: nums[3]}, nil
}
