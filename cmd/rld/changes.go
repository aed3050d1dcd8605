package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/rld/rld/admin"
)

// pairs is a repeatable flag of name=value pairs (-key api_key=k -key
// tenant=t, or -key api_key=k,tenant=t), read as admin.ParsePairs reads
// them.
type pairs admin.Pairs

func (p pairs) String() string { return admin.Pairs(p).String() }

func (p pairs) Set(s string) error {
	m, err := admin.ParsePairs(s)
	if err != nil {
		return err
	}
	for name, value := range m {
		if _, dup := p[name]; dup {
			return fmt.Errorf("%s given twice", name)
		}
		p[name] = value
	}
	return nil
}

// targetFlags declares the flags that name what a command acts on, the
// same for every command that has them: -rule NAME, -key name=value
// (repeat), and -match name=glob (repeat) when match is not nil.
func targetFlags(fs *flag.FlagSet, rule *string, key, match admin.Pairs) {
	fs.StringVar(rule, "rule", "", "the rule's `name`")
	fs.Var(pairs(key), "key", "a `name=value` of the counter key: each of the rule's by descriptors (repeat, or join with \",\")")
	if match != nil {
		fs.Var(pairs(match), "match", "a descriptor glob, `name=glob` (repeat, or join with \",\")")
	}
}

// nonEmpty returns p, or nil when it is empty (omitted in JSON).
func nonEmpty(p admin.Pairs) admin.Pairs {
	if len(p) == 0 {
		return nil
	}
	return p
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
			return changeRequest("list", args[1:])
		case "delete":
			if len(args) != 2 {
				return req, true, fmt.Errorf("override delete: give the override's id")
			}
			op, v = "override-delete", admin.IDArgs{ID: args[1]}
		case "set":
			a := admin.OverrideArgs{Key: admin.Pairs{}, Match: admin.Pairs{}}
			targetFlags(fs, &a.Rule, a.Key, a.Match)
			fs.Int64Var(&a.Limit, "limit", 0, "absolute limit")
			fs.StringVar(&a.Period, "period", "", "absolute limit's period")
			fs.Int64Var(&a.Burst, "burst", 0, "absolute limit's burst")
			fs.Float64Var(&a.Multiplier, "multiplier", 0, "multiplier of the limit and burst in force")
			expiry(fs, &a.TTL, &a.ExpiresAt, &a.Reason, &a.Author)
			if err := fs.Parse(args[1:]); err != nil {
				return req, true, fmt.Errorf("override set: %w", err)
			}
			if fs.NArg() > 0 {
				return req, true, fmt.Errorf("override set: unexpected %q: name the key with -key name=value", fs.Arg(0))
			}
			a.Key, a.Match = nonEmpty(a.Key), nonEmpty(a.Match)
			op, v = "override-set", a
		default:
			return req, true, fmt.Errorf("override %q: give set, delete ID or list", sub)
		}
	case "block":
		a := admin.BlockArgs{Key: admin.Pairs{}, Match: admin.Pairs{}}
		targetFlags(fs, &a.Rule, a.Key, a.Match)
		expiry(fs, &a.TTL, &a.ExpiresAt, &a.Reason, &a.Author)
		if err := fs.Parse(args); err != nil {
			return req, true, fmt.Errorf("block: %w", err)
		}
		if fs.NArg() > 0 {
			return req, true, fmt.Errorf("block: unexpected %q: name the key with -key name=value, globs with -match name=glob", fs.Arg(0))
		}
		a.Key, a.Match = nonEmpty(a.Key), nonEmpty(a.Match)
		v = a
	case "unblock":
		if len(args) != 1 {
			return req, true, fmt.Errorf("unblock: give the block's id")
		}
		v = admin.IDArgs{ID: args[0]}
	case "list":
		var a admin.ListArgs
		fs.IntVar(&a.Limit, "limit", 0, "entries per request")
		if err := fs.Parse(args); err != nil {
			return req, true, fmt.Errorf("list: %w", err)
		}
		if fs.NArg() > 0 {
			return req, true, fmt.Errorf("list: unexpected %q", fs.Arg(0))
		}
		if a.Limit != 0 {
			v = a
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
			target := "key " + admin.Pairs(o.Key).String()
			if len(o.Match) > 0 {
				target = "match " + admin.Pairs(o.Match).String()
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
			fmt.Fprintf(w, "override %s rule %s %s %s until %s by %s", o.ID, o.Rule, target, limit,
				o.Expires.Format(time.RFC3339), o.Author)
			if o.Reason != "" {
				fmt.Fprintf(w, ": %s", o.Reason)
			}
			if o.Orphaned {
				fmt.Fprint(w, " (orphaned: no such rule in force)")
			}
			fmt.Fprintln(w)
		}
		for _, b := range r.Blocks {
			target := "match " + admin.Pairs(b.Match).String()
			if b.Rule != "" {
				target = "rule " + b.Rule + " key " + admin.Pairs(b.Key).String()
			}
			fmt.Fprintf(w, "block %s %s until %s by %s", b.ID, target, b.Expires.Format(time.RFC3339), b.Author)
			if b.Reason != "" {
				fmt.Fprintf(w, ": %s", b.Reason)
			}
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

// maxPages bounds the pages listAll asks for.
const maxPages = 100_000

// listAll asks for every page of the list request req with call, and
// returns one answer holding them all.
func listAll(call func(admin.Request) (admin.Response, error), req admin.Request) (admin.Response, error) {
	var args admin.ListArgs
	if len(req.Args) > 0 {
		if err := json.Unmarshal(req.Args, &args); err != nil {
			return admin.Response{}, fmt.Errorf("list: %w", err)
		}
	}
	all := admin.ListResult{Overrides: []admin.OverrideEntry{}, Blocks: []admin.BlockEntry{}}
	for range maxPages {
		b, err := json.Marshal(args)
		if err != nil {
			return admin.Response{}, err
		}
		res, err := call(admin.Request{Op: "list", Args: b})
		if err != nil || res.Err != nil {
			return res, err
		}
		var page admin.ListResult
		if err := json.Unmarshal(res.Result, &page); err != nil {
			return admin.Response{}, fmt.Errorf("list: unreadable page: %w", err)
		}
		all.Overrides = append(all.Overrides, page.Overrides...)
		all.Blocks = append(all.Blocks, page.Blocks...)
		if page.Next == "" {
			out, err := json.Marshal(all)
			return admin.Response{Result: out}, err
		}
		if page.Next <= args.Cursor {
			return admin.Response{}, fmt.Errorf("list: the daemon's cursor went back (%q after %q)", page.Next, args.Cursor)
		}
		args.Cursor = page.Next
	}
	return admin.Response{}, fmt.Errorf("list: more than %d pages", maxPages)
}
