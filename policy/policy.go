package policy

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"slices"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/cespare/xxhash/v2"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
)

// Names that Decision.Rule takes when no rule of the configuration decided.
const (
	// RuleDeny: the request matched the deny list.
	RuleDeny = "deny"
	// RuleAllow: the request matched the allow list.
	RuleAllow = "allow"
	// RuleNone: no rule applied (Decision.Rule is "", metrics say "none").
	RuleNone = ""
)

// ErrCostTooLarge is wrapped by the Err of a decision whose cost exceeds
// the capacity of an applicable limit: such a request is never admitted.
var ErrCostTooLarge = errors.New("cost exceeds the limit's capacity")

// Policy decides requests against one configuration. It is immutable once
// built and safe for concurrent use; a reload builds a new Policy.
type Policy struct {
	stores   Stores
	fallback *Fallback // stores.Fallback
	deny     []selector
	allow    []selector
	rules    []rule
	infos    []RuleInfo
	changes  Changes // the run-time changes compiled in
	blocks   []globBlock
	orphans  []Orphan
	pens     *Penalties // the keys' penalty state: stores.Penalties, or the Policy's own
	leases   *Leases    // stores.Leases, or the Policy's own

	denyM, allowM, noneM *counters
}

// RuleInfo describes one rule for the admin API and the CLI.
type RuleInfo struct {
	Name string
	// Summary is the rule on one line, as config.Rule.Summary gives it.
	Summary string
}

// selector is one compiled entry of the allow or deny list, or of a rule's
// match table.
type selector struct {
	name string
	glob glob
}

// matches reports whether the first descriptor called s.name is present
// and its value matches.
func (s *selector) matches(descs []descriptor.Descriptor) bool {
	v, ok := lookup(descs, s.name)
	return ok && s.glob.match(v)
}

// rule is one compiled [[rule]].
type rule struct {
	name   string
	match  []selector
	by     []string
	prefix []byte      // name, 0x00: the start of every counter key
	base   algo.Params // the limit of a request with no listed tier
	tiers  []tier      // sorted by name
	shadow bool
	mode   config.Mode
	fail   config.Fail
	store  Store      // where the rule's counters live: by its mode
	local  LocalTaker // store, when it can answer on the host; else nil
	// The rest of store's capabilities, resolved once (capsOf).
	ops    Operator     // runs ops: required
	slots  SlotTaker    // holds slots by id; else nil
	denial DenialPeeker // answers a denied check's peeks cheaply; else nil
	m      *counters

	// share is the enforce share in basis points: a key whose hash
	// (keyShare) is below it is enforced, the others run as shadow.
	// config.FullShare enforces every key. rollout counts the denials
	// the share left unenforced (nil at the full share).
	share   uint32
	rollout *metrics.Counter

	// The run-time changes of the rule (see Changes); changed is set
	// when it has any.
	changed  bool
	ovParams []algo.Params        // the overrides' limits, len(tiers)+1 each
	keyOv    map[string][]ovEntry // newest first
	globOv   []globOverride
	keyBlock map[string]int64 // counter key → expiry, Unix nanoseconds

	pen *penaltyRule // penalty, block_after, retry_jitter; nil: none
}

type tier struct {
	name   string
	params algo.Params
}

// Decision is the answer to one check.
type Decision struct {
	// Status is StatusAllowed, StatusAllowedDegraded (allowed, and a
	// rule's store failed: see Fallback), StatusLimited, StatusBlocked
	// or StatusError.
	Status Status
	// Degraded is set when a rule whose store failed decided or took
	// part in the decision by its fail mode (see Fallback): every
	// StatusAllowedDegraded, and a StatusLimited made on local state
	// (fail = "open") or by a fail-closed rule.
	Degraded bool
	// Code says what failed when Status is StatusError.
	Code Code
	// Rule names the rule that decided: RuleDeny, RuleAllow, a rule of the
	// configuration, or RuleNone when no rule applied.
	Rule string
	// Result holds the deciding limit's numbers (zero when no rule applied).
	Result algo.Result
	// Period is the deciding limit's period.
	Period time.Duration
	// Params is the deciding limit (zero when no rule applied): its
	// sustained Limit per Period is what RateLimit-Policy advertises.
	Params algo.Params
	// Err describes a StatusError decision.
	Err error
}

// set makes d a decision by a rule: every field is written in place, as
// assigning a composite literal would build it on the stack and copy it.
func (d *Decision) set(status Status, degraded bool, rule string, res *algo.Result, params *algo.Params) {
	d.Status, d.Degraded, d.Code, d.Rule = status, degraded, CodeNone, rule
	d.Result, d.Period, d.Params, d.Err = *res, params.Period, *params, nil
}

