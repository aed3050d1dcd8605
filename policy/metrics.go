package policy

import (
	"fmt"

	"github.com/VictoriaMetrics/metrics"
)

// decision indexes the decision label of rld_checks_total.
type decision uint8

const (
	decAllowed decision = iota
	decLimited
	decBlocked
	decError
	decShadowLimited
	decAllowedDegraded
	decLimitedDegraded
	numDecisions
)

var decisionNames = [numDecisions]string{"allowed", "limited", "blocked", "error", "shadow_limited", "allowed_degraded", "limited_degraded"}

// counters holds the rld_checks_total series of one rule label, created
// when a Policy is built so that Check formats no names. A reload gets the
// same counters back from the metrics set.
type counters [numDecisions]*metrics.Counter

// newCounters returns the series rld_checks_total{rule="…",decision="…"}
// of rule for the decisions it can make; the others stay nil. Every check
// counts one series: the rule that decided ("deny", "allow", "none" when
// no rule applied, or a rule's name) with its decision; a shadow rule,
// or a rule on a key outside its enforce share, that would have denied
// counts decision="shadow_limited" besides. A
// decision of a rule's fail mode while its store fails (see Fallback)
// counts "allowed_degraded" or "limited_degraded".
func newCounters(rule string, ds ...decision) *counters {
	var c counters
	for _, d := range ds {
		c[d] = metrics.GetOrCreateCounter(fmt.Sprintf(`rld_checks_total{rule=%q,decision=%q}`, rule, decisionNames[d]))
	}
	return &c
}

func (c *counters) inc(d decision) { c[d].Inc() }

// refundErrors counts refunds the store failed to apply: quota lost until
// the keys' state expires, never extra admissions.
var refundErrors = metrics.NewCounter("rld_refund_errors_total")

// fallbackSeeded counts keys whose fail-open local state started from what
// the daemon last knew of them rather than from a full share.
var fallbackSeeded = metrics.NewCounter("rld_fallback_seeded_total")

// AutoBlocks returns the series rld_auto_blocks_total{rule="…"} of rule:
// the automatic blocks stored for its block_after. Every rule of a Policy
// has it, 0 until one is stored, as every rule has its rld_checks_total
// series.
func AutoBlocks(rule string) *metrics.Counter {
	return metrics.GetOrCreateCounter(fmt.Sprintf(`rld_auto_blocks_total{rule=%q}`, rule))
}

// RolloutLimited returns the series rld_rollout_limited_total{rule="…"}
// of rule: checks of keys outside the rule's enforce share that the rule
// would have refused, and admitted (each counts decision="shadow_limited"
// in rld_checks_total too). A rule that enforces only a share of its keys
// has it from the start.
func RolloutLimited(rule string) *metrics.Counter {
	return metrics.GetOrCreateCounter(fmt.Sprintf(`rld_rollout_limited_total{rule=%q}`, rule))
}

// The releases of concurrency slots (Release): leases that gave slots
// back, and leases that held none any more.
var (
	releases        = metrics.NewCounter(`rld_releases_total{result="released"}`)
	releasesUnknown = metrics.NewCounter(`rld_releases_total{result="unknown"}`)
)

// The units that settles charged beyond their estimates, and refunded
// below them.
var (
	settleCharged  = metrics.NewCounter(`rld_settle_units_total{op="charge"}`)
	settleRefunded = metrics.NewCounter(`rld_settle_units_total{op="refund"}`)
)
