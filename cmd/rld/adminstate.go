package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/rld/rld/admin"
)

// stateArgs parses the arguments of reset and grant: -rule, -key (as
// override and block take them), -n (grant) and name=value descriptors.
func stateArgs(op string, fs *flag.FlagSet, args []string) (any, error) {
	t := admin.Target{Key: admin.Pairs{}}
	targetFlags(fs, &t.Rule, t.Key, nil)
	var n *int64
	if op == "grant" {
		n = fs.Int64("n", 0, "units to add")
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	t.Key = nonEmpty(t.Key)
	for _, kv := range fs.Args() {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%s: descriptor %q is not name=value", op, kv)
		}
		t.Descriptors = append(t.Descriptors, admin.Descriptor{Name: name, Value: value})
	}
	if op == "grant" {
		return admin.GrantArgs{Target: t, N: *n}, nil
	}
	return admin.ResetArgs{Target: t}, nil
}

// printState prints the answer of reset or grant: one line per counter.
func printState(w io.Writer, result json.RawMessage) error {
	var r admin.StateResult
	if err := json.Unmarshal(result, &r); err != nil {
		return fmt.Errorf("unreadable answer: %w", err)
	}
	for _, c := range r.Counters {
		fmt.Fprintf(w, "%s: key %s %s %s", c.Rule, c.Key, c.Algorithm, c.Mode)
		if c.Tier != "" {
			fmt.Fprintf(w, " tier %s", c.Tier)
		}
		if c.Error != "" {
			fmt.Fprintf(w, " error: %s\n", c.Error)
			continue
		}
		fmt.Fprintf(w, " remaining=%d reset=%dms\n", c.Remaining, c.ResetMs)
	}
	return nil
}
