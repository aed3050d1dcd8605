package daemon

import (
	"github.com/rld/rld/header"
	"github.com/rld/rld/header/wireheader"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/wire"
)

// answerOf returns the numbers of dec that both faces of the daemon give:
// the HTTP endpoint renders them as header fields (header.AppendFields),
// and the socket sends them in the response frame (fillResponse), from
// which a client renders the same fields.
func answerOf(dec *policy.Decision) header.Answer {
	var a header.Answer
	dec.SetAnswer(&a)
	return a
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
	dec.SetAnswer(&a)
	wireheader.SetResponse(res, &a)
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