// Scratch holds the buffers of one check so that a warm Scratch makes
// checks allocation-free. The zero value is ready to use. A Scratch is not
// safe for concurrent use: keep one per goroutine or connection.
type Scratch struct {
	keys  []byte  // the counter keys of this check, back to back
	taken []taken // the non-shadow takes of this check, in rule order
	// lease and leaseRaw hold the lease of an acquire (AcquireTo), and
	// its encoding before base64; mac signs it, under macKey.
	lease, leaseRaw []byte
	mac             hash.Hash
	macKey          []byte

	// Batch makes the checks' counts of rld_checks_total wait for Flush,
	// so that a batch of checks by one rule with one decision costs one
	// atomic add rather than one per check. Whoever sets it calls Flush
	// before the checks' answers are seen.
	Batch bool
	last  *metrics.Counter // the series counted since the last Flush
	n     int              // how many checks it has waiting
}

// count counts a check on c's series for decision d: at once, or at the
// next Flush when sc batches.
func (sc *Scratch) count(c *counters, d decision) {
	m := c[d]
	if !sc.Batch {
		m.Inc()
		return
	}
	if m != sc.last {
		sc.Flush()
		sc.last = m
	}
	sc.n++
}

// Flush adds the counts that wait in sc (see Batch) to their series.
func (sc *Scratch) Flush() {
	if sc.n > 0 {
		sc.last.Add(sc.n)
	}
	sc.last, sc.n = nil, 0
}

// taken is one admitted take, to refund or report. It holds no pointers,
// so that recording it costs no write barrier.
type taken struct {
	rule, tier int32  // indexes in Policy.rules and of the rule's limit (see paramsAt)
	start, end int32  // the key is keys[start:end]
	at         int64  // the store's Result.At, passed back by a refund
	slot       uint64 // a concurrency slot's id (SlotTaker), else 0
	shadow     bool   // a shadow rule's take: refunded, never reported
	local      bool   // taken from the Fallback's local state, not the rule's store
}

// take records a take of rule index i, tier ti, whose key is
// keys[start:end], decided at the store's time at, and returns it. It
// fills the entry in place: building it first and copying it in costs
// more than the rest of the bookkeeping.
func (sc *Scratch) take(i, ti, start, end int, at int64) *taken {
	n := len(sc.taken)
	if n == cap(sc.taken) {
		sc.taken = append(sc.taken, taken{})
	} else {
		sc.taken = sc.taken[:n+1]
	}
	t := &sc.taken[n]
	t.rule, t.tier, t.start, t.end, t.at = int32(i), int32(ti), int32(start), int32(end), at
	t.slot, t.shadow, t.local = 0, false, false
	return t
}

// Stores says where a Policy keeps its counters.
type Stores struct {
	// Cached holds the counters of rules with mode = "cached".
	Cached Store
	// Strict holds those of rules with mode = "strict"; nil means Cached.
	Strict Store
	// Fallback, when set, decides the checks of rules whose store call
	// failed, by each rule's fail mode (see Fallback); a check that
	// met a timeout asks no store again for its other rules. Nil (the
	// embedded store, which does not fail) answers a store error with a
	// StatusError decision, code internal.
	Fallback *Fallback
	// LeaseKey signs the leases of acquires (HMAC-SHA256), which
	// Release and Settle verify: the daemons of a fleet share it. Nil:
	// the random key of Leases.
	LeaseKey []byte
	// Leases numbers the leases and slots of acquires and remembers the
	// leases settled; the Policies compiled over one share it, so that a
	// lease acquired before a reload is settled once after it. Nil: each
	// Policy keeps its own.
	Leases *Leases
	// Penalties keeps the penalty state of the keys of rules with a
	// penalty or a block_after, and asks for their automatic blocks;
	// the Policies compiled over one share it. Nil: each Policy keeps its
	// own and asks for no block.
	Penalties *Penalties
	// Global, when set, gives a rule with scope = "global" its store:
	// the store of its mode, inner, wrapped so that the rule holds its
	// limit across regions (package region). A global rule with no
	// Global is an error.
	Global func(rule *config.Rule, inner Store) Store
}

// Compile compiles cfg, which Load or Parse has validated, with the
// run-time changes ch in force (nil: none), into a Policy that keeps each
// rule's counters in the store of its mode. Nothing is read from a file.
func Compile(cfg *config.Config, ch *Changes, st Stores) (*Policy, error) {
	p, err := NewStores(cfg, st)
	if err != nil {
		return nil, err
	}
	if ch != nil {
		p.compileChanges(ch)
	}
	return p, nil
}

// Changes returns the run-time changes p was compiled with, for the
// Policy that replaces it.
func (p *Policy) Changes() *Changes {
	return p.changes.Clone()
}

// New compiles cfg, which Load or Parse has validated, into a Policy that
// keeps all its counters in st.
func New(cfg *config.Config, st Store) (*Policy, error) {
	return NewStores(cfg, Stores{Cached: st})
}

