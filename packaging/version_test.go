package packaging

import (
	"os"
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
		"v1.2.0":                      "1.2.0-1",
		"1.2.0":                       "1.2.0-1",
		"v1.2.0-dirty":                "1.2.0+dirty-1",
		"v1.2.0-3-g0123abc":           "1.2.0+3.g0123abc-1",
		"1.2.0-3-g0123abc-dirty":      "1.2.0+3.g0123abc.dirty-1",
		"v1.2.0-rc1":                  "1.2.0~rc1-1",
		"1.2.0-rc1-3-gabc1234-dirty":  "1.2.0~rc1+3.gabc1234.dirty-1",
		"v1.2.0-rc1-3-gabc1234-dirty": "1.2.0~rc1+3.gabc1234.dirty-1",
		"dev":                         "0.0.0+dev-1",
		"not a version":               "0.0.0+dev-1",
	} {
		assert.Equal(t, want, deb(v), v)
	}
	assert.Regexp(t, regexp.MustCompile(`^0\.0\.0\+git[0-9]+\.g37144da-1$`), deb("37144da"), "a bare hash sorts by commit count")

	// Each pair sorts as the commits it names do.
	for _, pair := range [][2]string{
		{"v1.2.0-rc1", "v1.2.0"},
		{"v1.2.0", "v1.2.0-3-g0123abc"},
		{"v1.2.0-3-g0123abc", "v1.2.0-12-gfedcba9"},
		{"v1.2.0-12-gfedcba9", "v1.3.0"},
		{"dev", "v0.1.0"},
		{"37144da", "v0.1.0"},
	} {
		a, b := deb(pair[0]), deb(pair[1])
		assert.NoError(t, exec.Command("dpkg", "--compare-versions", a, "lt", b).Run(), "%s (%s) < %s (%s)", a, pair[0], b, pair[1])
	}
	out, err := exec.Command(script, "version").Output()
	require.NoError(t, err)
	assert.NotEmpty(t, strings.TrimSpace(string(out)))
}

// TestRelease: in a clone of this repository tagged v0.3.0, `make
// release` builds bin/rld whose `rld version` is 0.3.0 with the tag's
// commit, the package rld_0.3.0-1_<arch>.deb of that version, and
// SHA256SUMS of both; without the tag, or with uncommitted changes, it
// refuses and builds nothing.
func TestRelease(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds rld and its package in a clone")
	}
	dir := filepath.Join(t.TempDir(), "rld")
	run := func(wd string, name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir = wd
		cmd.Env = append(os.Environ(), "DEB_COMPRESS=gzip", "GIT_CONFIG_GLOBAL=/dev/null",
			"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.org", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.org")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	must := func(wd string, name string, args ...string) string {
		t.Helper()
		out, err := run(wd, name, args...)
		require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
		return out
	}
	must(top, "git", "clone", "-q", "--no-hardlinks", "--depth=1", "file://"+absTop(t), dir)
	// The release's changelog entry, committed before the tag.
	must(dir, "sed", "-i", "s/^## \\[Unreleased\\]/## [0.3.0] - 2026-01-01/", "CHANGELOG.md")

	out, err := run(dir, "make", "-s", "release")
	assert.Error(t, err, "no tag: %s", out)
	assert.Contains(t, out, "HEAD is not a release tag")
	must(dir, "git", "commit", "-qam", "release 0.3.0")
	head := strings.TrimSpace(must(dir, "git", "rev-parse", "HEAD"))
	must(dir, "git", "tag", "v0.3.0")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "README.md"), []byte("changed"), 0o644))
	out, err = run(dir, "make", "-s", "release")
	assert.Error(t, err, "a dirty tree: %s", out)
	assert.Contains(t, out, "uncommitted changes")
	assert.NoFileExists(t, filepath.Join(dir, "bin", "rld"), "nothing built")
	must(dir, "git", "checkout", "-q", "README.md")

	out = must(dir, "make", "-s", "release")
	version := must(dir, filepath.Join(dir, "bin", "rld"), "version")
	assert.True(t, strings.HasPrefix(version, "rld 0.3.0 (commit "+head+", go"), version)
	debs, err := filepath.Glob(filepath.Join(dir, "bin", "rld_0.3.0-1_*.deb"))
	require.NoError(t, err)
	require.Len(t, debs, 1, "make release: %s", out)
	assert.Equal(t, "0.3.0-1", strings.TrimSpace(must(dir, "dpkg-deb", "-f", debs[0], "Version")))
	sums := must(filepath.Join(dir, "bin"), "sha256sum", "-c", "SHA256SUMS")
	assert.Contains(t, sums, "rld: OK")
	assert.Contains(t, sums, filepath.Base(debs[0])+": OK")
	// The package carries the changelog for users.
	files := must(dir, "dpkg-deb", "-c", debs[0])
	assert.Contains(t, files, "./usr/share/doc/rld/changelog.gz")
	assert.Contains(t, files, "./usr/share/doc/rld/changelog.Debian.gz")
}

// absTop returns the repository's top directory as an absolute path.
func absTop(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(top)
	require.NoError(t, err)
	return p
}
