package policy

import (
	"context"
	"fmt"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
)

// Explanation is what Explain finds for a request.
type Explanation struct {
	// List is RuleDeny or RuleAllow when the request matches the deny or
	// the allow list (or a descriptor block), which decide before any
	// rule, else "".
	List string
	// Rules are the rules whose match holds, in evaluation order.
	Rules []Match
	// Decision is what a check of the request would answer now: its
	// status, code, deciding rule and numbers, found by the check's own
	// rules from the rules' peeks. Two things a peek cannot foresee: a
	// refusal's Retry-After may come out longer (a rule's penalty or
	// retry_jitter, applied when the check is refused), and a rule whose
	// store fails shows StatusError where a check would be decided by
	// the rule's fail mode.
	Decision Decision
}

// Match is one rule whose match holds for a request.
type Match struct {
	// Rule is the rule's name.
	Rule string
	// Key is the counter key's descriptors as "name=value" joined by ","
	// (see AppendKeyText); "" when Missing is set.
	Key string
	// Missing names a by descriptor the request lacks: the rule does not
	// apply to the request (it neither counts nor refuses it), and
	// Status, Result and Err are zero.
	Missing string
	// Tier is the tier whose limit applies; "" for the rule's base limit.
	Tier   string
	Params algo.Params
	Mode   config.Mode
	Fail   config.Fail
	Shadow bool
	// Enforce is the rule's enforce share in basis points (see
	// config.Rule.Enforce); Enforced reports whether the rule enforces
	// this key: not a shadow rule, and the key inside the share. A key
	// outside it is counted and never refused.
	Enforce  int
	Enforced bool
	// Status is what the rule says of a check of the request on its
	// own: StatusAllowed, StatusLimited (its limit, or a penalty
	// cooldown: Cooldown), StatusBlocked (a block of the key), or
	// StatusError (Code: CodeCostTooLarge when the cost exceeds the
	// limit's capacity, CodeInternal when the store failed). A rule that
	// is not Enforced says it and is never the one that refuses.
	Status Status
	Code   Code
	// Result is what a check of the request's cost would get now, read
	// without consuming anything (a peek); in a cooldown, what the
	// daemon answers until it ends. Zero when Missing is set, Blocked,
	// or Err is not nil.
	Result algo.Result
	// Err is the store's error, if the peek failed.
	Err error
	// Overridden is set when an override sets Params; Blocked when a
	// block of the key is in force; Cooldown when the key is in the
	// rule's penalty cooldown.
	Overridden, Blocked, Cooldown bool
	// Region is, for a global rule, the region's share of the key; nil
	// for a local rule.
	Region *RegionShare
}

// Explain lists every rule whose match holds for req's descriptors, with
// the limit in force, what each rule's store would answer a check of
// req's cost at req.Now, and the decision a check would get
// (Explanation.Decision), consuming nothing, whether req peeks or not. It
// reads the stores as PEEK does and changes no counter, penalty state or
// metric.
func (p *Policy) Explain(ctx context.Context, req *Request) Explanation {
	now, descs, cost := req.Now, req.Descs, max(req.Cost, 1)
	var e Explanation
	e.List = p.listOf(descs, now)
	var key []byte
	for i := range p.rules {
		r := &p.rules[i]
		if !r.applies(descs) {
			continue
		}
		var ok bool
		key, ok = r.appendKey(key[:0], descs)
		e.Rules = append(e.Rules, p.explainRule(ctx, now, r, key, ok, descs, cost))
	}
	e.Decision = p.explainDecision(&e, cost)
	return e
}

// listOf returns RuleDeny when the deny list or a descriptor block
// matches descs, RuleAllow when the allow list does, else "".
func (p *Policy) listOf(descs []descriptor.Descriptor, now time.Time) string {
	for i := range p.deny {
		if p.deny[i].matches(descs) {
			return RuleDeny
		}
	}
	if p.blocked(descs, now.UnixNano()) {
		return RuleDeny
	}
	for i := range p.allow {
		if p.allow[i].matches(descs) {
			return RuleAllow
		}
	}
	return ""
}

