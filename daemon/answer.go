package daemon

import (
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/header"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/wire"
)

// answerOf returns the numbers of dec that both faces of the daemon give:
// the HTTP endpoint renders them as header fields (header.AppendFields),
// and the socket sends them in the response frame (fillResponse), from
// which a client renders the same fields.
func answerOf(dec *policy.Decision) header.Answer {
	var a header.Answer
	setAnswer(&a, dec)
	return a
}

// setAnswer sets a to answerOf(dec). It sets each field in place: a
// composite literal returned by value is built in a temporary and copied,
// twice, and the copies' wide loads of its narrow stores stall the
// processor on the hot path (fillResponse).
func setAnswer(a *header.Answer, dec *policy.Decision) {
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
	if dec.Status == policy.StatusLimited {
		a.Retry = max(dec.Result.RetryAfter, time.Millisecond)
	}
	if dec.Degraded {
		// Decided on this daemon's share of the limit (or by a fail
		// mode), not the limit itself: only the retry-after is known.
		a.Next = -1
		if dec.Status == policy.StatusLimited {
			a.Next = a.Retry
		}
	}
}

// fillResponse copies a policy decision into a wire response, reusing the
// response's Rule and Message buffers. Its rule and numbers are answerOf's, so the
// frame and the HTTP endpoint say the same. A degraded decision (made by
// a rule's fail mode while its store fails) carries FlagDegraded; its
// status is allowed-degraded or limited.
func fillResponse(res *wire.Response, dec *policy.Decision) {
	res.Flags = 0
	if dec.Degraded {
		res.Flags = wire.FlagDegraded
	}
	res.Code = wire.CodeNone
	res.Message = res.Message[:0]
	res.Status = wireStatus[dec.Status]
	var a header.Answer
	setAnswer(&a, dec)
	header.SetResponse(res, &a)
	if dec.Status == policy.StatusError {
		res.Code = wireCode[dec.Code]
		if dec.Err != nil {
			res.Message = append(res.Message[:0], dec.Err.Error()...)
		}
	}
}

// wireStatus and wireCode write policy's statuses and codes on the wire.
var (
	wireStatus = [policy.NumStatuses]wire.Status{
		policy.StatusAllowed: wire.StatusAllowed, policy.StatusLimited: wire.StatusLimited,
		policy.StatusBlocked: wire.StatusBlocked, policy.StatusAllowedDegraded: wire.StatusAllowedDegraded,
		policy.StatusError: wire.StatusError,
	}
	wireCode = [policy.NumCodes]wire.Code{
		policy.CodeNone: wire.CodeNone, policy.CodeCostTooLarge: wire.CodeCostTooLarge, policy.CodeInternal: wire.CodeInternal,
		policy.CodeNotFound: wire.CodeNotFound, policy.CodeMalformed: wire.CodeMalformed,
	}
)
