package admin

import "github.com/VictoriaMetrics/metrics"

// Reason is why an admin request was refused: the label of
// rld_admin_refused_total.
type Reason string

// Reasons. A request an op refused (bad arguments, a rule not found) is
// counted under its error code.
const (
	// ReasonNoToken: an admin HTTP request without a bearer token.
	ReasonNoToken Reason = "no_token"
	// ReasonWrongToken: a bearer token that is no admin token.
	ReasonWrongToken Reason = "wrong_token"
	// ReasonUID: an ADMIN frame from a uid in neither admin.socket_uids
	// nor admin.read_socket_uids, or whose uid cannot be read.
	ReasonUID Reason = "uid"
	// ReasonRole: an op that changes state, from a caller of the read
	// role.
	ReasonRole Reason = "role"
	// ReasonMethod: an HTTP method the op does not take (GET of an op
	// that changes state).
	ReasonMethod Reason = "method"
	// ReasonNotFound: an admin HTTP path that is no op's.
	ReasonNotFound Reason = "not_found"
	// ReasonBadRequest: the request or its arguments are invalid.
	ReasonBadRequest Reason = "bad_request"
	// ReasonUnknownOp: no such op.
	ReasonUnknownOp Reason = "unknown_op"
	// ReasonInternal: the op failed.
	ReasonInternal Reason = "internal"
)

// Reasons lists every Reason, in the order the docs list them.
var Reasons = []Reason{ReasonNoToken, ReasonWrongToken, ReasonUID, ReasonRole, ReasonMethod,
	ReasonNotFound, ReasonBadRequest, ReasonUnknownOp, ReasonInternal}

// refusedTotal holds rld_admin_refused_total's series, each exported
// from the start (at 0).
var refusedTotal = func() map[Reason]*metrics.Counter {
	m := make(map[Reason]*metrics.Counter, len(Reasons))
	for _, r := range Reasons {
		m[r] = metrics.NewCounter(`rld_admin_refused_total{reason="` + string(r) + `"}`)
	}
	return m
}()

// refusedBy returns reason's counter; a reason not listed counts as
// internal.
func refusedBy(r Reason) *metrics.Counter {
	if c, ok := refusedTotal[r]; ok {
		return c
	}
	return refusedTotal[ReasonInternal]
}

// Refused returns how many admin requests were refused for reason since
// the process started.
func Refused(r Reason) uint64 { return refusedBy(r).Get() }