// explainRule is Explain's Match of rule r, whose counter key for descs
// is key (ok: every by descriptor is present).
func (p *Policy) explainRule(ctx context.Context, now time.Time, r *rule, key []byte, ok bool,
	descs []descriptor.Descriptor, cost int64) Match {
	m := Match{Rule: r.name, Mode: r.mode, Fail: r.fail, Shadow: r.shadow, Enforce: int(r.share)}
	ti := r.tier(descs)
	if ti >= 0 {
		m.Tier = r.tiers[ti].name
	}
	m.Params = *r.paramsAt(ti)
	if !ok {
		for _, name := range r.by {
			if _, ok := lookup(descs, name); !ok {
				m.Missing = name
				break
			}
		}
		return m
	}
	text, _ := r.appendKeyText(nil, descs)
	m.Key = string(text)
	at := now.UnixNano()
	m.Enforced = !r.shadow && r.enforces(key)
	pi := r.limitIndex(ti, key, descs, at)
	m.Params, m.Overridden = *r.paramsAt(pi), r.overridden(pi)
	if r.keyBlocked(key, at) {
		m.Blocked, m.Status = true, StatusBlocked
		return m
	}
	if r.pen != nil && r.pen.penalty && m.Enforced {
		if ra, in := p.pens.cooldown(r, key, descs, at, true); in {
			m.Cooldown, m.Status = true, StatusLimited
			m.Result = algo.Result{Limit: m.Params.Capacity(), Reset: ra, RetryAfter: ra, At: now.UnixMicro()}
			return m
		}
	}
	if m.Params.Kind == algo.Concurrency {
		cost = 1 // one slot per request, whatever the cost
	}
	m.Result, m.Err = r.store.Take(ctx, key, m.Params, cost, now, true)
	if rx, ok := r.store.(RegionExplainer); ok {
		rs := rx.ExplainRegion(key, m.Params, now)
		m.Region = &rs
	}
	switch {
	case m.Err != nil:
		m.Result, m.Status, m.Code = algo.Result{}, StatusError, CodeInternal
	case !m.Result.Allowed && m.Result.RetryAfter == algo.Never:
		m.Status, m.Code = StatusError, CodeCostTooLarge
	case !m.Result.Allowed:
		m.Status = StatusLimited
	default:
		m.Status = StatusAllowed
	}
	return m
}

// explainDecision returns the decision a check of e's request would get,
// by the rules of check: the lists first; then, in order, the first rule
// that blocks the key, or that enforces and refuses (a store error, a
// cost above capacity, a cooldown, its limit: then the later rule whose
// refusal lasts longest reports it, as longestDenial does); when every
// rule allows, the enforcing one with the least remaining.
func (p *Policy) explainDecision(e *Explanation, cost int64) Decision {
	switch e.List {
	case RuleDeny:
		return Decision{Status: StatusBlocked, Rule: RuleDeny}
	case RuleAllow:
		return Decision{Status: StatusAllowed, Rule: RuleAllow}
	}
	best := -1
	for i := range e.Rules {
		m := &e.Rules[i]
		switch {
		case m.Missing != "":
			continue
		case m.Blocked:
			return Decision{Status: StatusBlocked, Rule: m.Rule}
		case !m.Enforced:
			continue
		case m.Status == StatusError && m.Code == CodeCostTooLarge:
			return Decision{
				Status: StatusError, Code: CodeCostTooLarge, Rule: m.Rule,
				Result: m.Result, Period: m.Params.Period, Params: m.Params,
				Err: fmt.Errorf("%w: cost %d, capacity %d of rule %q", ErrCostTooLarge, cost, m.Params.Capacity(), m.Rule),
			}
		case m.Status == StatusError:
			return Decision{Status: StatusError, Code: CodeInternal, Rule: m.Rule, Period: m.Params.Period,
				Err: fmt.Errorf("rule %q: %w", m.Rule, m.Err)}
		case m.Status == StatusLimited:
			d := m
			if !m.Cooldown {
				d = longestExplained(e.Rules[i+1:], m)
			}
			var dec Decision
			dec.set(StatusLimited, false, d.Rule, &d.Result, &d.Params)
			return dec
		case best < 0 || m.Result.Remaining < e.Rules[best].Result.Remaining:
			best = i
		}
	}
	if best < 0 {
		return Decision{Status: StatusAllowed, Rule: RuleNone}
	}
	m := &e.Rules[best]
	var dec Decision
	dec.set(StatusAllowed, false, m.Rule, &m.Result, &m.Params)
	return dec
}

// longestExplained is longestDenial over explained rules: of m and the
// enforcing rules after it (rest) whose peek refuses, the one whose
// retry-after is longest (m on a tie).
func longestExplained(rest []Match, m *Match) *Match {
	for i := range rest {
		o := &rest[i]
		if o.Missing != "" || !o.Enforced || o.Blocked || o.Err != nil || o.Cooldown {
			continue
		}
		if !o.Result.Allowed && o.Result.RetryAfter != algo.Never && o.Result.RetryAfter > m.Result.RetryAfter {
			m = o
		}
	}
	return m
}

// AppendKeyText appends to dst the readable form of the counter key of
// rule for descs — its by descriptors as "name=value" joined by "," —
// and reports whether rule exists and every by descriptor is present. It
// allocates nothing beyond growing dst.
func (p *Policy) AppendKeyText(dst []byte, rule string, descs []descriptor.Descriptor) ([]byte, bool) {
	for i := range p.rules {
		if p.rules[i].name == rule {
			return p.rules[i].appendKeyText(dst, descs)
		}
	}
	return dst, false
}

func (r *rule) appendKeyText(dst []byte, descs []descriptor.Descriptor) ([]byte, bool) {
	for j, name := range r.by {
		v, ok := lookup(descs, name)
		if !ok {
			return dst, false
		}
		if j > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, name...)
		dst = append(dst, '=')
		dst = append(dst, v...)
	}
	return dst, true
}
