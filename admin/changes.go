package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rld/rld/change"
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
	// List lists every override and block in force, and those whose
	// rule is gone; the list op pages it (Page).
	List(ctx context.Context) (ListResult, error)
}

// OverrideArgs are override-set's arguments. Give Key (each of the
// rule's by descriptors) or Match (globs); Limit (absolute, with optional
// Period and Burst) or Multiplier; TTL or ExpiresAt.
type OverrideArgs struct {
	Rule       string  `json:"rule"`
	Key        Pairs   `json:"key,omitempty"`
	Match      Pairs   `json:"match,omitempty"`
	Limit      int64   `json:"limit,omitempty"`
	Period     string  `json:"period,omitempty"`
	Burst      int64   `json:"burst,omitempty"`
	Multiplier float64 `json:"multiplier,omitempty"`
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
	Match     Pairs      `json:"match,omitempty"`
	Rule      string     `json:"rule,omitempty"`
	Key       Pairs      `json:"key,omitempty"`
	TTL       string     `json:"ttl,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	Author    string     `json:"author,omitempty"`
}

// IDArgs name one override or block.
type IDArgs struct {
	ID string `json:"id"`
}

// Deleted is the answer to a delete.
type Deleted struct {
	ID string `json:"id"`
}

// OverrideEntry is one override as stored: the policy's change.Override,
// its Period written as a duration's text ("1m"), and whether its rule
// is gone.
type OverrideEntry struct {
	change.Override
	// Period is the absolute limit's period, "" for the rule's; it
	// stands for Override.Period in JSON.
	Period string `json:"period,omitempty"`
	// Orphaned is set when the configuration in force has no such rule
	// (or the rule's by descriptors changed): the override applies to
	// nothing until the rule comes back.
	Orphaned bool `json:"orphaned,omitempty"`
}

// BlockEntry is one block as stored, and whether its rule is gone.
type BlockEntry struct {
	change.Block
	Orphaned bool `json:"orphaned,omitempty"`
}

// ListArgs are list's arguments: which page.
type ListArgs struct {
	// Cursor is the Next of the page before; "" asks for the first.
	Cursor string `json:"cursor,omitempty"`
	// Limit is the most entries a page holds: 0 means DefaultListLimit,
	// at most MaxListLimit.
	Limit int `json:"limit,omitempty"`
}

// Sizes of list's pages.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
	// MaxPageBytes bounds the JSON of a page's entries, whatever its
	// limit, so that a page fits in an ADMIN frame's answer
	// (wire.MaxAdminBody) on every face.
	MaxPageBytes = 12 << 10
)

// ListResult is list's answer: one page of the entries not yet expired,
// ordered by id (blocks, b-…, before overrides, o-…).
type ListResult struct {
	Overrides []OverrideEntry `json:"overrides"`
	Blocks    []BlockEntry    `json:"blocks"`
	// Next, when set, is the cursor of the next page: there may be more.
	Next string `json:"next,omitempty"`
}

// Page returns the page of all that a asks for: the entries whose id
// follows a.Cursor, in order of id, at most a.Limit of them and at most
// MaxPageBytes of their JSON (at least one entry, however large), with
// Next set when entries are left. A cursor names a position, not an
// entry: paging goes on when the entry it names was deleted meanwhile;
// an entry added meanwhile before the cursor is not seen.
func Page(all ListResult, a ListArgs) (ListResult, error) {
	if err := a.validate(); err != nil {
		return ListResult{}, err
	}
	limit := a.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	type entry struct {
		id string
		o  *OverrideEntry
		b  *BlockEntry
	}
	var es []entry
	for i := range all.Overrides {
		if e := &all.Overrides[i]; e.ID > a.Cursor {
			es = append(es, entry{id: e.ID, o: e})
		}
	}
	for i := range all.Blocks {
		if e := &all.Blocks[i]; e.ID > a.Cursor {
			es = append(es, entry{id: e.ID, b: e})
		}
	}
	slices.SortFunc(es, func(x, y entry) int { return strings.Compare(x.id, y.id) })
	page := ListResult{Overrides: []OverrideEntry{}, Blocks: []BlockEntry{}}
	size := 0
	for i, e := range es {
		var v any = e.o
		if e.b != nil {
			v = e.b
		}
		b, err := json.Marshal(v)
		if err != nil {
			return ListResult{}, fmt.Errorf("cannot encode entry %s: %w", e.id, err)
		}
		if i == limit || (i > 0 && size+len(b)+1 > MaxPageBytes) {
			page.Next = es[i-1].id
			break
		}
		size += len(b) + 1
		if e.o != nil {
			page.Overrides = append(page.Overrides, *e.o)
		} else {
			page.Blocks = append(page.Blocks, *e.b)
		}
	}
	return page, nil
}

// validate checks a's limit and cursor: "" or an id as list shows
// them.
func (a *ListArgs) validate() error {
	if a.Limit < 0 || a.Limit > MaxListLimit {
		return Errorf(CodeBadRequest, "limit = %d: must be from 1 to %d (0: %d)", a.Limit, MaxListLimit, DefaultListLimit)
	}
	if a.Cursor == "" {
		return nil
	}
	kind, rest, _ := strings.Cut(a.Cursor, "-")
	ok := (kind == "o" || kind == "b") && rest != "" && len(rest) <= 32
	for _, c := range rest {
		ok = ok && (c >= '0' && c <= '9' || c >= 'a' && c <= 'f')
	}
	if !ok {
		return Errorf(CodeBadRequest, "cursor %q: give the next of the page before (an id, o-… or b-…)", a.Cursor)
	}
	return nil
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

// Override returns the override that a describes, its Period parsed,
// before the daemon gives it an id, an author and an expiry.
func (a OverrideArgs) Override() (change.Override, error) {
	o := change.Override{Rule: a.Rule, Key: a.Key, Match: a.Match, Limit: a.Limit, Burst: a.Burst,
		Multiplier: a.Multiplier, Reason: a.Reason, Author: a.Author}
	if a.Period != "" {
		p, err := time.ParseDuration(a.Period)
		if err != nil || p <= 0 {
			return change.Override{}, Errorf(CodeBadRequest, "period %q: give a positive duration (\"1m\")", a.Period)
		}
		o.Period = p
	}
	return o, nil
}

// Block returns the block that a describes, before the daemon gives it
// an id, an author and an expiry.
func (a BlockArgs) Block() change.Block {
	return change.Block{Match: a.Match, Rule: a.Rule, Key: a.Key, Reason: a.Reason, Author: a.Author}
}

// checkPairs checks the form of a change's key and match globs, as every
// op's descriptors are checked.
func checkPairs(key, match Pairs) error {
	if err := key.validate("key"); err != nil {
		return err
	}
	return match.validate("match")
}

// refused is the answer to a change that its Check refuses.
func refused(err error) error {
	if err == nil {
		return nil
	}
	return Errorf(CodeBadRequest, "%v", err)
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
		func(ctx context.Context, s ChangeService, a OverrideArgs) (any, error) {
			if err := checkPairs(a.Key, a.Match); err != nil {
				return nil, err
			}
			o, err := a.Override()
			if err != nil {
				return nil, err
			}
			if err := refused(o.Check()); err != nil {
				return nil, err
			}
			return s.SetOverride(ctx, a)
		}),
	changeOp("override-delete", "remove an override by id",
		func(ctx context.Context, s ChangeService, a IDArgs) (any, error) {
			if err := idArg(a); err != nil {
				return nil, err
			}
			return s.DeleteOverride(ctx, a)
		}),
	changeOp("block", "refuse (blocked) the requests matching globs, or one key of a rule, until an expiry",
		func(ctx context.Context, s ChangeService, a BlockArgs) (any, error) {
			if err := checkPairs(a.Key, a.Match); err != nil {
				return nil, err
			}
			b := a.Block()
			if err := refused(b.Check()); err != nil {
				return nil, err
			}
			return s.Block(ctx, a)
		}),
	changeOp("unblock", "remove a block by id",
		func(ctx context.Context, s ChangeService, a IDArgs) (any, error) {
			if err := idArg(a); err != nil {
				return nil, err
			}
			return s.Unblock(ctx, a)
		}),
	{Name: "list", Help: "the overrides and blocks in force, and those whose rule is gone, a page at a time",
		call: func(ctx context.Context, s Service, raw json.RawMessage) (any, error) {
			cs, ok := s.(ChangeService)
			if !ok {
				return nil, Errorf(CodeUnknownOp, "this daemon has no list")
			}
			var a ListArgs
			if err := decodeArgs(raw, &a); err != nil {
				return nil, err
			}
			if err := a.validate(); err != nil {
				return nil, err
			}
			all, err := cs.List(ctx)
			if err != nil {
				return nil, err
			}
			return Page(all, a)
		}},
}

func init() { ops = append(ops, changeOps...) }
