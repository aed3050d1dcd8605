package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
)

// DefaultPenaltyKeys bounds the keys a Penalties tracks when NewPenalties
// is given no bound.
const DefaultPenaltyKeys = 100_000

// AutoBlock is an automatic block that a rule's block_after asks for: the
// caller of NewPenalties stores it as an admin block would be stored.
type AutoBlock struct {
	// Rule is the rule's name.
	Rule string
	// Key is the value of each of the rule's by descriptors.
	Key map[string]string
	// For is how long the block lasts.
	For time.Duration
	// Reason says why ("automatic: ...").
	Reason string
}

// Penalties is the state of the keys refused by rules with a penalty or
// a block_after: when each key's last Retry-After ends, how many times
// in a row it retried before, whether it is in a cooldown. The state is
// per process and bounded: it survives the Policies compiled over it (a
// reload, a change) but is not shared by a fleet. It is safe for
// concurrent use.
type Penalties struct {
	mu      sync.Mutex
	m       map[string]penaltyEntry // counter key →
	max     int
	onBlock func(AutoBlock)
}

// NewPenalties returns a Penalties tracking at most maxKeys keys (≤ 0:
// DefaultPenaltyKeys), that calls onBlock (when not nil) when a key
// reaches its rule's block_after. onBlock is called on the check's
// goroutine, outside any lock: it must not wait.
func NewPenalties(maxKeys int, onBlock func(AutoBlock)) *Penalties {
	if maxKeys <= 0 {
		maxKeys = DefaultPenaltyKeys
	}
	return &Penalties{m: make(map[string]penaltyEntry), max: maxKeys, onBlock: onBlock}
}

// Len returns how many keys are tracked.
func (ps *Penalties) Len() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.m)
}

// penaltyEntry is one key's state; times are Unix nanoseconds.
type penaltyEntry struct {
	until    int64 // the end of the last Retry-After answered
	base     int64 // the Retry-After the limit gave at its last refusal
	early    int64 // refusals in a row while a Retry-After was running
	penal    bool  // in a cooldown: refused here until until
	winStart int64 // the start of block_after's window
	n        int64 // early refusals since winStart
	blocked  int64 // a block of the key lasts until then (asked by block_after, or seen); 0: none
	within   int64 // the rule's block_after.within, for eviction
}

// blockOver reports whether a block of the key has ended by now: the
// key's state then starts afresh (see Penalties.refused).
func (e *penaltyEntry) blockOver(now int64) bool {
	return e.blocked != 0 && now >= e.blocked
}

// sawBlock records that a check of r's key was refused by a block of the
// key that lasts until end: when it ends, the key's cooldown ends and
// its early refusals count from none again, as on the daemon whose
// block_after made the block. Only a key with state is touched.
func (ps *Penalties) sawBlock(key []byte, end int64) {
	ps.mu.Lock()
	if e, ok := ps.m[string(key)]; ok && e.blocked != end {
		e.blocked = end
		ps.m[string(key)] = e
	}
	ps.mu.Unlock()
}

// penaltyRule is the compiled penalty, block_after and retry_jitter of
// a rule.
type penaltyRule struct {
	tracked  bool // penalty or block_after: the key's state is kept
	penalty  bool
	after    int64
	factor   float64
	max      time.Duration
	block    bool
	blockN   int64
	within   time.Duration
	blockFor time.Duration
	jitter   config.Jitter
}

// compilePenalty returns cr's penalty rule, or nil when it has none.
func compilePenalty(cr *config.Rule) *penaltyRule {
	if cr.Penalty == nil && cr.BlockAfter == nil && cr.RetryJitter.IsZero() {
		return nil
	}
	pr := &penaltyRule{jitter: cr.RetryJitter}
	if pen := cr.Penalty; pen != nil {
		pr.penalty, pr.after, pr.factor, pr.max = true, pen.After, pen.Factor, time.Duration(pen.Max)
	}
	if b := cr.BlockAfter; b != nil {
		pr.block, pr.blockN, pr.within, pr.blockFor = true, b.Refusals, time.Duration(b.Within), time.Duration(b.For)
	}
	pr.tracked = pr.penalty || pr.block
	return pr
}

// jitter returns a random 0..the rule's retry_jitter to add to retry.
func (pr *penaltyRule) jitterFor(retry time.Duration) time.Duration {
	most := pr.jitter.Fixed
	if pr.jitter.Fraction > 0 {
		most = time.Duration(float64(retry) * pr.jitter.Fraction)
	}
	if most <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(most) + 1))
}

