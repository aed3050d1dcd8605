package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const penaltyBase = "[[rule]]\nname = \"r\"\nby = [\"ip\"]\nlimit = 1\nperiod = \"1s\"\n"

// TestPenaltyFields parses penalty, block_after and retry_jitter.
func TestPenaltyFields(t *testing.T) {
	c, err := Parse([]byte(penaltyBase+`penalty = { after = 3, factor = 2, max = "1m" }
block_after = { refusals = 50, within = "1m", for = "1h" }
retry_jitter = "250ms"
`), "p.toml")
	require.NoError(t, err)
	r := c.Rules[0]
	assert.Equal(t, Penalty{After: 3, Factor: 2, Max: Duration(time.Minute)}, *r.Penalty)
	assert.Equal(t, BlockAfter{Refusals: 50, Within: Duration(time.Minute), For: Duration(time.Hour)}, *r.BlockAfter)
	assert.Equal(t, Jitter{Fixed: 250 * time.Millisecond}, r.RetryJitter)
	assert.Equal(t, "r: token_bucket 1/1s by ip cached fail=open penalty after=3 factor=2 max=1m block_after=50/1m for=1h jitter=250ms", r.Summary())

	c, err = Parse([]byte(penaltyBase+"retry_jitter = \"0.1\"\n"), "p.toml")
	require.NoError(t, err)
	assert.Equal(t, Jitter{Fraction: 0.1}, c.Rules[0].RetryJitter)

	c, err = Parse([]byte(penaltyBase), "p.toml")
	require.NoError(t, err)
	assert.Nil(t, c.Rules[0].Penalty, "absent: none")
	assert.Nil(t, c.Rules[0].BlockAfter)
	assert.True(t, c.Rules[0].RetryJitter.IsZero())
}

// TestPenaltyInvalid: each bad value is reported with its field.
func TestPenaltyInvalid(t *testing.T) {
	for extra, want := range map[string]string{
		`penalty = { after = 0, factor = 2, max = "1m" }`:                  "penalty.after = 0",
		`penalty = { after = 3, factor = 1, max = "1m" }`:                  "penalty.factor = 1",
		`penalty = { after = 3, factor = 2 }`:                              "penalty.max",
		`block_after = { refusals = 0, within = "1m", for = "1h" }`:        "block_after.refusals = 0",
		`block_after = { refusals = 5, within = "0s", for = "1h" }`:        "block_after.within",
		`block_after = { refusals = 5, within = "1m" }`:                    "block_after.for",
		`retry_jitter = "1.5"`:                                             "a fraction of the Retry-After is 0 to 1",
		`retry_jitter = "-1s"`:                                             "retry_jitter",
		`retry_jitter = "soon"`:                                            "want a duration",
		"shadow = true\npenalty = { after = 3, factor = 2, max = \"1m\" }": "a shadow rule never refuses",
	} {
		_, err := Parse([]byte(penaltyBase+extra+"\n"), "p.toml")
		require.Error(t, err, extra)
		assert.Contains(t, err.Error(), want, extra)
	}
}
