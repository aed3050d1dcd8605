package policy

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/change"
	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
)

// Changes are the run-time changes in force over a configuration: the
// overrides and blocks that admin operations make. A Policy is compiled
// from a configuration plus its Changes (Compile); a change compiles a new
// Policy and swaps it in atomically, as a reload does, and a reload keeps
// the Changes in force. Entries are kept as given: an override whose rule
// the configuration no longer has stays, reported by Orphans, and applies
// again if the rule comes back.
type Changes struct {
	Overrides []Override `json:"overrides"`
	Blocks    []Block    `json:"blocks"`
	// Skew is how far the clock of the expiries is ahead of the checks'
	// clock: a fleet's expiries are in Redis TIME, and each daemon
	// subtracts its own offset to it, so that an entry expires at the
	// same moment on every daemon.
	Skew time.Duration `json:"-"`
}

// Clone returns a deep enough copy of ch to change its lists.
func (ch *Changes) Clone() *Changes {
	if ch == nil {
		return &Changes{}
	}
	return &Changes{Overrides: slices.Clone(ch.Overrides), Blocks: slices.Clone(ch.Blocks), Skew: ch.Skew}
}

// Override changes the limit of one rule for one counter key, or for the
// requests whose descriptors match globs (see change.Override).
type Override = change.Override

// Block refuses the requests whose descriptors match globs, or one
// counter key of one rule (see change.Block).
type Block = change.Block

// ErrUnknownRule is wrapped by the error of a change that names a rule the
// configuration does not have.
var ErrUnknownRule = errors.New("no such rule")

// ValidateOverride reports what is wrong with o against p's rules at now:
// an unknown rule (wrapping ErrUnknownRule), a key that does not name each
// of the rule's by descriptors, a bad glob, what o.Check finds (a limit or
// multiplier that is not positive, text too long), an expiry not after
// now, a limit the rule's algorithm cannot enforce.
func (p *Policy) ValidateOverride(o *Override, now time.Time) error {
	r := p.ruleNamed(o.Rule)
	if r == nil {
		return fmt.Errorf("rule %q: %w", o.Rule, ErrUnknownRule)
	}
	if err := checkTarget(r, o.Key, o.Match); err != nil {
		return err
	}
	if err := o.Check(); err != nil {
		return err
	}
	if !o.Expires.After(now) {
		return fmt.Errorf("expires %s is not in the future", o.Expires.UTC().Format(time.RFC3339Nano))
	}
	return overrideFits(r, o)
}

// overrideFits reports what is wrong with the limits o makes of r's: a
// period on a concurrency rule, a burst on an algorithm without one, a
// limit its algorithm cannot enforce (checkOverridden).
func overrideFits(r *rule, o *Override) error {
	switch kind := r.base.Kind; {
	case o.Period != 0 && kind == algo.Concurrency:
		return errors.New("period: a concurrency rule has no period (its timeout says how long a slot not released is held): give a limit or a multiplier")
	case o.Burst != 0 && kind != algo.TokenBucket && kind != algo.GCRA:
		return fmt.Errorf("burst: only token_bucket and gcra take a burst, not %s", kind)
	}
	for ti := -1; ti < len(r.tiers); ti++ {
		if err := checkOverridden(overrideParams(o, *r.paramsAt(ti))); err != nil {
			return fmt.Errorf("the overridden limit: %w", err)
		}
	}
	return nil
}

// checkOverridden reports what is wrong with the limit an override makes:
// what algo.Params.Validate finds, and a sliding_log limit above the
// configuration's MaxSlidingLogLimit.
func checkOverridden(pp algo.Params) error {
	if err := pp.Validate(); err != nil {
		return err
	}
	if pp.Kind == algo.SlidingLog && pp.Limit > config.MaxSlidingLogLimit {
		return fmt.Errorf("limit %d: sliding_log keeps one entry per admission, so its limit is at most %d", pp.Limit, config.MaxSlidingLogLimit)
	}
	return nil
}

