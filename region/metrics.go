package region

import (
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

// The region's metrics; docs/operations.md lists them.
var (
	renewalsM  = metrics.NewCounter(`rld_region_renewals_total`)
	returnsM   = metrics.NewCounter(`rld_region_returns_total`)
	reclaimsM  = metrics.NewCounter(`rld_region_reclaims_total`)
	fallbackM  = metrics.NewCounter(`rld_region_fallback_decisions_total`)
	renewErrsM = metrics.NewCounter(`rld_region_renew_errors_total`)
	earlyM     = metrics.NewCounter(`rld_region_early_renewals_total`)
	strictM    = metrics.NewCounter(`rld_region_strict_renewals_total`)
	// strictUnansweredM counts checks of strict keys decided by the
	// rule's fail mode: the global store gave no share in time.
	strictUnansweredM = metrics.NewCounter(`rld_region_strict_unanswered_total`)
	renewerG          atomic.Int64 // daemons of this process that hold the renewer role
	_                 = metrics.NewGauge(`rld_region_renewer`, func() float64 { return float64(renewerG.Load()) })
)

// Stats are one Region's counts since it started; the metrics add up
// every Region of the process.
type Stats struct {
	// Renewals is the keys renewed on the global store.
	Renewals int64
	// Returns is the renewals that lowered a live share (units given
	// back for the other regions).
	Returns int64
	// Reclaims is the renewals that took the share of a region whose
	// lease had expired.
	Reclaims int64
	// Fallbacks is the decisions made with a key's fallback share (no
	// live share).
	Fallbacks int64
	// RenewErrors is the key renewals that failed.
	RenewErrors int64
	// Passes is the renewal passes this daemon ran as the renewer.
	Passes int64
	// Retries is the keys renewed a second time in a pass: their first
	// grant capped well below their target, or asked early.
	Retries int64
	// EarlyRenewals is the second renewals of keys a daemon of the region
	// asked for, having refused them under their share, with their
	// demand raised.
	EarlyRenewals int64
	// StrictRenewals is the renewals of strict keys with no live share
	// made at once by a check (one per key in flight).
	StrictRenewals int64
	// StrictUnanswered is the checks of strict keys with no live share
	// that got none in time: the rule's fail mode decided them.
	StrictUnanswered int64
	// Loads is the loads of the region's shares hash: on a message, and
	// at the ticks not skipped.
	Loads int64
	// SkippedLoads is the ticks whose load was skipped: a message's load
	// had read the hash within the interval.
	SkippedLoads int64
}

// stats are a Region's counters.
type stats struct {
	renewals, returns, reclaims, fallbacks, renewErrs, passes, retries, early atomic.Int64
	strict, strictUnanswered, loads, skippedLoads                             atomic.Int64
}

func (r *Region) fellBack() {
	r.st.fallbacks.Add(1)
	fallbackM.Inc()
}

// Stats returns r's counts.
func (r *Region) Stats() Stats {
	return Stats{
		Renewals: r.st.renewals.Load(), Returns: r.st.returns.Load(), Reclaims: r.st.reclaims.Load(),
		Fallbacks: r.st.fallbacks.Load(), RenewErrors: r.st.renewErrs.Load(), Passes: r.st.passes.Load(),
		Retries: r.st.retries.Load(), EarlyRenewals: r.st.early.Load(),
		StrictRenewals: r.st.strict.Load(), StrictUnanswered: r.st.strictUnanswered.Load(),
		Loads: r.st.loads.Load(), SkippedLoads: r.st.skippedLoads.Load(),
	}
}
