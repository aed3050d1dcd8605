package policy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
)

// Operator is implemented by the stores that run the ops an operator
// sends to a counter key (algo.OpReset, algo.OpGrant): the embedded
// store, and the hot-key cache and its strict face, which drop what they
// hold of the key and send the op to the shared store. Do sets each op's
// Result and Err; its error is set when nothing could be run.
type Operator interface {
	Do(ctx context.Context, ops []algo.Op, now time.Time) error
}

// Target names the counters an operator's op acts on: one rule's (Rule
// set) or every rule's that matches Descriptors; or, with Key, the
// counter of Rule whose by descriptors have the values in Key (as an
// Override's Key names it: exactly the rule's by descriptors).
type Target struct {
	Rule        string
	Key         map[string]string
	Descriptors []descriptor.Descriptor
}

// Applied is the outcome of an op on one rule's counter.
type Applied struct {
	Rule   string
	Key    string // the key text
	Tier   string
	Params algo.Params
	Mode   config.Mode
	// Result is the counter's state after the op: a peek of cost 1.
	Result algo.Result
	// Err is the store's error; the op may or may not have been applied
	// when it is a timeout.
	Err error
}

// ErrNoMatch is the error of an op whose target names no counter: an
// unknown rule, a key that does not fit the rule's by descriptors, or
// descriptors that no rule counts.
var ErrNoMatch = errors.New("no counter")

// Operate runs the op kind (algo.OpReset, or algo.OpGrant of n units) on
// the counters of t, at now, and returns one Applied per counter. It
// fails with an error wrapping ErrNoMatch, having changed nothing, when
// t names no counter.
func (p *Policy) Operate(ctx context.Context, now time.Time, kind algo.OpKind, n int64, t Target) ([]Applied, error) {
	if kind != algo.OpReset && kind != algo.OpGrant {
		return nil, fmt.Errorf("policy: operate: %s is not an operator's op", kind)
	}
	descs := t.Descriptors
	byKey := len(t.Key) > 0
	if byKey {
		if t.Rule == "" {
			return nil, fmt.Errorf("policy: a key needs its rule: %w", ErrNoMatch)
		}
		descs = sortedDescriptors(t.Key)
	}
	type target struct {
		r   *rule
		app Applied
		key []byte
	}
	var targets []target
	found := false
	for i := range p.rules {
		r := &p.rules[i]
		if t.Rule != "" && r.name != t.Rule {
			continue
		}
		found = true
		// A key names its counter whatever the rule's match says.
		if !byKey && !r.applies(descs) {
			continue
		}
		if byKey && !namesBy(r, t.Key) {
			continue // the key names descriptors the rule does not count by
		}
		key, ok := r.appendKey(nil, descs)
		if !ok {
			continue
		}
		text, _ := r.appendKeyText(nil, descs)
		ti := r.tier(descs)
		// The limit in force for the key, an override's included: a
		// grant never goes beyond it, and the answer is a check's.
		pi := r.limitIndex(ti, key, descs, now.UnixNano())
		a := Applied{Rule: r.name, Key: string(text), Params: *r.paramsAt(pi), Mode: r.mode}
		if ti >= 0 {
			a.Tier = r.tiers[ti].name
		}
		targets = append(targets, target{r: r, app: a, key: key})
	}
	switch {
	case t.Rule != "" && !found:
		return nil, fmt.Errorf("policy: unknown rule %q: %w", t.Rule, ErrNoMatch)
	case len(targets) == 0 && byKey:
		return nil, fmt.Errorf("policy: key %v is not a key of rule %q (give the value of each of its by descriptors, and no other): %w", t.Key, t.Rule, ErrNoMatch)
	case len(targets) == 0:
		return nil, fmt.Errorf("policy: no rule counts these descriptors: %w", ErrNoMatch)
	}
	// Every rule's store runs ops (an Operator, checked when the policy
	// was compiled).
	out := make([]Applied, len(targets))
	for i, tg := range targets {
		ops := []algo.Op{{Kind: kind, Key: tg.key, Params: tg.app.Params, N: n}}
		err := tg.r.ops.Do(ctx, ops, now)
		if err == nil {
			err = ops[0].Err
		}
		tg.app.Result, tg.app.Err = ops[0].Result, err
		out[i] = tg.app
	}
	return out, nil
}

// sortedDescriptors returns m as descriptors sorted by name.
func sortedDescriptors(m map[string]string) []descriptor.Descriptor {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]descriptor.Descriptor, len(names))
	for i, n := range names {
		out[i] = descriptor.Descriptor{Name: []byte(n), Value: []byte(m[n])}
	}
	return out
}

// namesBy reports whether key names exactly r's by descriptors.
func namesBy(r *rule, key map[string]string) bool {
	if len(key) != len(r.by) {
		return false
	}
	for _, n := range r.by {
		if _, ok := key[n]; !ok {
			return false
		}
	}
	return true
}
