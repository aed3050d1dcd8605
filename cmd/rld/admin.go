package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rld/rld/admin"
)

// adminCmd runs `rld admin [flags] OP [args]`: over the socket by default
// (the caller's uid must be in admin.socket_uids), over the admin HTTP API
// with -http and -token-file. Exit codes: 0 ok, 1 refused or not found,
// 2 error.
func adminCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("admin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", defaultSocket(), socketUsage)
	httpURL := fs.String("http", "", "use the admin HTTP API at this `URL` (http://127.0.0.1:9465) instead of the socket")
	tokenFile := fs.String("token-file", "", "`file` holding the admin HTTP API's bearer token (with -http)")
	asJSON := fs.Bool("json", false, "print the answer's JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	fs.Usage = func() { adminUsage(fs.Output(), fs) }
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if fs.NArg() == 0 {
		adminUsage(stderr, fs)
		return exitError
	}
	opName, opArgs := fs.Arg(0), fs.Args()[1:]
	if opName == "help" || slices.ContainsFunc(opArgs, isHelp) {
		// rld admin help, rld admin OP -h: the ops and their flags.
		adminUsage(stdout, fs)
		return 0
	}
	req, err := adminRequest(opName, opArgs)
	if err != nil {
		fmt.Fprintln(stderr, "rld admin:", err)
		return exitError
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	call := func(req admin.Request) (admin.Response, error) { return admin.CallSocket(ctx, *socket, req) }
	if *httpURL != "" {
		token := ""
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				fmt.Fprintln(stderr, "rld admin: cannot read -token-file:", err)
				return exitError
			}
			token = strings.TrimRight(string(b), "\r\n")
		}
		call = func(req admin.Request) (admin.Response, error) { return admin.CallHTTP(ctx, *httpURL, token, req) }
	}
	var res admin.Response
	if req.Op == "list" {
		res, err = listAll(call, req)
	} else {
		res, err = call(req)
	}
	if err != nil {
		fmt.Fprintln(stderr, "rld admin:", err)
		return exitError
	}
	if res.Err != nil {
		fmt.Fprintf(stderr, "rld admin %s: %s: %s\n", opName, res.Err.Code, res.Err.Message)
		switch res.Err.Code {
		case admin.CodeForbidden, admin.CodeUnauthorized, admin.CodeNotFound, admin.CodeUnknownOp:
			return exitDenied
		}
		return exitError
	}
	if *asJSON {
		fmt.Fprintln(stdout, string(res.Result))
		return 0
	}
	if err := printAdmin(stdout, opName, res.Result); err != nil {
		fmt.Fprintln(stderr, "rld admin:", err)
		return exitError
	}
	return 0
}

func adminUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "usage: rld admin [-socket PATH | -http URL -token-file FILE] [-json] [-timeout D] OP [ARGS...]")
	fmt.Fprintln(w, "\nRun an admin op on the daemon: over its socket (the caller's uid must be in")
	fmt.Fprintln(w, "admin.socket_uids, default root), or over the admin HTTP API with -http and")
	fmt.Fprintln(w, "-token-file. The flags above come before OP; each op's own flags after it.")
	fmt.Fprintln(w, "\nops:")
	fmt.Fprintln(w, "  explain [-cost N] name=value...   the rules that match, their keys, limits and remaining (consumes nothing)")
	fmt.Fprintln(w, "  top [-rule NAME] [-n N] [-local]   the most denied keys of each rule, of the fleet on Redis")
	fmt.Fprintln(w, "  config                             the configuration in force: hash, path, load time, rules")
	fmt.Fprintln(w, "  reset [-rule R] [-key n=v...] [name=value...]")
	fmt.Fprintln(w, "                                     clear counters: every rule's that matches the descriptors, or one rule's")
	fmt.Fprintln(w, "  grant -n N [-rule R] [-key n=v...] [name=value...]")
	fmt.Fprintln(w, "                                     add N units to counters' current quota")
	fmt.Fprintln(w, "  override set -rule R (-key n=v... | -match n=glob...) (-limit N [-period P] [-burst B] | -multiplier F)")
	fmt.Fprintln(w, "               (-ttl D | -expires T) [-reason TEXT] [-author WHO]   a limit for a key or glob, until an expiry")
	fmt.Fprintln(w, "  override delete ID                 remove an override")
	fmt.Fprintln(w, "  list [-limit N], override list     the overrides and blocks in force (all pages, N entries per request)")
	fmt.Fprintln(w, "  block (-match n=glob... | -rule R -key n=v...) (-ttl D | -expires T) [-reason TEXT] [-author WHO]")
	fmt.Fprintln(w, "                                     refuse (blocked) until an expiry")
	fmt.Fprintln(w, "  unblock ID                         remove a block")
	fmt.Fprintln(w, "\n-rule, -key n=v (repeat, or n=v,n2=v2) and -match n=glob mean the same in every op.")
	fmt.Fprintln(w, "\nexit status: 0 ok, 1 refused or not found (forbidden, unauthorized, not_found,")
	fmt.Fprintln(w, "unknown_op), 2 any other error (a bad flag or argument, bad_request, no daemon)")
	fmt.Fprintln(w, "\nflags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// adminRequest builds the request of op from its command-line arguments.
func adminRequest(op string, args []string) (admin.Request, error) {
	if req, ok, err := changeRequest(op, args); ok {
		return req, err
	}
	fs := flag.NewFlagSet(op, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var v any
	switch op {
	case "explain":
		cost := fs.Int64("cost", 0, "units a check would take")
		if err := fs.Parse(args); err != nil {
			return admin.Request{}, fmt.Errorf("explain: %w", err)
		}
		a := admin.ExplainArgs{Cost: *cost}
		for _, kv := range fs.Args() {
			name, value, ok := strings.Cut(kv, "=")
			if !ok || name == "" {
				return admin.Request{}, fmt.Errorf("explain: descriptor %q is not name=value", kv)
			}
			a.Descriptors = append(a.Descriptors, admin.Descriptor{Name: name, Value: value})
		}
		v = a
	case "reset", "grant":
		a, err := stateArgs(op, fs, args)
		if err != nil {
			return admin.Request{}, err
		}
		v = a
	case "top":
		rule := fs.String("rule", "", "only this rule")
		n := fs.Int("n", 0, "keys per rule")
		local := fs.Bool("local", false, "this daemon's denials only, not the fleet's")
		if err := fs.Parse(args); err != nil {
			return admin.Request{}, fmt.Errorf("top: %w", err)
		}
		v = admin.TopArgs{Rule: *rule, N: *n, Local: admin.Flag(*local)}
	default:
		// config, and ops this CLI does not know: arguments are
		// name=value pairs of a JSON object of strings.
		obj := map[string]string{}
		for _, kv := range args {
			name, value, ok := strings.Cut(kv, "=")
			if !ok || name == "" {
				return admin.Request{}, fmt.Errorf("%s: argument %q is not name=value", op, kv)
			}
			obj[name] = value
		}
		if len(obj) > 0 {
			v = obj
		}
	}
	req := admin.Request{Op: op}
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return admin.Request{}, err
		}
		req.Args = b
	}
	return req, nil
}

// printDecision prints the answer a check would get, as explain finds it.
func printDecision(w io.Writer, d *admin.ExplainDecision) {
	by := d.Rule
	if by == "" {
		by = "no rule"
	}
	fmt.Fprintf(w, "a check now: %s by %s", d.Status, by)
	switch d.Status {
	case "error":
		fmt.Fprintf(w, " %s: %s\n", d.Code, d.Message)
	case "limited":
		fmt.Fprintf(w, " remaining=%d retry_after=%dms\n", d.Remaining, d.RetryAfterMs)
	case "blocked":
		fmt.Fprintln(w)
	default:
		fmt.Fprintf(w, " remaining=%d reset=%dms\n", d.Remaining, d.ResetMs)
	}
}

// printRuleState ends an explained rule's line with what it says.
func printRuleState(w io.Writer, m *admin.RuleMatch) {
	switch {
	case m.Blocked:
		fmt.Fprintln(w, " blocked")
	case m.Error != "":
		fmt.Fprintf(w, " error: %s\n", m.Error)
	case m.Code != "":
		fmt.Fprintf(w, " %s\n", m.Code)
	case m.Allowed == nil || m.Remaining == nil || m.ResetMs == nil:
		fmt.Fprintf(w, " %s\n", m.Status)
	case *m.Allowed:
		fmt.Fprintf(w, " remaining=%d reset=%dms\n", *m.Remaining, *m.ResetMs)
	case m.Cooldown:
		fmt.Fprintf(w, " limited (penalty cooldown) retry_after=%dms\n", m.RetryAfterMs)
	default:
		fmt.Fprintf(w, " remaining=%d limited retry_after=%dms\n", *m.Remaining, m.RetryAfterMs)
	}
}