// cooldown reports whether r's key is in a cooldown at now, and how long
// it has left then; unless peek, the check counts as one more early
// retry, which lengthens the cooldown and counts toward block_after.
func (ps *Penalties) cooldown(r *rule, key []byte, descs []descriptor.Descriptor, now int64, peek bool) (time.Duration, bool) {
	ps.mu.Lock()
	e, ok := ps.m[string(key)]
	if ok && e.blockOver(now) {
		delete(ps.m, string(key)) // the block was the punishment: start afresh
		ok = false
	}
	ps.mu.Unlock()
	if !ok || !e.penal || now >= e.until {
		return 0, false
	}
	if peek {
		return time.Duration(e.until - now), true
	}
	return ps.refused(r, key, descs, now, time.Duration(e.base)), true
}

// refused records that r refused key at now, the limit saying retry
// after base, and returns the Retry-After to answer: base, lengthened by
// a penalty when the key retried early too often, plus jitter; never
// less than what is left of an earlier answer. It asks for an automatic
// block when the key reaches block_after.
func (ps *Penalties) refused(r *rule, key []byte, descs []descriptor.Descriptor, now int64, base time.Duration) time.Duration {
	pr := r.pen
	if !pr.tracked {
		return base + pr.jitterFor(base)
	}
	ps.mu.Lock()
	e, ok := ps.m[string(key)]
	if ok && e.blockOver(now) {
		e, ok = penaltyEntry{}, false // the block was the punishment: start afresh
	}
	if !ok {
		ps.makeRoom(now)
	}
	early := ok && now < e.until
	if early {
		e.early++
	} else {
		e.early, e.penal = 0, false // it honoured the last Retry-After
	}
	e.base = int64(base)
	retry := base
	if pr.penalty && e.early >= pr.after {
		k := float64(e.early - pr.after + 1)
		pen := float64(base) * math.Pow(pr.factor, k)
		if pen > float64(pr.max) {
			pen = float64(pr.max)
		}
		retry = max(retry, time.Duration(pen))
		e.penal = true
	}
	retry += pr.jitterFor(retry)
	if end := now + int64(retry); end > e.until {
		e.until = end
	} else {
		retry = time.Duration(e.until - now) // the end already answered
	}
	var fire bool
	if pr.block && early {
		e.within = int64(pr.within)
		if now-e.winStart >= int64(pr.within) {
			e.winStart, e.n = now, 0
		}
		e.n++
		if e.n >= pr.blockN && now >= e.blocked {
			e.blocked = now + int64(pr.blockFor)
			fire = true
		}
	}
	ps.m[string(key)] = e
	ps.mu.Unlock()
	if fire && ps.onBlock != nil {
		ps.onBlock(AutoBlock{
			Rule: r.name, Key: byValues(r, descs), For: pr.blockFor,
			Reason: fmt.Sprintf("automatic: refused %d times within %s, each while an earlier Retry-After was running", pr.blockN, config.Duration(pr.within)),
		})
	}
	return retry
}

// makeRoom drops the entries that no longer matter at now when the map
// is full, then arbitrary ones down to seven eighths of the bound. The
// caller holds mu.
func (ps *Penalties) makeRoom(now int64) {
	if len(ps.m) < ps.max {
		return
	}
	for k, e := range ps.m {
		if now >= e.until && now >= e.winStart+e.within {
			delete(ps.m, k)
		}
	}
	for k := range ps.m {
		if len(ps.m) <= ps.max*7/8 {
			break
		}
		delete(ps.m, k)
	}
}

// byValues returns the value of each of r's by descriptors in descs.
func byValues(r *rule, descs []descriptor.Descriptor) map[string]string {
	out := make(map[string]string, len(r.by))
	for _, name := range r.by {
		if v, ok := lookup(descs, name); ok {
			out[name] = string(v)
		}
	}
	return out
}

// LiftPenalty forgets the penalty state of the key of rule whose by
// descriptors have the values in key: a cooldown running ends, and the
// key's refusals toward block_after start again from none. It reports
// whether there was state to forget.
func (p *Policy) LiftPenalty(rule string, key map[string]string) bool {
	r := p.ruleNamed(rule)
	if r == nil || p.pens == nil {
		return false
	}
	k, ok := r.keyOf(key)
	if !ok {
		return false
	}
	return p.pens.forget(k)
}

// forget drops key's state and reports whether it had any.
func (ps *Penalties) forget(key string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	_, ok := ps.m[key]
	delete(ps.m, key)
	return ok
}