// ValidateBlock reports what is wrong with b against p's rules at now:
// what b.Check finds, a bad glob, an unknown rule (wrapping
// ErrUnknownRule), a key that does not name each of the rule's by
// descriptors, an expiry not after now.
func (p *Policy) ValidateBlock(b *Block, now time.Time) error {
	if err := b.Check(); err != nil {
		return err
	}
	if b.Rule == "" {
		if err := checkGlobs(b.Match); err != nil {
			return err
		}
	} else {
		r := p.ruleNamed(b.Rule)
		if r == nil {
			return fmt.Errorf("rule %q: %w", b.Rule, ErrUnknownRule)
		}
		if err := checkTarget(r, b.Key, nil); err != nil {
			return err
		}
	}
	if !b.Expires.After(now) {
		return fmt.Errorf("expires %s is not in the future", b.Expires.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

func checkTarget(r *rule, key, match map[string]string) error {
	switch {
	case len(key) > 0 && len(match) > 0:
		return errors.New("give a key or match globs, not both")
	case len(key) == 0 && len(match) == 0:
		return fmt.Errorf("give a key (%v = value each) or match globs", r.by)
	case len(match) > 0:
		return checkGlobs(match)
	}
	if len(key) != len(r.by) {
		return fmt.Errorf("key: rule %q counts by %v: give exactly those descriptors", r.name, r.by)
	}
	for _, name := range r.by {
		if _, ok := key[name]; !ok {
			return fmt.Errorf("key: rule %q counts by %v: %s is missing", r.name, r.by, name)
		}
	}
	return nil
}

func checkGlobs(match map[string]string) error {
	for name, g := range match {
		if name == "" {
			return errors.New("match: empty descriptor name")
		}
		if err := config.CheckGlob(g); err != nil {
			return fmt.Errorf("match.%s: %w", name, err)
		}
	}
	return nil
}

// overrideParams returns the limit o makes of the limit in force in.
func overrideParams(o *Override, in algo.Params) algo.Params {
	out := in
	if o.Multiplier != 0 {
		out.Limit = scale(in.Limit, o.Multiplier)
		if in.Burst > 0 {
			out.Burst = scale(in.Burst, o.Multiplier)
		}
		return out
	}
	out.Limit = o.Limit
	if o.Period > 0 {
		out.Period = o.Period
	}
	switch {
	case o.Burst > 0:
		out.Burst = o.Burst
	case in.Burst > 0:
		out.Burst = max(1, int64(math.Round(float64(in.Burst)*float64(o.Limit)/float64(in.Limit))))
	}
	return out
}

func scale(n int64, f float64) int64 {
	v := math.Round(float64(n) * f)
	if v >= math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return max(1, int64(v))
}

// Orphan is a change that names a rule the configuration in force does not
// have: it applies to nothing until the rule comes back.
type Orphan struct {
	ID   string
	Rule string
}

// Orphans returns the changes p was compiled with that apply to nothing:
// their rule is gone, they no longer fit it, or a glob of theirs does not
// compile.
func (p *Policy) Orphans() []Orphan { return slices.Clone(p.orphans) }

// ruleNamed returns p's rule called name, or nil.
func (p *Policy) ruleNamed(name string) *rule {
	for i := range p.rules {
		if p.rules[i].name == name {
			return &p.rules[i]
		}
	}
	return nil
}

// ovEntry is one compiled override of a rule: its limit for tier index ti
// is rule.ovParams[first+ti+1], until exp (Unix nanoseconds).
type ovEntry struct {
	exp   int64
	first int
}

// globOverride is a compiled glob override.
type globOverride struct {
	match []selector
	ovEntry
}

// globBlock is a compiled glob block.
type globBlock struct {
	match []selector
	exp   int64
}

// compileChanges compiles ch into p, whose rules are compiled.
func (p *Policy) compileChanges(ch *Changes) {
	p.changes = *ch.Clone()
	for i := range ch.Overrides {
		o := &ch.Overrides[i]
		r := p.ruleNamed(o.Rule)
		if r == nil {
			p.orphans = append(p.orphans, Orphan{ID: o.ID, Rule: o.Rule})
			continue
		}
		e := ovEntry{exp: o.Expires.UnixNano() - int64(ch.Skew), first: len(r.ovParams)}
		if overrideFits(r, o) != nil {
			// Validated against another configuration (the rule's
			// algorithm or period changed since), or before a check
			// it fails: it applies to nothing until it fits again.
			p.orphans = append(p.orphans, Orphan{ID: o.ID, Rule: o.Rule})
			continue
		}
		for ti := -1; ti < len(r.tiers); ti++ {
			r.ovParams = append(r.ovParams, overrideParams(o, *r.paramsAt(ti)))
		}
		r.changed = true
		if len(o.Key) > 0 {
			key, ok := r.keyOf(o.Key)
			if !ok {
				p.orphans = append(p.orphans, Orphan{ID: o.ID, Rule: o.Rule})
				continue
			}
			if r.keyOv == nil {
				r.keyOv = map[string][]ovEntry{}
			}
			// The overrides come in the order they were set: the
			// newest of a key goes first, and applies while it has
			// not expired; then the one before it does.
			r.keyOv[key] = slices.Insert(r.keyOv[key], 0, e)
			continue
		}
		match, ok := selectors(o.Match)
		if !ok {
			p.orphans = append(p.orphans, Orphan{ID: o.ID, Rule: o.Rule})
			continue
		}
		r.globOv = append(r.globOv, globOverride{match: match, ovEntry: e})
	}
	for i := range ch.Blocks {
		b := &ch.Blocks[i]
		exp := b.Expires.UnixNano() - int64(ch.Skew)
		if b.Rule == "" {
			if match, ok := selectors(b.Match); ok {
				p.blocks = append(p.blocks, globBlock{match: match, exp: exp})
			} else {
				p.orphans = append(p.orphans, Orphan{ID: b.ID})
			}
			continue
		}
		r := p.ruleNamed(b.Rule)
		var key string
		ok := r != nil
		if ok {
			key, ok = r.keyOf(b.Key)
		}
		if !ok {
			p.orphans = append(p.orphans, Orphan{ID: b.ID, Rule: b.Rule})
			continue
		}
		if r.keyBlock == nil {
			r.keyBlock = map[string]int64{}
		}
		r.keyBlock[key] = max(r.keyBlock[key], exp)
		r.changed = true
	}
}

// keyOf returns r's counter key for the by values in key.
func (r *rule) keyOf(key map[string]string) (string, bool) {
	descs := make([]descriptor.Descriptor, 0, len(key))
	for name, v := range key {
		descs = append(descs, descriptor.Descriptor{Name: []byte(name), Value: []byte(v)})
	}
	k, ok := r.appendKey(nil, descs)
	return string(k), ok
}

// selectors compiles name → glob, sorted by name. It reports false when
// a glob does not compile (a regular expression that a change validated
// against another version of rld): the change then applies to nothing.
func selectors(m map[string]string) ([]selector, bool) {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([]selector, len(names))
	for i, name := range names {
		g, err := compileGlob(m[name])
		if err != nil {
			return nil, false
		}
		out[i] = selector{name: name, glob: g}
	}
	return out, true
}

// blocked reports whether a glob block in force at now (Unix nanoseconds)
// matches descs.
func (p *Policy) blocked(descs []descriptor.Descriptor, now int64) bool {
	for i := range p.blocks {
		b := &p.blocks[i]
		if now >= b.exp {
			continue
		}
		if allMatch(b.match, descs) {
			return true
		}
	}
	return false
}

func allMatch(sels []selector, descs []descriptor.Descriptor) bool {
	for i := range sels {
		if !sels[i].matches(descs) {
			return false
		}
	}
	return true
}

// keyBlocked reports whether a block of r's key is in force at now.
func (r *rule) keyBlocked(key []byte, now int64) bool {
	_, ok := r.keyBlockEnd(key, now)
	return ok
}

// keyBlockEnd returns the end of the block of r's key in force at now, if
// there is one.
func (r *rule) keyBlockEnd(key []byte, now int64) (int64, bool) {
	if len(r.keyBlock) == 0 {
		return 0, false
	}
	exp, ok := r.keyBlock[string(key)]
	return exp, ok && now < exp
}

// limitIndex returns the params index (see paramsAt) of the limit in force
// for a request of tier index ti whose counter key is key: the newest key
// override's not expired, else the first matching glob override's, else
// ti's own.
func (r *rule) limitIndex(ti int, key []byte, descs []descriptor.Descriptor, now int64) int {
	if !r.changed {
		return ti
	}
	if len(r.keyOv) > 0 {
		for _, e := range r.keyOv[string(key)] {
			if now < e.exp {
				return len(r.tiers) + e.first + ti + 1
			}
		}
	}
	for i := range r.globOv {
		g := &r.globOv[i]
		if now < g.exp && allMatch(g.match, descs) {
			return len(r.tiers) + g.first + ti + 1
		}
	}
	return ti
}

// overridden reports whether params index pi is an override's limit.
func (r *rule) overridden(pi int) bool { return pi >= len(r.tiers) }
