package envoyrls

import (
	"errors"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/header"
	"github.com/rld/rld/policy"
)

// The face's calls by outcome. A shadow rule that would have denied is
// counted by policy as rld_checks_total{decision="shadow_limited"}; its
// descriptor is answered OK.
var (
	requestsOK        = metrics.NewCounter(`rld_envoy_requests_total{code="ok"}`)
	requestsOverLimit = metrics.NewCounter(`rld_envoy_requests_total{code="over_limit"}`)
	requestsInvalid   = metrics.NewCounter(`rld_envoy_requests_total{code="invalid"}`)
	requestsError     = metrics.NewCounter(`rld_envoy_requests_total{code="unavailable"}`)
)

// descriptorStatus returns the Envoy status of one descriptor's decision:
//   - no rule applied, or the allow list: OK, with no current limit;
//   - the deny list or an admin block: OVER_LIMIT, with no current limit;
//   - a rule decided: its code, current_limit (the rule's sustained limit
//     per period, see unitOf), limit_remaining and duration_until_reset;
//   - a cost beyond the limit's capacity: OVER_LIMIT with the limit.
//
// A store failure that no fail mode decided is returned as an error.
func descriptorStatus(dec *policy.Decision) (*pb.RateLimitResponse_DescriptorStatus, error) {
	st := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	switch dec.Status {
	case policy.StatusBlocked:
		st.Code = pb.RateLimitResponse_OVER_LIMIT
		return st, nil
	case policy.StatusLimited:
		st.Code = pb.RateLimitResponse_OVER_LIMIT
	case policy.StatusError:
		if dec.Code != policy.CodeCostTooLarge {
			if dec.Err != nil {
				return nil, dec.Err
			}
			return nil, errors.New(dec.Code.String())
		}
		st.Code = pb.RateLimitResponse_OVER_LIMIT
	}
	if dec.Rule == policy.RuleNone || dec.Rule == policy.RuleAllow {
		return st, nil
	}
	st.CurrentLimit = currentLimit(dec)
	st.LimitRemaining = uint32(min(max(dec.Result.Remaining, 0), 1<<32-1))
	st.DurationUntilReset = durationpb.New(time.Duration(header.Seconds(dec.Result.Reset)) * time.Second)
	return st, nil
}

// currentLimit returns the deciding rule's limit as Envoy states one:
// requests per unit. A rule whose sustained period is one unit (1s, 1m,
// 1h, 24h, 168h, and the peer's 30-day month and 365-day year) gives its limit per that unit; another period gives the
// limit per the largest unit that divides the period a whole number of
// times into whole requests, else UNKNOWN with the limit per period. The
// rule's name is the limit's name.
func currentLimit(dec *policy.Decision) *pb.RateLimitResponse_RateLimit {
	q, w := algo.Sustained(dec.Params)
	if dec.Params.Kind == algo.Concurrency {
		q, w = dec.Params.Limit, 0
	}
	rl := &pb.RateLimitResponse_RateLimit{Name: dec.Rule, RequestsPerUnit: uint32(min(max(q, 0), 1<<32-1))}
	for _, u := range units {
		if w == u.d {
			rl.Unit = u.unit
			return rl
		}
	}
	for _, u := range units {
		if w > u.d && w%u.d == 0 && q%int64(w/u.d) == 0 {
			rl.Unit = u.unit
			rl.RequestsPerUnit = uint32(min(max(q/int64(w/u.d), 0), 1<<32-1))
			return rl
		}
	}
	return rl
}

// units are Envoy's fixed-length units, longest first.
var units = []struct {
	d    time.Duration
	unit pb.RateLimitResponse_RateLimit_Unit
}{
	{365 * 24 * time.Hour, pb.RateLimitResponse_RateLimit_YEAR},
	{30 * 24 * time.Hour, pb.RateLimitResponse_RateLimit_MONTH},
	{7 * 24 * time.Hour, pb.RateLimitResponse_RateLimit_WEEK},
	{24 * time.Hour, pb.RateLimitResponse_RateLimit_DAY},
	{time.Hour, pb.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, pb.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, pb.RateLimitResponse_RateLimit_SECOND},
}

// headerPick chooses the decision whose numbers the response headers
// carry: the first that refused, else the allowing rule with the least
// remaining, as one rld check reports the limit that decided.
type headerPick struct {
	a      header.Answer
	set    bool
	denied bool
}

// consider offers one descriptor's decision.
func (h *headerPick) consider(dec *policy.Decision) {
	if dec.Rule == policy.RuleNone || dec.Rule == policy.RuleAllow || dec.Rule == policy.RuleDeny || h.denied {
		return
	}
	denied := !dec.Status.Allowed()
	if h.set && !denied && dec.Result.Remaining >= int64(h.a.Remaining) {
		return
	}
	dec.SetAnswer(&h.a)
	h.set, h.denied = true, denied
}

// headers renders the chosen decision as X-RateLimit-*, RateLimit-Policy,
// RateLimit and, on a refusal, Retry-After (package header), for Envoy to
// add to the client's response.
// The fields are rendered into scr's buffers; the strings of the
// response are one allocation, and the HeaderValues another.
func (h *headerPick) headers(now time.Time, scr *scratch) []*corev3.HeaderValue {
	if !h.set {
		return nil
	}
	scr.fields, scr.hbuf = header.AppendFields(scr.fields[:0], scr.hbuf[:0], h.a, now)
	n := 0
	for _, f := range scr.fields {
		n += len(f.Value)
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, f := range scr.fields {
		sb.Write(f.Value)
	}
	all := sb.String() // every value, back to back, in field order
	vals := make([]corev3.HeaderValue, len(scr.fields))
	out := make([]*corev3.HeaderValue, len(scr.fields))
	off := 0
	for i, f := range scr.fields {
		vals[i].Key, vals[i].Value = f.Name, all[off:off+len(f.Value)]
		off += len(f.Value)
		out[i] = &vals[i]
	}
	return out
}
