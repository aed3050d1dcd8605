package policy

import (
	"context"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
	"github.com/rld/rld/wire"
)

// Explanation is what Explain finds for a request.
type Explanation struct {
	// List is RuleDeny or RuleAllow when the request matches the deny or
	// the allow list (which decide before any rule), else "".
	List string
	// Rules are the rules whose match holds, in evaluation order.
	Rules []Match
}

// Match is one rule whose match holds for a request.
type Match struct {
	// Rule is the rule's name.
	Rule string
	// Key is the counter key's descriptors as "name=value" joined by ","
	// (see AppendKeyText); "" when Missing is set.
	Key string
	// Missing names a by descriptor the request lacks: the rule does not
	// count the request.
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
	// Result is what a check of the request's cost would get now, read
	// without consuming anything (a peek). Zero when Missing is set or
	// Err is not nil.
	Result algo.Result
	// Err is the store's error, if the peek failed.
	Err error
	// Overridden is set when an override sets Params; Blocked when a
	// block of the key is in force.
	Overridden, Blocked bool
}

// Explain lists every rule whose match holds for descs, with the limit in
// force and what the rule's store would answer a check of cost units now,
// consuming nothing. It reads the stores as PEEK does and changes no
// counter or metric.
func (p *Policy) Explain(ctx context.Context, now time.Time, descs []wire.Descriptor, cost int64) Explanation {
	if cost <= 0 {
		cost = 1
	}
	var e Explanation
	for i := range p.deny {
		if p.deny[i].matches(descs) {
			e.List = RuleDeny
			break
		}
	}
	if e.List == "" && p.blocked(descs, now.UnixNano()) {
		e.List = RuleDeny
	}
	if e.List == "" {
		for i := range p.allow {
			if p.allow[i].matches(descs) {
				e.List = RuleAllow
				break
			}
		}
	}
	var key []byte
	for i := range p.rules {
		r := &p.rules[i]
		if !r.applies(descs) {
			continue
		}
		m := Match{Rule: r.name, Mode: r.mode, Fail: r.fail, Shadow: r.shadow, Enforce: int(r.share)}
		ti := r.tier(descs)
		if ti >= 0 {
			m.Tier = r.tiers[ti].name
		}
		m.Params = *r.paramsAt(ti)
		for _, name := range r.by {
			if _, ok := lookup(descs, name); !ok {
				m.Missing = name
				break
			}
		}
		if m.Missing == "" {
			text, _ := r.appendKeyText(nil, descs)
			m.Key = string(text)
			var ok bool
			key, ok = r.appendKey(key[:0], descs)
			if ok {
				if r.keyBlocked(key, now.UnixNano()) {
					m.Blocked = true
				}
				m.Enforced = !r.shadow && r.enforces(key)
				pi := r.limitIndex(ti, key, descs, now.UnixNano())
				m.Params, m.Overridden = *r.paramsAt(pi), r.overridden(pi)
				m.Result, m.Err = r.store.Take(ctx, key, m.Params, cost, now, true)
			}
		}
		e.Rules = append(e.Rules, m)
	}
	return e
}

// AppendKeyText appends to dst the readable form of the counter key of
// rule for descs — its by descriptors as "name=value" joined by "," —
// and reports whether rule exists and every by descriptor is present. It
// allocates nothing beyond growing dst.
func (p *Policy) AppendKeyText(dst []byte, rule string, descs []wire.Descriptor) ([]byte, bool) {
	for i := range p.rules {
		if p.rules[i].name == rule {
			return p.rules[i].appendKeyText(dst, descs)
		}
	}
	return dst, false
}

func (r *rule) appendKeyText(dst []byte, descs []wire.Descriptor) ([]byte, bool) {
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
