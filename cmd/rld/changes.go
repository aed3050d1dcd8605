package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rld/rld/admin"
)

// pairs is a repeatable name=value flag.
type pairs map[string]string

func (p pairs) String() string { return "" }

func (p pairs) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q is not name=value", s)
	}
	p[name] = value
	return nil
}

// changeRequest builds the request of the override, block, unblock and
// list commands; ok is false for other ops.
func changeRequest(op string, args []string) (req admin.Request, ok bool, err error) {
	fs := flag.NewFlagSet(op, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var v any
	switch op {
	case "override":
		if len(args) == 0 {
			return req, true, fmt.Errorf("override: give set, delete ID or list")
		}
		sub := args[0]
		switch sub {
		case "list":
			return admin.Request{Op: "list"}, true, nil
		case "delete":
			if len(args) != 2 {
				return req, true, fmt.Errorf("override delete: give the override's id")
			}
			op, v = "override-delete", admin.IDArgs{ID: args[1]}
		case "set":
			a := admin.OverrideArgs{Key: pairs{}, Match: pairs{}}
			fs.StringVar(&a.Rule, "rule", "", "the rule")
			fs.Var(pairs(a.Key), "key", "a by descriptor's value, name=value (repeat for each)")
			fs.Var(pairs(a.Match), "match", "a descriptor glob, name=glob (repeat)")
			fs.Int64Var(&a.Limit, "limit", 0, "absolute limit")
			fs.StringVar(&a.Period, "period", "", "absolute limit's period")
			fs.Int64Var(&a.Burst, "burst", 0, "absolute limit's burst")
			fs.Float64Var(&a.Multiplier, "multiplier", 0, "multiplier of the limit and burst in force")
			expiry(fs, &a.TTL, &a.ExpiresAt, &a.Reason, &a.Author)
			if err := fs.Parse(args[1:]); err != nil {
				return req, true, fmt.Errorf("override set: %w", err)
			}
			op, v = "override-set", a
		default:
			return req, true, fmt.Errorf("override %q: give set, delete ID or list", sub)
		}
	case "block":
		a := admin.BlockArgs{Key: pairs{}, Match: pairs{}}
		fs.StringVar(&a.Rule, "rule", "", "the rule whose key to block")
		fs.Var(pairs(a.Key), "key", "a by descriptor's value, name=value (repeat for each)")
		fs.Var(pairs(a.Match), "match", "a descriptor glob, name=glob (repeat)")
		expiry(fs, &a.TTL, &a.ExpiresAt, &a.Reason, &a.Author)
		if err := fs.Parse(args); err != nil {
			return req, true, fmt.Errorf("block: %w", err)
		}
		v = a
	case "unblock":
		if len(args) != 1 {
			return req, true, fmt.Errorf("unblock: give the block's id")
		}
		v = admin.IDArgs{ID: args[0]}
	case "list":
		if len(args) != 0 {
			return req, true, fmt.Errorf("list takes no arguments")
		}
	default:
		return req, false, nil
	}
	req.Op = op
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return req, true, err
		}
		req.Args = b
	}
	return req, true, nil
}

// expiry declares the flags of a change's expiry, reason and author.
func expiry(fs *flag.FlagSet, ttl *string, at **time.Time, reason, author *string) {
	fs.StringVar(ttl, "ttl", "", "how long the change lasts (1h)")
	fs.Func("expires", "when it expires (RFC 3339)", func(s string) error {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return err
		}
		*at = &t
		return nil
	})
	fs.StringVar(reason, "reason", "", "why")
	fs.StringVar(author, "author", "", "who (default: the caller)")
}

// printChanges prints the answer of a change op; ok is false for other
// ops.
func printChanges(w io.Writer, op string, result json.RawMessage) (ok bool, err error) {
	var top map[string]json.RawMessage
	if op == "override" && json.Unmarshal(result, &top) == nil && top["overrides"] != nil {
		op = "list" // override list
	}
	switch op {
	case "list":
		var r admin.ListResult
		if err := json.Unmarshal(result, &r); err != nil {
			return true, fmt.Errorf("unreadable answer: %w", err)
		}
		if len(r.Overrides)+len(r.Blocks) == 0 {
			fmt.Fprintln(w, "no overrides or blocks")
		}
		for _, o := range r.Overrides {
			target := "key " + joinPairs(o.Key)
			if len(o.Match) > 0 {
				target = "match " + joinPairs(o.Match)
			}
			limit := fmt.Sprintf("×%g", o.Multiplier)
			if o.Multiplier == 0 {
				limit = fmt.Sprintf("limit %d", o.Limit)
				if o.Period != "" {
					limit += "/" + o.Period
				}
				if o.Burst > 0 {
					limit += fmt.Sprintf(" burst %d", o.Burst)
				}
			}
			fmt.Fprintf(w, "override %s rule %s %s %s until %s by %s: %s", o.ID, o.Rule, target, limit,
				o.Expires.Format(time.RFC3339), o.Author, o.Reason)
			if o.Orphaned {
				fmt.Fprint(w, " (orphaned: no such rule in force)")
			}
			fmt.Fprintln(w)
		}
		for _, b := range r.Blocks {
			target := "match " + joinPairs(b.Match)
			if b.Rule != "" {
				target = "rule " + b.Rule + " key " + joinPairs(b.Key)
			}
			fmt.Fprintf(w, "block %s %s until %s by %s: %s", b.ID, target, b.Expires.Format(time.RFC3339), b.Author, b.Reason)
			if b.Orphaned {
				fmt.Fprint(w, " (orphaned: no such rule in force)")
			}
			fmt.Fprintln(w)
		}
	case "override", "block":
		var r struct {
			ID      string    `json:"id"`
			Expires time.Time `json:"expires"`
		}
		if err := json.Unmarshal(result, &r); err != nil {
			return true, fmt.Errorf("unreadable answer: %w", err)
		}
		if r.Expires.IsZero() {
			fmt.Fprintf(w, "deleted %s\n", r.ID)
		} else {
			fmt.Fprintf(w, "%s until %s\n", r.ID, r.Expires.Format(time.RFC3339))
		}
	case "unblock":
		fmt.Fprintln(w, "unblocked")
	default:
		return false, nil
	}
	return true, nil
}

func joinPairs(m map[string]string) string {
	b, _ := json.Marshal(m)
	return string(b)
}
