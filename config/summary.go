package config

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/rld/rld/algo"
)

// defaultTierLabel names, in a Summary, the limit of a missing or
// unlisted tier.
const defaultTierLabel = "default"

// Summary returns the rule on one line, as `rld config check` prints it:
//
//	search: token_bucket 30/1m burst 45 by api_key,endpoint match endpoint=/v1/search* cached fail=open
//	per-tier: token_bucket tier{free=100,pro=1000,enterprise=10000,default=100}/1m by api_key cached fail=open
//
// Tiers are listed by limit, then `default`: the limit of a missing or
// unlisted tier (a tier that is itself called "default" is written
// quoted, `"default"=50`). Shadow rules end with " shadow"; a rule that
// enforces only a share of its keys says so, as " enforce=25%".
func (r *Rule) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s ", r.Name, r.Algorithm)
	if len(r.Tiers) == 0 {
		fmt.Fprintf(&b, "%d", r.Limit)
	} else {
		tiers := sortedKeys(r.Tiers)
		slices.SortStableFunc(tiers, func(a, b string) int { return cmp.Compare(r.Tiers[a], r.Tiers[b]) })
		b.WriteString("tier{")
		for _, t := range tiers {
			name := t
			if t == defaultTierLabel {
				name = `"` + t + `"`
			}
			fmt.Fprintf(&b, "%s=%d,", name, r.Tiers[t])
		}
		fmt.Fprintf(&b, "%s=%d}", defaultTierLabel, r.DefaultLimit())
	}
	if r.Kind() == algo.Concurrency {
		fmt.Fprintf(&b, " in flight, timeout %s", r.Timeout)
	} else {
		fmt.Fprintf(&b, "/%s", r.Period)
	}
	if r.Burst > 0 {
		fmt.Fprintf(&b, " burst %d", r.Burst)
	}
	fmt.Fprintf(&b, " by %s", strings.Join(r.By, ","))
	if r.IsGlobal() {
		b.WriteString(" scope=global")
		if r.FallbackShare > 0 {
			fmt.Fprintf(&b, " fallback_share=%d", r.FallbackShare)
		}
		if r.GlobalStrict {
			b.WriteString(" global_strict")
		}
	}
	if len(r.Match) > 0 {
		b.WriteString(" match ")
		for i, name := range sortedKeys(r.Match) {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%s", name, r.Match[name])
		}
	}
	fmt.Fprintf(&b, " %s fail=%s", r.Mode, r.Fail)
	if r.Shadow {
		b.WriteString(" shadow")
	}
	if bp := r.EnforceShare(); bp != FullShare {
		fmt.Fprintf(&b, " enforce=%s", FormatShare(bp))
	}
	if pen := r.Penalty; pen != nil {
		fmt.Fprintf(&b, " penalty after=%d factor=%v max=%s", pen.After, pen.Factor, pen.Max)
	}
	if ba := r.BlockAfter; ba != nil {
		fmt.Fprintf(&b, " block_after=%d/%s for=%s", ba.Refusals, ba.Within, ba.For)
	}
	if !r.RetryJitter.IsZero() {
		fmt.Fprintf(&b, " jitter=%s", r.RetryJitter)
	}
	return b.String()
}
