package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/daemon/daemontest"
)

// TestAcquireReleaseCommands: rld acquire prints a lease, rld release
// gives it back, and a second release of it exits 1.
func TestAcquireReleaseCommands(t *testing.T) {
	s, err := daemontest.Start(`
[[rule]]
name = "exports"
by = ["api_key"]
algorithm = "concurrency"
limit = 1
timeout = "1m"
`)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	run1 := func(args ...string) (int, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		return code, out.String() + errOut.String()
	}

	code, out := run1("acquire", "-socket", s.Socket, "-json", "api_key=k")
	require.Equal(t, exitAllowed, code, out)
	var got struct {
		Decision, Rule, Lease string
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, "allowed", got.Decision)
	assert.Equal(t, "exports", got.Rule)
	require.NotEmpty(t, got.Lease)

	code, out = run1("acquire", "-socket", s.Socket, "api_key=k")
	assert.Equal(t, exitDenied, code, out)
	assert.True(t, strings.HasPrefix(out, "limited "), out)
	assert.NotContains(t, out, "lease=")

	code, out = run1("release", "-socket", s.Socket, got.Lease)
	assert.Equal(t, exitAllowed, code, out)
	var stdout, stderr bytes.Buffer
	code = run([]string{"release", "-socket", s.Socket, got.Lease}, &stdout, &stderr)
	assert.Equal(t, exitDenied, code, stdout.String())
	assert.Contains(t, stderr.String(), "rld release: not_found: ", "the answer's error goes to stderr")
	assert.NotContains(t, stdout.String(), "not_found")
	code, out = run1("release", "-socket", s.Socket)
	assert.Equal(t, exitError, code, out)

	code, out = run1("acquire", "-socket", s.Socket, "api_key=k")
	assert.Equal(t, exitAllowed, code, out)
	assert.Contains(t, out, "\nlease=")
	lease := out[strings.Index(out, "\nlease=")+len("\nlease="):]
	lease = lease[:strings.IndexByte(lease, '\n')]

	// rld settle releases too, once.
	code, out = run1("settle", "-socket", s.Socket, lease, "3")
	assert.Equal(t, exitAllowed, code, out)
	code, out = run1("settle", "-socket", s.Socket, lease, "3")
	assert.Equal(t, exitDenied, code, out)
	code, out = run1("settle", "-socket", s.Socket, lease, "-3")
	assert.Equal(t, exitError, code, out)
	code, out = run1("acquire", "-socket", s.Socket, "api_key=k")
	assert.Equal(t, exitAllowed, code, out)
}
