package decisions

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/config"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
)

func twoRules(t *testing.T) *policy.Policy {
	t.Helper()
	cfg, err := config.Parse([]byte("[[rule]]\nname = \"a\"\nby = [\"k\"]\nlimit = 1\nperiod = \"1h\"\n"+
		"[[rule]]\nname = \"b\"\nby = [\"k\"]\nlimit = 1\nperiod = \"1h\"\n"), "t.toml")
	require.NoError(t, err)
	p, err := policy.New(cfg, memstore.New(memstore.Options{}))
	require.NoError(t, err)
	return p
}

// TestMergeSumsReports: the fleet's top sums each key's denials over the
// daemons, lists each key's daemons most first, orders keys by count,
// keeps N, lists the rules of the policy in order then those only the
// reports name, and refuses a rule nobody knows.
func TestMergeSumsReports(t *testing.T) {
	p := twoRules(t)
	m := newTopMerge()
	m.add("d1", topReport{Rules: []admin.RuleTop{
		{Rule: "b", Denied: 10, Keys: []admin.KeyCount{{Key: "k=x", Count: 6}, {Key: "k=y", Count: 4}}},
	}})
	m.add("d2", topReport{Rules: []admin.RuleTop{
		{Rule: "b", Denied: 9, Keys: []admin.KeyCount{{Key: "k=y", Count: 8, Error: 1}, {Key: "k=z", Count: 1}}},
		{Rule: "gone", Denied: 2, Keys: []admin.KeyCount{{Key: "k=q", Count: 2}}},
	}})
	res, err := m.result(p, admin.TopArgs{N: 2})
	require.NoError(t, err)
	require.Len(t, res.Rules, 2, "rule a denied nothing: left out")
	b := res.Rules[0]
	assert.Equal(t, "b", b.Rule)
	assert.Equal(t, uint64(19), b.Denied)
	require.Len(t, b.Keys, 2, "N keys")
	assert.Equal(t, "k=y", b.Keys[0].Key)
	assert.Equal(t, uint64(12), b.Keys[0].Count)
	assert.Equal(t, uint64(1), b.Keys[0].Error)
	assert.Equal(t, []admin.DaemonCount{{Daemon: "d2", Count: 8}, {Daemon: "d1", Count: 4}}, b.Keys[0].By)
	assert.Equal(t, "k=x", b.Keys[1].Key)
	assert.Equal(t, "gone", res.Rules[1].Rule, "a rule only a report names comes after the policy's")

	res, err = m.result(p, admin.TopArgs{Rule: "a"})
	require.NoError(t, err)
	require.Len(t, res.Rules, 1, "a rule asked for is listed even with no denials")
	assert.Empty(t, res.Rules[0].Keys)

	_, err = m.result(p, admin.TopArgs{Rule: "nope"})
	var ae *admin.Error
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, admin.CodeNotFound, ae.Code)
}
