package policy

import (
	"time"

	"github.com/rld/rld/algo"
)

// RegionShare is what a region holds of a global rule's limit for one
// key (package region), as Explain shows it.
type RegionShare struct {
	// Region is this daemon's region.
	Region string
	// Units is the share of Limit the region decides with now: its
	// leased share while Live, else Fallback.
	Units int64
	// Limit is the rule's global limit the share is of.
	Limit int64
	// Live reports whether the region holds a lease of the key; Expiry
	// is when it ends (zero when the region never held one).
	Live   bool
	Expiry time.Time
	// Fallback is the share used without a live lease.
	Fallback int64
	// Demand is the region's demand of the key at its last renewal, in
	// units per period of the limit.
	Demand int64
	// Strict reports a global_strict rule: without a live lease, the
	// key's next check asks the global store for a share.
	Strict bool
}

// RegionExplainer is implemented by the store of a global rule: it
// tells Explain the region's share of a key.
type RegionExplainer interface {
	// ExplainRegion returns the region's share of key under the rule's
	// limit p at now.
	ExplainRegion(key []byte, p algo.Params, now time.Time) RegionShare
}

// RegionScaler is implemented by the store of a global rule: it gives
// the limit a key is decided with in this region (the rule's, scaled to
// the region's share), which the Fallback then enforces too when the
// region's store fails, so that a fail-open outage admits the region's
// share, not the whole global limit.
type RegionScaler interface {
	// RegionParams returns p scaled to key's share at now.
	RegionParams(key []byte, p algo.Params, now time.Time) algo.Params
}

// regionParams returns the params the Fallback decides a key of store
// st with: scaled for a global rule's store, else p.
func regionParams(st Store, key []byte, p *algo.Params, now time.Time) *algo.Params {
	rs, ok := st.(RegionScaler)
	if !ok {
		return p
	}
	q := rs.RegionParams(key, *p, now)
	return &q
}
