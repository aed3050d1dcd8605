package daemon

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMetricHelpMatchesOperations: the help texts that the packages give
// name exactly the families of docs/operations.md's metrics table, each
// once.
func TestMetricHelpMatchesOperations(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	row := regexp.MustCompile("^\\| (`rld_[^|]+) \\| (counter|gauge|histogram) \\|")
	name := regexp.MustCompile("`(rld_[a-z_]+)")
	documented := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			for _, n := range name.FindAllStringSubmatch(m[1], -1) {
				documented[n[1]] = true
			}
		}
	}
	require.NotEmpty(t, documented, "docs/operations.md has a metrics table")
	for n := range documented {
		assert.NotEmpty(t, metricHelp[n], "%s is in docs/operations.md but no package gives its help text", n)
	}
	for n, text := range metricHelp {
		assert.True(t, documented[n], "%s has a help text but no row in docs/operations.md", n)
		assert.True(t, strings.HasSuffix(text, "."), "the help text of %s is a sentence", n)
	}
}

// TestJoinHelpRefusesTwoOwners: a family two packages describe is a
// programming error, found when the daemon package loads.
func TestJoinHelpRefusesTwoOwners(t *testing.T) {
	assert.Equal(t, map[string]string{"rld_a": "A.", "rld_b": "B."},
		joinHelp(map[string]string{"rld_a": "A."}, map[string]string{"rld_b": "B."}))
	assert.PanicsWithValue(t, "daemon: two packages give a help text for the metric family rld_a", func() {
		joinHelp(map[string]string{"rld_a": "A."}, map[string]string{"rld_a": "again."})
	})
}
