package policy

import (
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/header"
)

// SetAnswer sets a to the numbers of dec that every face of the daemon
// gives (the socket's response frame, the HTTP header fields, the Envoy
// face's statuses). It sets each field in place: a composite literal
// returned by value is built in a temporary and copied, twice, and the
// copies' wide loads of its narrow stores stall the processor on the hot
// path.
func (dec *Decision) SetAnswer(a *header.Answer) {
	q, w := algo.Sustained(dec.Params)
	a.Rule = dec.Rule
	a.Limit = uint64(max(dec.Result.Limit, 0))
	a.Quota = uint64(max(q, 0))
	// The quota a client pacing itself evenly can sustain.
	a.QuotaWindow = w
	if dec.Params.Kind == algo.Concurrency {
		// Slots in flight are no quota over a window: a concurrency
		// limit advertises no RateLimit-Policy (docs/protocol.md).
		a.Quota, a.QuotaWindow = 0, 0
	}
	a.Remaining = uint64(max(dec.Result.Remaining, 0))
	a.Window = dec.Period
	a.Reset = dec.Result.Reset
	a.Retry = 0
	a.Next = algo.Next(dec.Params, &dec.Result)
	if dec.Status == StatusLimited {
		a.Retry = max(dec.Result.RetryAfter, time.Millisecond)
	}
	if dec.Degraded {
		// Decided on this daemon's share of the limit (or by a fail
		// mode), not the limit itself: only the retry-after is known.
		a.Next = -1
		if dec.Status == StatusLimited {
			a.Next = a.Retry
		}
	}
}