// NewStores compiles cfg, which Load or Parse has validated, into a Policy
// that keeps each rule's counters in the store of its mode.
func NewStores(cfg *config.Config, st Stores) (*Policy, error) {
	if cfg == nil || st.Cached == nil {
		return nil, errors.New("policy: nil config or store")
	}
	if st.Strict == nil {
		st.Strict = st.Cached
	}
	p := &Policy{
		stores:   st,
		fallback: st.Fallback,
		denyM:    newCounters(RuleDeny, decBlocked),
		allowM:   newCounters(RuleAllow, decAllowed),
		noneM:    newCounters("none", decAllowed),
		leases:   st.Leases,
	}
	if p.leases == nil {
		p.leases = NewLeases()
	}
	var err error
	if p.deny, err = compileSelectors(cfg.Deny); err != nil {
		return nil, fmt.Errorf("policy: deny: %w", err)
	}
	if p.allow, err = compileSelectors(cfg.Allow); err != nil {
		return nil, fmt.Errorf("policy: allow: %w", err)
	}
	p.rules = make([]rule, len(cfg.Rules))
	p.infos = make([]RuleInfo, len(cfg.Rules))
	for i := range cfg.Rules {
		cr := &cfg.Rules[i]
		if err := compileRule(&p.rules[i], cr); err != nil {
			return nil, fmt.Errorf("policy: rule[%d] %q: %w", i, cr.Name, err)
		}
		p.rules[i].store = st.Cached
		if cr.Mode == config.ModeStrict {
			p.rules[i].store = st.Strict
		}
		if cr.IsGlobal() {
			if st.Global == nil {
				return nil, fmt.Errorf("policy: rule[%d] %q: scope = \"global\" and no global store", i, cr.Name)
			}
			p.rules[i].store = st.Global(cr, p.rules[i].store)
		}
		if err := p.rules[i].capsOf(p.rules[i].store); err != nil {
			return nil, fmt.Errorf("policy: rule[%d] %q: %w", i, cr.Name, err)
		}
		p.infos[i] = RuleInfo{Name: cr.Name, Summary: cr.Summary()}
		if p.rules[i].pen != nil && p.pens == nil {
			p.pens = st.Penalties
			if p.pens == nil {
				p.pens = NewPenalties(0, nil)
			}
		}
	}
	return p, nil
}

func compileSelectors(list []string) ([]selector, error) {
	out := make([]selector, 0, len(list))
	for _, s := range list {
		sel, err := config.ParseSelector(s)
		if err != nil {
			return nil, err
		}
		g, err := compileGlob(sel.Glob)
		if err != nil {
			return nil, fmt.Errorf("selector %q: %w", s, err)
		}
		out = append(out, selector{name: sel.Name, glob: g})
	}
	return out, nil
}

