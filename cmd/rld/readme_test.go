package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/daemon/daemontest"
)

// shellBlock returns the lines of the first ```sh block of a document
// that contains the line first, from that line on.
func shellBlock(t *testing.T, doc, first string) []string {
	t.Helper()
	b, err := os.ReadFile(doc)
	require.NoError(t, err)
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		lines := strings.Split(strings.TrimSuffix(block[1], "\n"), "\n")
		for i, l := range lines {
			if l == first {
				return lines[i:]
			}
		}
	}
	t.Fatalf("%s has no ```sh block with the line %q", doc, first)
	return nil
}

// TestReadmeQuickStart runs the quick start of README.md, and the admin
// example of docs/operations.md, on the shipped rld.toml (the daemon
// `make run` starts), and compares what they print with what the
// documents show.
func TestReadmeQuickStart(t *testing.T) {
	cfg, err := os.ReadFile("../../rld.toml")
	require.NoError(t, err)
	// The admin socket is root's by default; let this test's uid in.
	s, err := daemontest.Start(string(cfg) + fmt.Sprintf("\n[admin]\nsocket_uids = [%d]\n", os.Getuid()))
	require.NoError(t, err)
	t.Cleanup(s.Close)
	rld := func(args ...string) (int, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(append(args[:1:1], append([]string{"-socket", s.Socket}, args[1:]...)...), &out, &errOut)
		return code, out.String() + errOut.String()
	}

	const loop = "$ for i in 1 2 3 4 5 6; do bin/rld check endpoint=/v1/login ip=192.0.2.1 | head -n 1; done"
	want := shellBlock(t, "../../README.md", loop)[1:]
	require.Len(t, want, 6)
	for i, w := range want {
		code, out := rld("check", "endpoint=/v1/login", "ip=192.0.2.1")
		assert.Equal(t, w, strings.SplitN(out, "\n", 2)[0], "README quick start, check %d", i+1)
		wantCode := exitAllowed
		if strings.HasPrefix(w, "limited") {
			wantCode = exitDenied
		}
		assert.Equal(t, wantCode, code, "check %d: the exit code README gives", i+1)
	}

	// Acquire and release, acquire and settle, as README shows them.
	block := shellBlock(t, "../../README.md", "lease=$(bin/rld acquire api_key=demo endpoint=/v1/export | sed -n 's/^lease=//p')")
	require.Len(t, block, 4)
	leaseOf := func(out string) string {
		m := regexp.MustCompile(`(?m)^lease=(.+)$`).FindStringSubmatch(out)
		require.NotNil(t, m, "a lease in %q", out)
		return m[1]
	}
	code, out := rld("acquire", "api_key=demo", "endpoint=/v1/export")
	require.Equal(t, exitAllowed, code, out)
	code, out = rld("release", leaseOf(out))
	assert.Equal(t, exitAllowed, code, out)
	assert.Contains(t, block[1], "exit 0 released, 1 unknown lease")
	code, out = rld("acquire", "-cost", "10", "api_key=demo")
	require.Equal(t, exitAllowed, code, out)
	assert.True(t, strings.HasPrefix(out, `allowed rule="per-tier" limit=100 remaining=89 `), out)
	code, out = rld("settle", leaseOf(out), "4")
	assert.Equal(t, exitAllowed, code, out)
	assert.Contains(t, block[3], "refunds the 6 units not used")
	// 100 − 1 (the export's acquire) − 10 + 6 = 95 left; explain says what
	// a check of 1 would leave: 94.
	code, out = rld("admin", "explain", "api_key=demo")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "per-tier: key api_key=demo token_bucket 100/1m cached fail=open remaining=94 ")

	// docs/operations.md's explain example, line for line.
	ex := shellBlock(t, "../../docs/operations.md", "rld admin explain api_key=sk_123 endpoint=/v1/search")
	var wantLines []string
	for _, l := range ex[1:] {
		if !strings.HasPrefix(l, "# ") {
			break
		}
		wantLines = append(wantLines, strings.TrimPrefix(l, "# "))
	}
	code, out = rld("admin", "explain", "api_key=sk_123", "endpoint=/v1/search")
	require.Equal(t, 0, code, out)
	assert.Equal(t, strings.Join(wantLines, "\n")+"\n", out, "docs/operations.md's explain example")
}
