package packaging

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDebVersion: scripts/version.sh maps what git describe prints to a
// Debian version that sorts as the commits do.
func TestDebVersion(t *testing.T) {
	script := filepath.Join(top, "scripts", "version.sh")
	deb := func(v string) string {
		t.Helper()
		out, err := exec.Command(script, "deb", v).Output()
		require.NoError(t, err)
		return strings.TrimSpace(string(out))
	}
	for v, want := range map[string]string{
		"v1.2.0":                      "1.2.0",
		"1.2.0":                       "1.2.0",
		"v1.2.0-dirty":                "1.2.0+dirty",
		"v1.2.0-3-g0123abc":           "1.2.0+3.g0123abc",
		"v1.2.0-3-g0123abc-dirty":     "1.2.0+3.g0123abc.dirty",
		"v1.2.0-rc1":                  "1.2.0~rc1",
		"v1.2.0-rc1-3-gabc1234-dirty": "1.2.0~rc1+3.gabc1234.dirty",
		"dev":                         "0.0.0+dev",
		"not a version":               "0.0.0+dev",
	} {
		assert.Equal(t, want, deb(v), v)
	}
	assert.Regexp(t, regexp.MustCompile(`^0\.0\.0\+git[0-9]+\.g37144da$`), deb("37144da"), "a bare hash sorts by commit count")

	// Each pair sorts as the commits it names do.
	for _, pair := range [][2]string{
		{"v1.2.0-rc1", "v1.2.0"},
		{"v1.2.0", "v1.2.0-3-g0123abc"},
		{"v1.2.0-3-g0123abc", "v1.2.0-12-gfedcba9"},
		{"v1.2.0-12-gfedcba9", "v1.3.0"},
		{"dev", "v0.1.0"},
	} {
		a, b := deb(pair[0]), deb(pair[1])
		assert.NoError(t, exec.Command("dpkg", "--compare-versions", a, "lt", b).Run(), "%s (%s) < %s (%s)", a, pair[0], b, pair[1])
	}
	out, err := exec.Command(script, "version").Output()
	require.NoError(t, err)
	assert.NotEmpty(t, strings.TrimSpace(string(out)))
}