// printAdmin prints an op's result for a reader.
func printAdmin(w io.Writer, op string, result json.RawMessage) error {
	if ok, err := printChanges(w, op, result); ok {
		return err
	}
	switch op {
	case "explain":
		var r admin.ExplainResult
		if err := json.Unmarshal(result, &r); err != nil {
			return fmt.Errorf("unreadable answer: %w", err)
		}
		if r.List != "" {
			fmt.Fprintf(w, "%s list: matched; it decides before any rule\n", r.List)
		}
		printDecision(w, &r.Decision)
		if len(r.Rules) == 0 {
			fmt.Fprintln(w, "no rule matches")
		}
		for _, m := range r.Rules {
			fmt.Fprintf(w, "%s: ", m.Rule)
			if m.Missing != "" {
				fmt.Fprintf(w, "does not apply (no %s descriptor)\n", m.Missing)
				continue
			}
			limit := fmt.Sprintf("%d/%s", m.Limit, m.Period)
			if m.Burst > 0 {
				limit += fmt.Sprintf(" burst %d", m.Burst)
			}
			if m.Tier != "" {
				limit += " tier " + m.Tier
			}
			fmt.Fprintf(w, "key %s %s %s %s fail=%s", m.Key, m.Algorithm, limit, m.Mode, m.Fail)
			if m.Shadow {
				fmt.Fprint(w, " shadow")
			}
			if m.Enforce != "" && m.Enforce != "100%" {
				state := "not enforced on this key"
				if m.Enforced {
					state = "enforced on this key"
				}
				fmt.Fprintf(w, " enforce=%s (%s)", m.Enforce, state)
			}
			if m.Overridden {
				fmt.Fprint(w, " overridden")
			}
			printRegion(w, m.Region)
			printRuleState(w, &m)
		}
	case "reset", "grant":
		return printState(w, result)
	case "top":
		var r admin.TopResult
		if err := json.Unmarshal(result, &r); err != nil {
			return fmt.Errorf("unreadable answer: %w", err)
		}
		printTop(w, &r)
	case "config":
		var r admin.ConfigResult
		if err := json.Unmarshal(result, &r); err != nil {
			return fmt.Errorf("unreadable answer: %w", err)
		}
		fmt.Fprintf(w, "%s hash %s loaded %s, %d rules\n", r.Path, r.Hash, r.LoadedAt.Format(time.RFC3339), len(r.Rules))
		for _, s := range r.Rules {
			fmt.Fprintln(w, s)
		}
	default:
		fmt.Fprintln(w, string(result))
	}
	return nil
}

// printTop prints top's answer: whose denials it counts, then each
// rule's most denied keys, with the daemons that denied each.
func printTop(w io.Writer, r *admin.TopResult) {
	if r.Warning != "" {
		fmt.Fprintf(w, "warning: %s\n", r.Warning)
	}
	what := "this daemon"
	if r.Fleet {
		what = fmt.Sprintf("the fleet: %d daemons heard from", len(r.Daemons))
	}
	fmt.Fprintf(w, "denials of %s\n", what)
	for _, d := range r.Daemons {
		if d.Self {
			fmt.Fprintf(w, "  %s (this daemon)\n", d.Daemon)
		} else {
			fmt.Fprintf(w, "  %s (report %dms old)\n", d.Daemon, d.AgeMs)
		}
	}
	if len(r.Rules) == 0 {
		fmt.Fprintln(w, "no denials yet")
	}
	for _, rt := range r.Rules {
		fmt.Fprintf(w, "%s: %d denied\n", rt.Rule, rt.Denied)
		for _, k := range rt.Keys {
			fmt.Fprintf(w, "  %d\t(±%d)\t%s", k.Count, k.Error, k.Key)
			if r.Fleet {
				by := make([]string, len(k.By))
				for i, b := range k.By {
					by[i] = fmt.Sprintf("%s=%d", b.Daemon, b.Count)
				}
				fmt.Fprintf(w, "\t[%s]", strings.Join(by, " "))
			}
			fmt.Fprintln(w)
		}
	}
}

// printRegion prints a global rule's regional share, when it has one.
func printRegion(w io.Writer, rs *admin.RegionShare) {
	if rs == nil {
		return
	}
	none := "fallback share"
	if rs.Strict {
		none = "strict: the next check asks the global store"
	}
	state := none + ", no lease"
	switch {
	case rs.Live && rs.ExpiresMs != nil:
		state = fmt.Sprintf("lease, %dms left", *rs.ExpiresMs)
	case rs.ExpiresMs != nil:
		state = fmt.Sprintf("%s, lease expired %dms ago", none, -*rs.ExpiresMs)
	}
	fmt.Fprintf(w, " region %s share %d of %d (%s; fallback %d; region demand %d/period)", rs.Region, rs.Share, rs.Limit, state, rs.Fallback, rs.Demand)
}
