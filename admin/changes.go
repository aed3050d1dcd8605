package admin

import (
	"context"
	"encoding/json"
	"time"
)

// ChangeService is what the daemon provides for the admin ops that change
// limits at run time: overrides and blocks. A Service that implements it
// serves those ops; one that does not answers them with CodeUnknownOp.
type ChangeService interface {
	// SetOverride adds an override and returns it as stored.
	SetOverride(ctx context.Context, a OverrideArgs) (OverrideEntry, error)
	// DeleteOverride removes the override called ID.
	DeleteOverride(ctx context.Context, a IDArgs) (Deleted, error)
	// Block adds a block and returns it as stored.
	Block(ctx context.Context, a BlockArgs) (BlockEntry, error)
	// Unblock removes the block called ID.
	Unblock(ctx context.Context, a IDArgs) (Deleted, error)
	// List lists the overrides and blocks in force, and those whose
	// rule is gone.
	List(ctx context.Context) (ListResult, error)
}

// OverrideArgs are override-set's arguments. Give Key (each of the
// rule's by descriptors) or Match (globs); Limit (absolute, with optional
// Period and Burst) or Multiplier; TTL or ExpiresAt.
type OverrideArgs struct {
	Rule       string            `json:"rule"`
	Key        map[string]string `json:"key,omitempty"`
	Match      map[string]string `json:"match,omitempty"`
	Limit      int64             `json:"limit,omitempty"`
	Period     string            `json:"period,omitempty"`
	Burst      int64             `json:"burst,omitempty"`
	Multiplier float64           `json:"multiplier,omitempty"`
	// TTL is how long from now the override lasts ("1h", "30m").
	TTL string `json:"ttl,omitempty"`
	// ExpiresAt is when it stops applying (RFC 3339).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	// Author defaults to the caller (uid=… or http ADDR).
	Author string `json:"author,omitempty"`
}

// BlockArgs are block's arguments: Match (globs), or Rule and Key.
type BlockArgs struct {
	Match     map[string]string `json:"match,omitempty"`
	Rule      string            `json:"rule,omitempty"`
	Key       map[string]string `json:"key,omitempty"`
	TTL       string            `json:"ttl,omitempty"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty"`
	Reason    string            `json:"reason,omitempty"`
	Author    string            `json:"author,omitempty"`
}

// IDArgs name one override or block.
type IDArgs struct {
	ID string `json:"id"`
}

// Deleted is the answer to a delete.
type Deleted struct {
	ID string `json:"id"`
}

// OverrideEntry is one override as stored.
type OverrideEntry struct {
	ID         string            `json:"id"`
	Rule       string            `json:"rule"`
	Key        map[string]string `json:"key,omitempty"`
	Match      map[string]string `json:"match,omitempty"`
	Limit      int64             `json:"limit,omitempty"`
	Period     string            `json:"period,omitempty"`
	Burst      int64             `json:"burst,omitempty"`
	Multiplier float64           `json:"multiplier,omitempty"`
	Expires    time.Time         `json:"expires"`
	Reason     string            `json:"reason,omitempty"`
	Author     string            `json:"author,omitempty"`
	Created    time.Time         `json:"created"`
	// Orphaned is set when the configuration in force has no such rule
	// (or the rule's by descriptors changed): the override applies to
	// nothing until the rule comes back.
	Orphaned bool `json:"orphaned,omitempty"`
}

// BlockEntry is one block as stored.
type BlockEntry struct {
	ID       string            `json:"id"`
	Match    map[string]string `json:"match,omitempty"`
	Rule     string            `json:"rule,omitempty"`
	Key      map[string]string `json:"key,omitempty"`
	Expires  time.Time         `json:"expires"`
	Reason   string            `json:"reason,omitempty"`
	Author   string            `json:"author,omitempty"`
	Created  time.Time         `json:"created"`
	Orphaned bool              `json:"orphaned,omitempty"`
}

// ListResult is list's answer: the entries not yet expired.
type ListResult struct {
	Overrides []OverrideEntry `json:"overrides"`
	Blocks    []BlockEntry    `json:"blocks"`
}

// Expiry returns when a change given ttl or at, asked at now, expires.
func Expiry(ttl string, at *time.Time, now time.Time) (time.Time, error) {
	switch {
	case ttl != "" && at != nil:
		return time.Time{}, Errorf(CodeBadRequest, "give ttl or expires_at, not both")
	case at != nil:
		return *at, nil
	case ttl == "":
		return time.Time{}, Errorf(CodeBadRequest, "give ttl (\"1h\") or expires_at (RFC 3339): a change must expire")
	}
	d, err := time.ParseDuration(ttl)
	if err != nil {
		return time.Time{}, Errorf(CodeBadRequest, "ttl: %v", err)
	}
	if d <= 0 {
		return time.Time{}, Errorf(CodeBadRequest, "ttl = %s: must be positive", ttl)
	}
	return now.Add(d), nil
}

type callerKey struct{}

// CallerOf returns the caller that Server.Run runs a request for.
func CallerOf(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

func withCaller(ctx context.Context, who Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, who)
}

// changeOp is an op of ChangeService: its arguments decoded into A.
func changeOp[A any](name, help string, call func(ctx context.Context, s ChangeService, a A) (any, error)) Op {
	return Op{Name: name, Changes: true, Help: help,
		call: func(ctx context.Context, s Service, raw json.RawMessage) (any, error) {
			cs, ok := s.(ChangeService)
			if !ok {
				return nil, Errorf(CodeUnknownOp, "this daemon has no %s", name)
			}
			var a A
			if err := decodeArgs(raw, &a); err != nil {
				return nil, err
			}
			return call(ctx, cs, a)
		}}
}

func idArg(a IDArgs) error {
	if a.ID == "" {
		return Errorf(CodeBadRequest, "id: give the id that list shows")
	}
	return nil
}

// changeOps are the ops of ChangeService, in the order `rld admin` lists
// them.
var changeOps = []Op{
	changeOp("override-set", "set a limit for a key or a descriptor glob of a rule, absolute or a multiplier, until an expiry",
		func(ctx context.Context, s ChangeService, a OverrideArgs) (any, error) { return s.SetOverride(ctx, a) }),
	changeOp("override-delete", "remove an override by id",
		func(ctx context.Context, s ChangeService, a IDArgs) (any, error) {
			if err := idArg(a); err != nil {
				return nil, err
			}
			return s.DeleteOverride(ctx, a)
		}),
	changeOp("block", "refuse (blocked) the requests matching globs, or one key of a rule, until an expiry",
		func(ctx context.Context, s ChangeService, a BlockArgs) (any, error) { return s.Block(ctx, a) }),
	changeOp("unblock", "remove a block by id",
		func(ctx context.Context, s ChangeService, a IDArgs) (any, error) {
			if err := idArg(a); err != nil {
				return nil, err
			}
			return s.Unblock(ctx, a)
		}),
	{Name: "list", Help: "the overrides and blocks in force, and those whose rule is gone",
		call: func(ctx context.Context, s Service, raw json.RawMessage) (any, error) {
			cs, ok := s.(ChangeService)
			if !ok {
				return nil, Errorf(CodeUnknownOp, "this daemon has no list")
			}
			if err := decodeArgs(raw, &struct{}{}); err != nil {
				return nil, err
			}
			return cs.List(ctx)
		}},
}

func init() { ops = append(ops, changeOps...) }
