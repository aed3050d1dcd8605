package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/algo"
	"github.com/rld/rld/client"
	"github.com/rld/rld/wire"
)

// stateLimit is the limit of every rule of the reset and grant tests,
// per hour: nothing refills during a test.
const stateLimit = 10

// stateConfig returns rld.toml with one rule per algorithm (selected by
// the descriptor alg, counting by api_key) in mode (sliding_log is
// always strict), admin frames allowed to this process's uid, and store
// (a [store] body, or "" for the embedded store).
func stateConfig(store, mode string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[admin]\nsocket_uids = [%d]\n", os.Getuid())
	if store != "" {
		fmt.Fprintf(&b, "\n[store]\n%s\ntimeout = %q\n", store, fleetTimeout)
	}
	for _, k := range fleetKinds {
		m := mode
		if k == algo.SlidingLog {
			m = "strict"
		}
		fmt.Fprintf(&b, "\n[[rule]]\nname = %q\nmatch = { alg = %q }\nby = [\"api_key\"]\nalgorithm = %q\nlimit = %d\nperiod = \"1h\"\nmode = %q\n",
			k.String(), k.String(), k.String(), stateLimit, m)
	}
	return b.String()
}

func stateDescs(k algo.Kind, key string) []client.Descriptor {
	return []client.Descriptor{{Name: "alg", Value: k.String()}, {Name: "api_key", Value: key}}
}

// adminCall sends op with args over the socket at path.
func adminCall(t *testing.T, path, op string, args any) (admin.StateResult, *admin.Error) {
	t.Helper()
	b, err := json.Marshal(args)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := admin.CallSocket(ctx, path, admin.Request{Op: op, Args: b})
	require.NoError(t, err)
	var out admin.StateResult
	if res.Err == nil {
		require.NoError(t, json.Unmarshal(res.Result, &out))
	}
	return out, res.Err
}

