package shardcache

import (
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

// The cache's metrics. Decisions are counted by where they were made.
var (
	localAllowed  = metrics.NewCounter(`rld_cache_decisions_total{path="local"}`)
	localDenied   = metrics.NewCounter(`rld_cache_decisions_total{path="denied_locally"}`)
	storeDecided  = metrics.NewCounter(`rld_cache_decisions_total{path="redis"}`)
	storeCalls    = metrics.NewCounter(`rld_cache_store_calls_total`)
	batchSize     = metrics.NewPrometheusHistogramExt(`rld_coalesce_batch_size`, metrics.ExponentialBuckets(1, 2, 11))
	leasesGranted = metrics.NewCounter(`rld_cache_lease_units_total{event="granted"}`)
	leasesReturn  = metrics.NewCounter(`rld_cache_lease_units_total{event="returned"}`)
	leasesLost    = metrics.NewCounter(`rld_cache_lease_units_total{event="lost"}`)
	evictions     = metrics.NewCounter(`rld_cache_evictions_total`)
	// Late answers: take-with-leases answered after their checks
	// stopped waiting (store.timeout), and the units they leased, given
	// back at once (see takeLeaseOrLate).
	lateAnswers  = metrics.NewCounter(`rld_cache_late_answers_total`)
	lateReturned = metrics.NewCounter(`rld_cache_late_units_returned_total`)
	// Take-with-leases that failed in line after they may have run
	// (their answer lost), whose grant was reclaimed (see reclaimLost).
	lostReclaimed = metrics.NewCounter(`rld_cache_lost_grants_reclaimed_total`)
	// Recalls: sent when a take is refused while other daemons hold
	// parked units of its key (admitted: the take then got them);
	// received from other daemons (returned: with units to give back).
	recallsSent     = metrics.NewCounter(`rld_cache_recalls_total{event="sent"}`)
	recallsAdmitted = metrics.NewCounter(`rld_cache_recalls_total{event="admitted"}`)
	recallsReceived = metrics.NewCounter(`rld_cache_recalls_total{event="received"}`)
	recallsReturned = metrics.NewCounter(`rld_cache_recalls_total{event="returned"}`)
	// A grant that came after a recall of its key (its call was out
	// when the recall came), returned at once; and the checks of a take
	// waiting on its recall admitted from this daemon's own lease.
	lateRecalls      = metrics.NewCounter(`rld_cache_recalls_total{event="returned_late"}`)
	ownLeaseAdmitted = metrics.NewCounter(`rld_cache_recalls_total{event="own_lease"}`)
	// A settle's refunds announced to the other daemons, and the other
	// daemons' announcements received (see Cache.Corrected).
	refundsSent     = metrics.NewCounter(`rld_cache_recalls_total{event="refund_sent"}`)
	refundsReceived = metrics.NewCounter(`rld_cache_recalls_total{event="refund_received"}`)
	// Misses: checks of cached rules that waited on the store, by why
	// the key's lease could not answer them (see missReason).
	misses = func() (m [len(missNames)]*metrics.Counter) {
		for r, name := range missNames {
			m[r] = metrics.NewCounter(`rld_cache_misses_total{reason="` + name + `"}`)
		}
		return m
	}()
	syncs        = metrics.NewCounter(`rld_cache_syncs_total`)
	syncOps      = metrics.NewCounter(`rld_cache_sync_ops_total`)
	syncVisits   = metrics.NewCounter(`rld_cache_sync_visits_total`)
	syncErrors   = metrics.NewCounter(`rld_cache_sync_errors_total`)
	syncDuration = metrics.NewPrometheusHistogramExt(`rld_cache_sync_duration_seconds`, []float64{100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1})
	_            = metrics.NewGauge(`rld_cache_entries`, func() float64 { return float64(liveEntries.Load()) })
)

// missNames are the reason labels of rld_cache_misses_total, by
// missReason.
var missNames = [...]string{
	missNew: "new", missSpent: "spent", missLapsed: "lapsed", missWindow: "window",
	missReturned: "returned", missRecalled: "recalled", missDenied: "denied", missNoLease: "no_lease",
}

// liveEntries is the number of keys held by all Caches.
var liveEntries atomic.Int64
