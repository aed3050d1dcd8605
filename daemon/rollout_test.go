package daemon_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/wire"
)

// TestExplainRolloutShadow runs a daemon whose rule of limit 1 enforces
// 50% of its keys, and sends 200 keys over their limit through its
// socket: a key is refused exactly when `explain` says the rule enforces
// it, about half are; the others are admitted and counted as shadow
// denials and in rld_rollout_limited_total.
func TestExplainRolloutShadow(t *testing.T) {
	const rules = `
[[rule]]
name = "half"
by = ["api_key"]
algorithm = "fixed_window"
limit = 1
period = "1h"
enforce = "50%"
`
	l := startLogged(t, t.TempDir(), uidConfig(rules, os.Getuid()))
	c := client.New(l.d.SocketPath())
	defer c.Close()
	ctx := context.Background()
	const n = 200
	refused, shadowed := 0, 0
	// The counters are the process's: what this run adds is counted.
	series := []string{`rld_checks_total{rule="half",decision="shadow_limited"}`, `rld_rollout_limited_total{rule="half"}`,
		`rld_checks_total{rule="half",decision="limited"}`}
	before := make([]float64, len(series))
	for i, s := range series {
		before[i] = l.metric(t, s)
	}
	for k := range n {
		key := fmt.Sprintf("k%d", k)
		e, aerr := l.explain(t, "api_key", key)
		require.Nil(t, aerr)
		require.Len(t, e.Rules, 1)
		assert.Equal(t, "50%", e.Rules[0].Enforce)
		enforced := e.Rules[0].Enforced
		descs := []client.Descriptor{{Name: "api_key", Value: key}}
		res, err := c.Check(ctx, descs, 1)
		require.NoError(t, err)
		require.Equal(t, wire.StatusAllowed, res.Status, "key %s: first check", key)
		res, err = c.Check(ctx, descs, 1)
		require.NoError(t, err)
		if enforced {
			assert.Equal(t, wire.StatusLimited, res.Status, "key %s is enforced: refused over its limit", key)
			refused++
		} else {
			assert.Equal(t, wire.StatusAllowed, res.Status, "key %s is not enforced: admitted over its limit", key)
			shadowed++
		}
	}
	assert.InDelta(t, n/2, refused, n*0.15, "about half of the keys are enforced")
	for i, want := range []int{shadowed, shadowed, refused} {
		assert.Equal(t, float64(want), l.metric(t, series[i])-before[i], series[i])
	}
}