func compileRule(r *rule, cr *config.Rule) error {
	if err := config.CheckRuleName(cr.Name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	if len(cr.By) == 0 {
		return errors.New("no by descriptors")
	}
	kind, err := algo.ParseKind(cr.Algorithm)
	if err != nil {
		return err
	}
	params := func(limit int64) (algo.Params, error) {
		p := cr.Params(limit)
		p.Kind = kind
		return p, p.Validate()
	}
	*r = rule{
		name:   cr.Name,
		by:     slices.Clone(cr.By),
		prefix: append([]byte(cr.Name), 0),
		shadow: cr.Shadow,
		mode:   cr.Mode,
		fail:   cr.Fail,
		m:      newCounters(cr.Name, decAllowed, decLimited, decBlocked, decError, decShadowLimited, decAllowedDegraded, decLimitedDegraded),
		pen:    compilePenalty(cr),
	}
	AutoBlocks(cr.Name) // served from the start, as rld_checks_total is
	share, err := config.ParseShare(cr.Enforce)
	if err != nil {
		return fmt.Errorf("enforce: %w", err)
	}
	r.share = uint32(share)
	if share < config.FullShare {
		r.rollout = RolloutLimited(cr.Name)
	}
	for name, g := range cr.Match {
		if err := config.CheckGlob(g); err != nil {
			return fmt.Errorf("match.%s: %w", name, err)
		}
		cg, err := compileGlob(g)
		if err != nil {
			return fmt.Errorf("match.%s: %w", name, err)
		}
		r.match = append(r.match, selector{name: name, glob: cg})
	}
	// Map order is random: fix one so that every Policy of a file behaves
	// (and costs) the same.
	slices.SortFunc(r.match, func(a, b selector) int { return cmp.Compare(a.name, b.name) })
	if r.base, err = params(cr.DefaultLimit()); err != nil {
		return err
	}
	for name, limit := range cr.Tiers {
		p, err := params(limit)
		if err != nil {
			return fmt.Errorf("tiers.%s: %w", name, err)
		}
		r.tiers = append(r.tiers, tier{name: name, params: p})
	}
	slices.SortFunc(r.tiers, func(a, b tier) int { return cmp.Compare(a.name, b.name) })
	return nil
}

// Rules describes the rules in evaluation order.
func (p *Policy) Rules() []RuleInfo { return slices.Clone(p.infos) }

// Request is one request to decide: the descriptors it carries, at Now,
// taking Cost units (≤ 0 means 1) from every applicable limit; with Peek
// it is decided without taking anything. Nothing in it lifts a limit: a
// cost above a limit's capacity is refused (ErrCostTooLarge).
type Request struct {
	Now   time.Time
	Descs []descriptor.Descriptor
	Cost  int64
	Peek  bool
}

// ErrAcquirePeek is wrapped by the Err of an acquire whose Request peeks:
// an acquire holds what it admits, so it cannot peek.
var ErrAcquirePeek = errors.New("an acquire cannot peek")

// Check decides req, taking its cost from every applicable limit (or
// nothing when it peeks). sc may be nil, at the price of allocating.
//
// The deny list is consulted first, then the allow list; then every rule
// whose match holds and whose by descriptors are all present, in order.
// The request is allowed only when every such rule allows it; when one
// denies, the units already taken from the rules before it are refunded
// and that rule decides. When all allow, the rule with the least
// remaining decides. Shadow rules are counted but never deny or decide.
//
// When a rule's store fails and the Policy has a Fallback, the rule's
// fail mode decides for it (see Fallback): the check is then allowed
// degraded, or limited and degraded; what the rules before it took from
// their stores is refunded as usual when it denies.
func (p *Policy) Check(ctx context.Context, req *Request, sc *Scratch) Decision {
	var d Decision
	p.CheckTo(ctx, req, sc, &d)
	return d
}

// CheckTo is Check writing its Decision to d, which a hot path reuses: a
// Decision is too large to pass in registers, and copying one that was
// just written stalls the processor.
func (p *Policy) CheckTo(ctx context.Context, req *Request, sc *Scratch, d *Decision) {
	p.check(ctx, req, sc, d, false, false)
}

// TryCheckTo is CheckTo when every store the check needs answers on the
// host with no wait (see LocalTaker): it then decides and reports true.
// Otherwise it reports false, having taken nothing and counted nothing:
// the caller hands the check to CheckTo where waiting is fine. The
// daemon answers a read batch's checks inline this way, and hands off
// only those that wait on Redis.
func (p *Policy) TryCheckTo(ctx context.Context, req *Request, sc *Scratch, d *Decision) bool {
	return p.check(ctx, req, sc, d, true, false)
}

// check is CheckTo, or TryCheckTo when local: then a rule whose store
// cannot answer on the host makes it give back what it took and report
// false. With acquire (AcquireTo), the concurrency rules hold the slots
// they admit; otherwise they only look for a free one.
func (p *Policy) check(ctx context.Context, req *Request, sc *Scratch, d *Decision, local, acquire bool) bool {
	descs := req.Descs
	if sc == nil {
		sc = new(Scratch)
	}
	for i := range p.deny {
		if p.deny[i].matches(descs) {
			sc.count(p.denyM, decBlocked)
			*d = Decision{Status: StatusBlocked, Rule: RuleDeny}
			return true
		}
	}
	if len(p.blocks) > 0 && p.blocked(descs, req.Now.UnixNano()) {
		sc.count(p.denyM, decBlocked)
		*d = Decision{Status: StatusBlocked, Rule: RuleDeny}
		return true
	}
	for i := range p.allow {
		if p.allow[i].matches(descs) {
			sc.count(p.allowM, decAllowed)
			*d = Decision{Status: StatusAllowed, Rule: RuleAllow}
			return true
		}
	}

	sc.keys = sc.keys[:0]
	sc.taken = sc.taken[:0]
	// Field by field: a composite literal is built in a temporary and
	// copied, whose wide loads of narrow stores stall the processor (a
	// tenth of BenchmarkProcess's samples in a CPU profile).
	var c checking
	c.ctx, c.now, c.descs, c.cost, c.sc = ctx, req.Now, descs, max(req.Cost, 1), sc
	c.peek, c.local, c.acquire = req.Peek, local, acquire
	c.best, c.bestTier = -1, -1
	for i := range p.rules {
		switch p.step(&c, i, d) {
		case decided:
			return true
		case wait:
			return false
		}
	}

	if c.best < 0 {
		sc.count(p.noneM, decAllowed)
		*d = Decision{Status: StatusAllowed, Rule: RuleNone}
		return true
	}
	r := &p.rules[c.best]
	if c.degraded {
		sc.count(r.m, decAllowedDegraded)
		d.set(StatusAllowedDegraded, true, r.name, &d.Result, r.paramsAt(c.bestTier))
		return true
	}
	sc.count(r.m, decAllowed)
	d.set(StatusAllowed, false, r.name, &d.Result, r.paramsAt(c.bestTier))
	return true
}

// checking is one check as its rules' steps see it: the request, and
// what the steps before have found.
type checking struct {
	ctx         context.Context
	now         time.Time
	descs       []descriptor.Descriptor
	cost        int64
	peek, local bool // local: TryCheckTo
	acquire     bool // AcquireTo: concurrency rules hold their slots
	sc          *Scratch
	// degraded: a rule was decided by its fail mode. slow: a store call
	// timed out; with a Fallback, the other rules of this check are then
	// decided by their fail modes at once, so that the check waits on
	// the store for one timeout at most.
	degraded, slow bool
	// best is the allowing non-shadow rule with the least remaining, the
	// first of them on a tie: it decides when all allow. Its Result is
	// kept in the check's Decision, whose Result field the steps use as
	// their scratch until one decides: one copy less per rule than a
	// field here, on the hot path.
	best, bestTier int
}

// outcome is what one rule's step says of a check.
type outcome uint8

const (
	// pass: the rule does not apply, or never decides (a shadow rule):
	// the check goes on.
	pass outcome = iota
	// allow: the rule allows, its take recorded in the Scratch: the
	// check goes on.
	allow
	// decided: the rule decided the check, whose Decision is written
	// (what the rules before took is refunded when it denies).
	decided
	// wait: for TryCheckTo, the rule's store cannot answer on the host;
	// what was taken is given back and the check is undecided.
	wait
	// next: within a step, the phase found nothing to say: the next
	// phase goes on. A step never returns it.
	next
)

// ruleTake is what one rule's step asks of its store for a check.
type ruleTake struct {
	start, end int          // the counter key is the Scratch's keys[start:end]
	ti         int          // the index of the limit (see paramsAt)
	params     *algo.Params // the limit
	cost       int64        // the units to take: the check's, or 1 slot
	peek       bool         // take nothing: the check peeks, or a concurrency rule looks for a free slot
	hold       bool         // an admitted take is recorded: refunded if a later rule denies, leased by an acquire
	shadow     bool         // a shadow rule, or a key outside the enforce share: counted, never refused
	slot       uint64       // an acquire's slot id, when the store holds slots by id; else 0
}

// step decides rule index i for check c: it asks the rule's store (or
// its fail mode, when the store fails and there is a Fallback) and
// returns the outcome, writing the check's Decision to d when the rule
// decides it, and d.Result when it allows with the least remaining so
// far (c.best). (d is not kept in c: what c points to escapes with the
// context it holds, and a caller's Decision must not.)
//
// A rule's step never decides that a check is allowed: when it decides,
// it denies or fails, and when it makes a TryCheckTo wait, the check is
// undecided. Either way what the rules before it took is refunded, here,
// at the one exit.
func (p *Policy) step(c *checking, i int, d *Decision) outcome {
	var t ruleTake
	out := p.prepare(c, i, &t, d)
	if out == next {
		out = p.take(c, i, &t, d)
	}
	if out == decided || out == wait {
		p.refund(c.ctx, c.now, c.cost, c.peek, c.slow, c.sc)
	}
	return out
}

// prepare is the part of rule index i's step that needs no store: whether
// the rule applies, its counter key (appended to the Scratch's keys), its
// limit, a block of the key or a penalty's cooldown (which decide the
// check). It fills t and returns next when the rule's store is to be asked.
func (p *Policy) prepare(c *checking, i int, t *ruleTake, d *Decision) outcome {
	r := &p.rules[i]
	sc := c.sc
	if !r.applies(c.descs) {
		return pass
	}
	t.start = len(sc.keys)
	var ok bool
	if sc.keys, ok = r.appendKey(sc.keys, c.descs); !ok {
		sc.keys = sc.keys[:t.start]
		return pass // a by descriptor is missing: the rule does not count it
	}
	t.end = len(sc.keys)
	key := sc.keys[t.start:t.end]
	t.ti = r.tier(c.descs)
	if r.changed {
		if p.keyBlocked(c, r, key, d) {
			return decided
		}
		t.ti = r.limitIndex(t.ti, key, c.descs, c.now.UnixNano())
	}
	t.params = r.paramsAt(t.ti)
	// A shadow rule, or a key outside the rule's enforce share, is
	// counted and never refused.
	t.shadow = r.shadow || !r.enforces(key)
	// A concurrency rule holds slots for an acquire only: a check or a
	// peek looks for a free slot and holds none (nothing to release).
	// It holds (or looks for) one slot per request, whatever the cost:
	// the cost is the rate rules' units.
	t.peek, t.hold, t.cost = c.peek, true, c.cost
	if t.params.Kind == algo.Concurrency {
		t.cost = 1
		if !c.acquire {
			t.peek, t.hold = true, false
		}
	}
	if r.pen != nil && r.pen.penalty && !t.shadow {
		if ra, ok := p.pens.cooldown(r, key, c.descs, c.now.UnixNano(), c.peek); ok {
			// In a cooldown: refused here, until its end.
			sc.count(r.m, decLimited)
			res := algo.Result{Limit: t.params.Capacity(), Reset: ra, RetryAfter: ra, At: c.now.UnixMicro()}
			d.set(StatusLimited, false, r.name, &res, t.params)
			return decided
		}
	}
	return next
}

// keyBlocked reports whether rule r's counter key is blocked (a run-time
// change) at the check's time, and then writes the Decision to d.
func (p *Policy) keyBlocked(c *checking, r *rule, key []byte, d *Decision) bool {
	end, ok := r.keyBlockEnd(key, c.now.UnixNano())
	if !ok {
		return false
	}
	if r.pen != nil && r.pen.tracked && !c.peek {
		p.pens.sawBlock(key, end)
	}
	c.sc.count(r.m, decBlocked) // under the rule whose key is blocked
	*d = Decision{Status: StatusBlocked, Rule: r.name}
	return true
}

// take asks rule index i's store for t and returns what its answer says
// of the check: an allowing non-shadow rule's take is recorded (when it
// holds), and kept as the best when it leaves the least remaining.
func (p *Policy) take(c *checking, i int, t *ruleTake, d *Decision) outcome {
	r := &p.rules[i]
	var res algo.Result
	out, err := p.ask(c, r, t, &res)
	switch {
	case out == wait:
	case t.shadow:
		p.shadowed(c, i, t, &res, err)
		out = pass // never denies or decides
	case err != nil && p.fallback != nil:
		out = p.failMode(c, i, t, &res, err, d)
	case err != nil:
		*d = p.storeFailed(r, t.params, err)
		out = decided
	case !res.Allowed && res.RetryAfter == algo.Never:
		*d = p.costTooLarge(r, t.params, res, c.cost)
		out = decided
	case !res.Allowed:
		out = p.denied(c, i, t, &res, d)
	default:
		out = allow
		if t.hold {
			c.sc.take(i, t.ti, t.start, t.end, res.At).slot = t.slot
		}
	}
	if out == allow && (c.best < 0 || res.Remaining < d.Result.Remaining) {
		c.best, c.bestTier = i, t.ti
		d.Result = res
	}
	return out
}

// ask runs rule r's take t at its store, writing the answer to res, or
// returns wait when the check is a TryCheckTo that the store cannot
// answer on the host. After a timeout of the check's (c.slow), the store
// is not asked: errSkipped.
func (p *Policy) ask(c *checking, r *rule, t *ruleTake, res *algo.Result) (outcome, error) {
	key := c.sc.keys[t.start:t.end]
	st, slots := r.slots, r.slots != nil
	if slots && t.hold && t.params.Kind == algo.Concurrency && !t.peek {
		t.slot = p.leases.nextSlot()
	}
	var err error
	switch {
	case c.slow:
		err = errSkipped
	case c.local && t.slot != 0:
		return wait, nil // a slot is held at its store, never on the host
	case c.local:
		var ok bool
		if r.local != nil {
			*res, ok = r.local.TakeLocal(key, *t.params, t.cost, c.now, t.peek)
		}
		if !ok || (t.shadow && !res.Allowed) {
			// A shadow denial is counted at once: left to CheckTo, so
			// that it is counted once.
			return wait, nil
		}
	case t.slot != 0:
		*res, err = st.TakeSlot(c.ctx, key, *t.params, t.slot, c.now)
		c.slow = err != nil && p.fallback != nil && isTimeout(err)
	default:
		*res, err = r.store.Take(c.ctx, key, *t.params, t.cost, c.now, t.peek)
		c.slow = err != nil && p.fallback != nil && isTimeout(err)
	}
	return next, err
}

// shadowed counts the answer res (or err) of rule index i's store when
// t is a shadow take. An admitted one that holds is recorded, to be
// refunded with the others when a rule denies, so that shadow counts
// show what enforcing the rule would do.
func (p *Policy) shadowed(c *checking, i int, t *ruleTake, res *algo.Result, err error) {
	r := &p.rules[i]
	switch {
	case err != nil:
		c.sc.count(r.m, decError)
	case !res.Allowed:
		c.sc.count(r.m, decShadowLimited)
		if !r.shadow {
			r.rollout.Inc()
		}
	case t.hold:
		tk := c.sc.take(i, t.ti, t.start, t.end, res.At)
		tk.shadow, tk.slot = true, t.slot
	}
}

// failMode decides rule index i by its fail mode, the Fallback's, when
// its store failed with err: the answer goes to res, and an admitted
// take is recorded as the local state's.
func (p *Policy) failMode(c *checking, i int, t *ruleTake, res *algo.Result, err error, d *Decision) outcome {
	r := &p.rules[i]
	key := c.sc.keys[t.start:t.end]
	*res, err = p.fallback.decide(r.fail, regionParams(r.store, key, t.params, c.now), key, t.cost, t.slot, c.now, t.peek, err)
	switch {
	case err != nil:
		*d = p.storeFailed(r, t.params, err)
		return decided
	case !res.Allowed && res.RetryAfter == algo.Never:
		*d = p.costTooLarge(r, t.params, *res, c.cost)
		return decided
	case !res.Allowed:
		c.sc.count(r.m, decLimitedDegraded)
		d.set(StatusLimited, true, r.name, res, t.params)
		return decided
	}
	c.degraded = true
	if t.hold {
		tk := c.sc.take(i, t.ti, t.start, t.end, res.At)
		tk.local, tk.slot = true, t.slot
	}
	return allow
}

// denied decides the check that rule index i's store denied with res:
// the denial to report is the longest of its own (with a penalty's
// retry-after) and the later rules' (see longestDenial). It returns wait
// when a later rule's peek cannot be answered on the host (TryCheckTo).
func (p *Policy) denied(c *checking, i int, t *ruleTake, res *algo.Result, d *Decision) outcome {
	r0, res0, params0 := &p.rules[i], *res, t.params
	r, dres, params, ok := p.longestDenial(c, i, r0, res0, params0)
	if !ok {
		return wait // nothing left taken
	}
	if r0.pen != nil && !c.peek {
		key := c.sc.keys[t.start:t.end]
		res0.RetryAfter = p.pens.refused(r0, key, c.descs, c.now.UnixNano(), res0.RetryAfter)
		res0.Reset = max(res0.Reset, res0.RetryAfter)
		if r == r0 || res0.RetryAfter > dres.RetryAfter {
			r, dres, params = r0, res0, params0
		}
	}
	c.sc.count(r.m, decLimited)
	d.set(StatusLimited, false, r.name, &dres, params)
	return decided
}

// errSkipped is the store error of a rule whose store was not asked: an
// earlier rule of the check timed out.
var errSkipped = errors.New("store not asked: an earlier rule of the check timed out")

// longestDenial returns the denial to report when rule index i (r, with
// res and params) denied check c: the applicable non-shadow rule after it
// whose peek denies with the longest retry-after, if that is longer than
// r's. Retrying after a shorter one would only be refused again. When
// local (see TryCheckTo), a peek that cannot be answered on the host
// makes it report false.
func (p *Policy) longestDenial(c *checking, i int, r *rule, res algo.Result, params *algo.Params) (*rule, algo.Result, *algo.Params, bool) {
	sc, descs, now := c.sc, c.descs, c.now
	for j := i + 1; j < len(p.rules); j++ {
		o := &p.rules[j]
		if o.shadow || !o.applies(descs) {
			continue
		}
		start := len(sc.keys)
		var ok bool
		if sc.keys, ok = o.appendKey(sc.keys, descs); !ok || !o.enforces(sc.keys[start:]) {
			sc.keys = sc.keys[:start]
			continue
		}
		op := o.paramsAt(o.limitIndex(o.tier(descs), sc.keys[start:], descs, now.UnixNano()))
		cost := c.cost
		if op.Kind == algo.Concurrency {
			cost = 1 // one slot per request
		}
		var ores algo.Result
		var err error
		if c.local {
			var ok bool
			if o.local != nil {
				ores, ok = o.local.TakeLocal(sc.keys[start:], *op, cost, now, true)
			}
			if !ok {
				return r, res, params, false
			}
		} else if o.denial != nil {
			ores, err = o.denial.PeekForDenial(c.ctx, sc.keys[start:], *op, cost, now, res.RetryAfter)
		} else {
			ores, err = o.store.Take(c.ctx, sc.keys[start:], *op, cost, now, true)
		}
		if err != nil && isTimeout(err) {
			break // the store is slow: answer with what is known
		}
		if err == nil && !ores.Allowed && ores.RetryAfter != algo.Never && ores.RetryAfter > res.RetryAfter {
			r, res, params = o, ores, op
		}
	}
	return r, res, params, true
}

// costTooLarge is the answer to a check whose cost exceeds the capacity
// of rule r's limit params (res: the store's answer).
func (p *Policy) costTooLarge(r *rule, params *algo.Params, res algo.Result, cost int64) Decision {
	r.m.inc(decError)
	return Decision{
		Status: StatusError, Code: CodeCostTooLarge, Rule: r.name,
		Result: res, Period: params.Period, Params: *params,
		Err: fmt.Errorf("%w: cost %d, capacity %d of rule %q", ErrCostTooLarge, cost, params.Capacity(), r.name),
	}
}

// storeFailed is the answer to a check whose rule r's store failed with
// err when there is no Fallback (or the Fallback itself failed): an
// internal error. With a Fallback, the rule's fail mode decides (see
// Fallback).
func (p *Policy) storeFailed(r *rule, params *algo.Params, err error) Decision {
	r.m.inc(decError)
	return Decision{
		Status: StatusError, Code: CodeInternal, Rule: r.name, Period: params.Period,
		Err: fmt.Errorf("rule %q: %w", r.name, err),
	}
}

// refund gives back the units of every take in sc, which a later rule
// has made moot. A peek took nothing. Refunds outlive the caller's
// cancellation: a lost refund is lost quota. Takes from the Fallback's
// local state go back there; when slow (a store call of the check timed
// out), the store's are not given back, lost rather than waited for.
func (p *Policy) refund(ctx context.Context, now time.Time, cost int64, peek, slow bool, sc *Scratch) {
	if peek || len(sc.taken) == 0 {
		return
	}
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	for i := range sc.taken {
		t := &sc.taken[i]
		r := &p.rules[t.rule]
		params := r.paramsAt(int(t.tier))
		takenAt := now
		if t.at != 0 { // a store that does not say when it decided: now
			takenAt = time.UnixMicro(t.at)
		}
		cost := cost
		if params.Kind == algo.Concurrency {
			cost = 1 // the slot of this request, not its cost
		}
		switch {
		case t.slot != 0 && (t.local || !slow):
			// A slot goes back by its id: exactly this request's.
			op := algo.Op{Kind: algo.OpRelease, Key: sc.keys[t.start:t.end], Params: *params, N: 1, TakenAt: t.at, Slot: t.slot}
			if t.local {
				if p.fallback == nil || !p.fallback.do(&op, now) {
					refundErrors.Inc()
				}
			} else if !releaseSlot(ctx, r.ops, &op, now) {
				refundErrors.Inc()
			}
		case t.local:
			p.fallback.refund(sc.keys[t.start:t.end], params, cost, takenAt, now)
		case slow:
			refundErrors.Inc()
		default:
			if err := r.store.Refund(ctx, sc.keys[t.start:t.end], *params, cost, takenAt, now); err != nil {
				refundErrors.Inc()
			}
		}
	}
}

// enforces reports whether r enforces its counter key key: every key at
// the full share, else those whose keyShare is below the share. The hash
// is fixed, so raising the share keeps every key it enforced.
func (r *rule) enforces(key []byte) bool {
	return r.share >= config.FullShare || keyShare(key) < r.share
}

// keyShare places a counter key in the enforce shares: its xxhash, 0 to
// config.FullShare-1 (basis points). It is the same on every daemon and
// every run.
func keyShare(key []byte) uint32 {
	return uint32(xxhash.Sum64(key) % config.FullShare)
}

// releaseSlot runs the release op at o, the rule's store, and reports
// whether it ran without an error.
func releaseSlot(ctx context.Context, o Operator, op *algo.Op, now time.Time) bool {
	ops := [1]algo.Op{*op}
	return o.Do(ctx, ops[:], now) == nil && ops[0].Err == nil
}

// lookup returns the value of the first descriptor called name.
func lookup(descs []descriptor.Descriptor, name string) ([]byte, bool) {
	for i := range descs {
		if string(descs[i].Name) == name {
			return descs[i].Value, true
		}
	}
	return nil, false
}

// applies reports whether every match entry of r holds for descs.
func (r *rule) applies(descs []descriptor.Descriptor) bool {
	for i := range r.match {
		if !r.match[i].matches(descs) {
			return false
		}
	}
	return true
}

// appendKey appends r's counter key for descs to dst: the rule name, a
// zero byte, then for each by descriptor the uvarint length of its value
// and the value. Rule names contain no zero byte and values are length-
// prefixed, so distinct rules or values never share a key. It reports
// false when a by descriptor is missing.
func (r *rule) appendKey(dst []byte, descs []descriptor.Descriptor) ([]byte, bool) {
	dst = append(dst, r.prefix...)
	for _, name := range r.by {
		v, ok := lookup(descs, name)
		if !ok {
			return dst, false
		}
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	return dst, true
}

// tier returns the index of the tier of descs in r.tiers, or -1 when the
// tier descriptor is missing or names none of them: the base limit.
func (r *rule) tier(descs []descriptor.Descriptor) int {
	if len(r.tiers) > 0 {
		if v, ok := lookup(descs, config.TierDescriptor); ok {
			for i := range r.tiers {
				if string(v) == r.tiers[i].name {
					return i
				}
			}
		}
	}
	return -1
}

// paramsAt returns the limit of params index i: -1 the base limit, from
// 0 a tier's, from len(r.tiers) an override's (see limitIndex).
func (r *rule) paramsAt(i int) *algo.Params {
	switch {
	case i < 0:
		return &r.base
	case i < len(r.tiers):
		return &r.tiers[i].params
	}
	return &r.ovParams[i-len(r.tiers)]
}
