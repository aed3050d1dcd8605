package admin

import (
	"context"
	"encoding/json"
)

// StateService is what the daemon provides to the admin ops that change
// a counter's state: reset and grant. The daemon's Service implements it
// too; the ops refuse to run on a Service that does not.
type StateService interface {
	// Reset clears the state of the counters a Target names: each is a
	// fresh key again.
	Reset(ctx context.Context, args ResetArgs) (StateResult, error)
	// Grant adds N units to the current quota of the counters a Target
	// names, capped at a fresh key's.
	Grant(ctx context.Context, args GrantArgs) (StateResult, error)
}

// Target names counters: those of every rule that matches Descriptors,
// or of Rule alone; or, with Key, the counter of Rule whose key is Key:
// the value of each of the rule's by descriptors, as override and block
// take it ({"api_key":"k"}; the text explain lists, "api_key=k", is
// accepted too).
type Target struct {
	Rule        string      `json:"rule,omitempty"`
	Key         Pairs       `json:"key,omitempty"`
	Descriptors Descriptors `json:"descriptors,omitempty"`
}

// ResetArgs are reset's arguments.
type ResetArgs struct {
	Target
}

// GrantArgs are grant's arguments.
type GrantArgs struct {
	Target
	// N is the units to add, at least 1.
	N int64 `json:"n"`
}

// StateResult is the answer of reset and grant: each counter changed,
// with what a check of cost 1 would find after the change.
type StateResult struct {
	Counters []Counter `json:"counters"`
}

// Counter is one rule's counter after a reset or grant.
type Counter struct {
	Rule      string `json:"rule"`
	Key       string `json:"key"`
	Tier      string `json:"tier,omitempty"`
	Algorithm string `json:"algorithm"`
	Mode      string `json:"mode"`
	// Remaining is what a check of cost 1 would report now, were it
	// admitted: the units left after it (a fresh key of limit 10: 9).
	Remaining int64 `json:"remaining"`
	ResetMs   int64 `json:"reset_ms"`
	// Error is the store's error: the change may not have been made.
	Error string `json:"error,omitempty"`
}

func (t *Target) validate() error {
	switch {
	case len(t.Key) > 0 && t.Rule == "":
		return Errorf(CodeBadRequest, "key %s: give its rule too", t.Key)
	case len(t.Key) > 0 && len(t.Descriptors) > 0:
		return Errorf(CodeBadRequest, "give a rule and key, or descriptors, not both")
	case len(t.Key) == 0 && len(t.Descriptors) == 0:
		return Errorf(CodeBadRequest, "give descriptors (and optionally a rule), or a rule and a key")
	}
	if len(t.Key) > 0 {
		return t.Key.validate("key")
	}
	e := ExplainArgs{Descriptors: t.Descriptors}
	return e.validate()
}

// stateOps are the ops that change a counter's state.
var stateOps = []Op{
	{Name: "reset", Changes: true, Help: "clear a counter's state (descriptors, or rule and key; one rule or every rule that matches)",
		call: func(ctx context.Context, s Service, raw json.RawMessage) (any, error) {
			var a ResetArgs
			if err := decodeArgs(raw, &a); err != nil {
				return nil, err
			}
			if err := a.validate(); err != nil {
				return nil, err
			}
			ss, ok := s.(StateService)
			if !ok {
				return nil, Errorf(CodeUnknownOp, "this daemon cannot reset counters")
			}
			return ss.Reset(ctx, a)
		}},
	{Name: "grant", Changes: true, Help: "add n units to a counter's current quota (descriptors, or rule and key)",
		call: func(ctx context.Context, s Service, raw json.RawMessage) (any, error) {
			var a GrantArgs
			if err := decodeArgs(raw, &a); err != nil {
				return nil, err
			}
			if err := a.validate(); err != nil {
				return nil, err
			}
			if a.N <= 0 || a.N > 1<<32-1 {
				return nil, Errorf(CodeBadRequest, "n = %d: must be from 1 to 4294967295", a.N)
			}
			ss, ok := s.(StateService)
			if !ok {
				return nil, Errorf(CodeUnknownOp, "this daemon cannot grant quota")
			}
			return ss.Grant(ctx, a)
		}},
}

func init() { ops = append(ops, stateOps...) }