// hammerAll sends n checks of descs through each client, three at a time,
// and returns how many were admitted. Each client has its own n: a
// daemon that denies from its cache answers many times faster than one
// that asks Redis, and with one count for all of them the fast ones
// would take nearly every check.
func hammerAll(t *testing.T, cs []*client.Client, descs []client.Descriptor, n int) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, c := range cs {
		var sent atomic.Int64
		for range 3 {
			wg.Go(func() {
				for sent.Add(1) <= int64(n) {
					res, err := c.Check(context.Background(), descs, 1)
					if err != nil || res.Status == wire.StatusError {
						t.Errorf("check: %v %+v", err, res)
						return
					}
					if res.Status == wire.StatusAllowed {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return admitted.Load()
}

// useUp checks descs through each client in turn until every one is
// refused.
func useUp(t *testing.T, cs []*client.Client, descs []client.Descriptor) {
	t.Helper()
	for range 100 {
		refused := 0
		for _, c := range cs {
			res, err := c.Check(context.Background(), descs, 1)
			require.NoError(t, err)
			if res.Status == wire.StatusLimited {
				refused++
			}
		}
		if refused == len(cs) {
			return
		}
	}
	t.Fatal("the key was never used up")
}

// checkResetGrant resets and grants, through the admin socket of the
// first daemon, keys used up through every daemon (clients cs, one per
// daemon, whose admin sockets are socks), on every algorithm of mode:
// after a reset the next check on each daemon sees a fresh key, and
// hammering the key from all of them admits exactly the limit; after a
// grant of n, exactly n more are admitted.
func checkResetGrant(t *testing.T, socks []string, cs []*client.Client, mode string) {
	for _, k := range fleetKinds {
		if mode == "cached" && k == algo.SlidingLog {
			continue // strict only
		}
		t.Run(k.String(), func(t *testing.T) {
			key := fmt.Sprintf("%s-%s-%d", mode, k, time.Now().UnixNano())
			descs := stateDescs(k, key)
			useUp(t, cs, descs)

			res, aerr := adminCall(t, socks[0], "reset", admin.ResetArgs{Target: admin.Target{Rule: k.String(), Key: admin.Pairs{"api_key": key}}})
			require.Nil(t, aerr)
			require.Len(t, res.Counters, 1)
			assert.Equal(t, k.String(), res.Counters[0].Rule)
			assert.Equal(t, int64(stateLimit-1), res.Counters[0].Remaining, "fresh, as a check of 1 would report")
			for i, c := range cs {
				r, err := c.Check(context.Background(), descs, 1)
				require.NoError(t, err)
				require.Equal(t, wire.StatusAllowed, r.Status, "daemon %d after the reset", i)
				assert.Equal(t, uint64(stateLimit-1-i), r.Remaining, "daemon %d: a fresh key, less the checks since the reset", i)
			}
			got := hammerAll(t, cs, descs, 5*stateLimit)
			assert.Equal(t, int64(stateLimit-len(cs)), got, "the rest of the fresh limit, no more")

			// Grant, by descriptors this time: exactly n more.
			const n = 4
			res, aerr = adminCall(t, socks[0], "grant", admin.GrantArgs{Target: admin.Target{Rule: k.String(),
				Descriptors: []admin.Descriptor{{Name: "alg", Value: k.String()}, {Name: "api_key", Value: key}}}, N: n})
			require.Nil(t, aerr)
			require.Len(t, res.Counters, 1)
			assert.Equal(t, int64(n-1), res.Counters[0].Remaining)
			assert.Equal(t, int64(n), hammerAll(t, cs, descs, 5*n), "a grant of %d", n)
		})
	}
}

// TestResetGrantEmbedded: reset and grant on the embedded store, every
// algorithm, through the admin socket; bad requests change nothing.
func TestResetGrantEmbedded(t *testing.T) {
	decisions := filepath.Join(t.TempDir(), "decisions.log")
	s := start(t, fmt.Sprintf("[log]\ndecisions = %q\n", decisions)+stateConfig("", "cached"))
	c := client.New(s.Socket)
	defer c.Close()
	checkResetGrant(t, []string{s.Socket}, []*client.Client{c}, "embedded")

	// Bad requests: a clear error, nothing changed.
	descs := stateDescs(algo.FixedWindow, "bad")
	useUp(t, []*client.Client{c}, descs)
	target := admin.Target{Rule: "fixed_window", Key: admin.Pairs{"api_key": "bad"}}
	for _, tc := range []struct {
		op   string
		args any
		code admin.Code
		msg  string
	}{
		{"reset", admin.ResetArgs{Target: admin.Target{Rule: "nope", Key: admin.Pairs{"api_key": "bad"}}}, admin.CodeNotFound, `unknown rule "nope"`},
		{"reset", admin.ResetArgs{Target: admin.Target{Key: admin.Pairs{"api_key": "bad"}}}, admin.CodeBadRequest, "give its rule too"},
		{"reset", admin.ResetArgs{Target: admin.Target{Rule: "fixed_window", Key: admin.Pairs{"tenant": "bad"}}}, admin.CodeNotFound, "is not a key of rule"},
		{"reset", admin.ResetArgs{Target: admin.Target{Descriptors: []admin.Descriptor{{Name: "alg", Value: "none"}}}}, admin.CodeNotFound, "no rule counts"},
		{"reset", admin.ResetArgs{}, admin.CodeBadRequest, "give descriptors"},
		{"grant", admin.GrantArgs{Target: target, N: 0}, admin.CodeBadRequest, "n = 0"},
		{"grant", admin.GrantArgs{Target: target, N: -3}, admin.CodeBadRequest, "n = -3"},
		{"grant", map[string]any{"rule": "fixed_window", "key": "api_key=bad", "n": 1, "extra": 1}, admin.CodeBadRequest, "unknown field"},
		{"reset", admin.ResetArgs{Target: admin.Target{Rule: "fixed_window", Key: admin.Pairs{"api_key": "bad", "tenant": "t"}}}, admin.CodeNotFound, "is not a key of rule"},
		{"reset", map[string]any{"rule": "fixed_window", "key": "api_key"}, admin.CodeBadRequest, "not name=value"},
		{"reset", map[string]any{"rule": "fixed_window", "key": "api_key=bad,api_key=b"}, admin.CodeBadRequest, "given twice"},
		{"grant", map[string]any{"descriptors": map[string]any{"api_key": 1}, "n": 1}, admin.CodeBadRequest, "must be a string"},
	} {
		_, aerr := adminCall(t, s.Socket, tc.op, tc.args)
		if assert.NotNil(t, aerr, "%s %+v", tc.op, tc.args) {
			assert.Equal(t, tc.code, aerr.Code, "%s %+v", tc.op, tc.args)
			assert.Contains(t, aerr.Message, tc.msg)
		}
	}
	r, err := c.Check(context.Background(), descs, 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusLimited, r.Status, "the refused requests changed nothing")

	// Every rule that matches: one reset, every counter.
	res, aerr := adminCall(t, s.Socket, "reset", admin.ResetArgs{Target: admin.Target{Descriptors: []admin.Descriptor{{Name: "alg", Value: "fixed_window"}, {Name: "api_key", Value: "bad"}}}})
	require.Nil(t, aerr)
	require.Len(t, res.Counters, 1)
	r, err = c.Check(context.Background(), descs, 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusAllowed, r.Status)

	// Every change is in the decision log with its caller, refused or not.
	b, err := os.ReadFile(decisions)
	require.NoError(t, err)
	who := fmt.Sprintf(`"who":"uid=%d"`, os.Getuid())
	var resets, grants, refused int
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.Contains(line, `"kind":"admin"`) {
			continue
		}
		assert.Contains(t, line, who)
		switch {
		case strings.Contains(line, `"ok":false`):
			refused++
		case strings.Contains(line, `"op":"reset"`):
			resets++
		case strings.Contains(line, `"op":"grant"`):
			grants++
		}
	}
	assert.Equal(t, len(fleetKinds)+1, resets)
	assert.Equal(t, len(fleetKinds), grants)
	assert.Equal(t, 12, refused)
}
