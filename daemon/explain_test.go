package daemon_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/client"
)

const explainLists = `deny = ["ip=10.*"]
allow = ["ip=192.0.2.200"]
`

const explainRules = `
[[rule]]
name = "short"
by = ["api_key"]
algorithm = "fixed_window"
limit = 2
period = "1m"
[[rule]]
name = "long"
match = { endpoint = "/v1/*" }
by = ["api_key"]
algorithm = "token_bucket"
limit = 1
period = "1h"
[[rule]]
name = "per-ip"
by = ["ip"]
limit = 5
period = "1m"
[[rule]]
name = "trial"
by = ["user"]
algorithm = "fixed_window"
limit = 1
period = "1h"
shadow = true
[[rule]]
name = "login"
by = ["login"]
algorithm = "fixed_window"
limit = 1
period = "10s"
penalty = { after = 1, factor = 10, max = "10m" }
`

// TestExplainAgreesWithCheck runs each case of a table through explain,
// then through a real check over the socket: the status, error code,
// deciding rule, remaining and (up to the milliseconds between the two)
// retry-after that explain's decision gives are the check's. The cases
// are every answer explain can show: allowed by the rule with the least
// remaining; limited, reported by the later rule whose refusal lasts
// longest; a cost above capacity (cost_too_large, no retry-after); a
// key block (blocked, not allowed); a descriptor block and the deny list
// (blocked by deny); the allow list; a rule whose by descriptor is
// missing (not applying: no status, no numbers); a shadow rule that would
// refuse; a penalty cooldown.
func TestExplainAgreesWithCheck(t *testing.T) {
	l := startLogged(t, t.TempDir(), explainLists+uidConfig(explainRules, os.Getuid()))
	sock := l.d.SocketPath()
	c := client.New(sock)
	defer c.Close()
	ctx := context.Background()
	check := func(cost uint32, kv ...string) {
		t.Helper()
		_, err := c.Check(ctx, pairs(kv), cost)
		require.NoError(t, err)
	}

	// Setup: "long" used up for api_key=both (and "short" too, with the
	// shorter retry-after: "long" is a token bucket, whose one token
	// comes back an hour after, not a fixed window, which in an hour's
	// last minute would end with "short"'s), a key block and a
	// descriptor block, a key in a penalty cooldown.
	check(1, "api_key", "both", "endpoint", "/v1/x")
	check(1, "api_key", "both")
	require.Nil(t, changeCall(t, sock, "block", admin.BlockArgs{Rule: "per-ip", Key: admin.Pairs{"ip": "192.0.2.66"}, TTL: "1h", Reason: "test"}, nil))
	require.Nil(t, changeCall(t, sock, "block", admin.BlockArgs{Match: admin.Pairs{"api_key": "evil*"}, TTL: "1h", Reason: "test"}, nil))
	for range 4 { // allowed, refused, then early retries into the cooldown
		_, _ = c.Check(ctx, pairs([]string{"login", "pw"}), 1)
	}

	cases := []struct {
		name     string
		kv       []string
		cost     uint32
		status   string
		code     string
		rule     string
		retry    bool // a retry-after is answered
		missing  string
		cooldown bool
	}{
		{name: "allowed, least remaining", kv: []string{"api_key", "a1", "ip", "192.0.2.1"}, status: "allowed", rule: "short"},
		{name: "limited, the longest refusal", kv: []string{"api_key", "both", "endpoint", "/v1/y"}, status: "limited", rule: "long", retry: true},
		{name: "cost above capacity", kv: []string{"api_key", "a2"}, cost: 3, status: "error", code: "cost_too_large", rule: "short"},
		{name: "key block", kv: []string{"ip", "192.0.2.66"}, status: "blocked", rule: "per-ip", missing: "api_key"},
		{name: "descriptor block", kv: []string{"api_key", "evil1"}, status: "blocked", rule: "deny"},
		{name: "deny list", kv: []string{"ip", "10.0.0.1"}, status: "blocked", rule: "deny", missing: "api_key"},
		{name: "allow list", kv: []string{"ip", "192.0.2.200"}, status: "allowed", rule: "allow", missing: "api_key"},
		{name: "missing descriptor", kv: []string{"endpoint", "/v1/x", "ip", "192.0.2.2"}, status: "allowed", rule: "per-ip", missing: "api_key"},
		{name: "no rule applies", kv: []string{"endpoint", "/v1/x"}, status: "allowed", rule: "", missing: "api_key"},
		{name: "shadow would refuse", kv: []string{"user", "u1", "ip", "192.0.2.3"}, status: "allowed", rule: "per-ip", missing: "api_key"},
		{name: "penalty cooldown", kv: []string{"login", "pw"}, status: "limited", rule: "login", retry: true, cooldown: true, missing: "api_key"},
	}
	// The shadow rule's key used up.
	check(1, "user", "u1")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var e admin.ExplainResult
			args := admin.ExplainArgs{Cost: int64(tc.cost)}
			for i := 0; i < len(tc.kv); i += 2 {
				args.Descriptors = append(args.Descriptors, admin.Descriptor{Name: tc.kv[i], Value: tc.kv[i+1]})
			}
			require.Nil(t, changeCall(t, sock, "explain", args, &e))
			d := e.Decision
			assert.Equal(t, tc.status, d.Status, "explain's status")
			assert.Equal(t, tc.code, d.Code, "explain's code")
			assert.Equal(t, tc.rule, d.Rule, "explain's rule")
			assert.Equal(t, tc.status == "allowed", d.Allowed, "explain's allowed")
			assert.Equal(t, tc.retry, d.RetryAfterMs > 0, "explain's retry-after: %d", d.RetryAfterMs)
			missing := ""
			for _, m := range e.Rules {
				switch {
				case m.Missing != "":
					if m.Rule == "short" {
						missing = m.Missing
					}
					assert.Empty(t, m.Status, "%s does not apply", m.Rule)
					assert.Nil(t, m.Allowed, "%s does not apply: no allowed", m.Rule)
					assert.Nil(t, m.Remaining, "%s does not apply: no remaining", m.Rule)
				case m.Blocked:
					assert.Equal(t, "blocked", m.Status)
					require.NotNil(t, m.Allowed)
					assert.False(t, *m.Allowed, "a blocked rule is not allowed")
					assert.Nil(t, m.Remaining, "a block has no remaining")
				case m.Code == "cost_too_large":
					assert.Equal(t, "error", m.Status)
					require.NotNil(t, m.Allowed)
					assert.False(t, *m.Allowed)
					assert.Zero(t, m.RetryAfterMs, "never: no retry-after")
				case m.Rule == "trial":
					assert.False(t, m.Enforced, "a shadow rule enforces nothing")
					assert.Equal(t, "limited", m.Status, "what the shadow rule would say")
				case m.Rule == "login":
					assert.Equal(t, tc.cooldown, m.Cooldown)
				}
			}
			assert.Equal(t, tc.missing, missing, "the rule by api_key does not apply without it")

			cost := max(tc.cost, 1)
			res, err := c.Check(ctx, pairs(tc.kv), cost)
			status, code := res.Status.String(), ""
			var re *client.ResponseError
			if errors.As(err, &re) {
				status, code = "error", re.Code.String()
			} else {
				require.NoError(t, err)
			}
			rule := res.Rule
			assert.Equal(t, status, d.Status, "the check's status")
			assert.Equal(t, code, d.Code, "the check's code")
			if status != "error" {
				assert.Equal(t, rule, d.Rule, "the check's rule")
				assert.Equal(t, res.Remaining, d.Remaining, "the check's remaining")
				assert.Equal(t, res.Limit, d.Limit, "the check's limit")
			}
			switch {
			case tc.cooldown:
				// The check is one more early retry: its refusal is the
				// penalty's, at least what explain said is left.
				assert.GreaterOrEqual(t, res.RetryAfter.Milliseconds()+1000, d.RetryAfterMs, "the check's retry-after")
			case tc.retry:
				assert.InDelta(t, res.RetryAfter.Milliseconds(), d.RetryAfterMs, 1000, "the check's retry-after")
			}
		})
	}
}

func pairs(kv []string) []client.Descriptor {
	out := make([]client.Descriptor, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		out = append(out, client.Descriptor{Name: kv[i], Value: kv[i+1]})
	}
	return out
}
