package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/daemon/daemontest"
)

// TestAdminChangesThroughBinary runs `rld admin override|block|unblock|
// list` of the built binary against a daemon of the same binary over the
// socket: a change is in force at once, list shows it, a bad one exits 2
// (1 for an unknown rule) and changes nothing.
func TestAdminChangesThroughBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	p, err := daemontest.StartProcess(fmt.Sprintf(`
[admin]
socket_uids = [%d]
[[rule]]
name = "per-key"
by = ["api_key"]
limit = 1
period = "1h"
`, os.Getuid()))
	require.NoError(t, err)
	defer p.Close()
	bin, err := daemontest.Binary()
	require.NoError(t, err)
	rld := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"admin", "-socket", p.Socket}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), stderr.String(), ee.ExitCode()
		}
		require.NoError(t, err)
		return string(out), stderr.String(), 0
	}
	out, errOut, code := rld("override", "set", "-rule", "per-key", "-key", "api_key=vip", "-limit", "3", "-ttl", "1h", "-reason", "trial")
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `^o-[0-9a-f]+ until `, out)
	id := strings.Fields(out)[0]
	out, errOut, code = rld("explain", "api_key=vip")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "3/1h")
	assert.Contains(t, out, " overridden ")
	out, _, code = rld("block", "-match", "api_key=evil*", "-ttl", "10m", "-reason", "abuse")
	require.Equal(t, 0, code)
	bid := strings.Fields(out)[0]
	out, _, code = rld("list")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "override "+id+` rule per-key key {"api_key":"vip"} limit 3 until `)
	assert.Contains(t, out, ": trial\n")
	assert.Contains(t, out, "block "+bid+` match {"api_key":"evil*"} until `)

	_, errOut, code = rld("override", "set", "-rule", "nope", "-key", "api_key=a", "-limit", "3", "-ttl", "1h")
	assert.Equal(t, 1, code, "unknown rule: not found")
	assert.Contains(t, errOut, `rule "nope": no such rule`)
	_, errOut, code = rld("override", "set", "-rule", "per-key", "-key", "api_key=a", "-multiplier", "-1", "-ttl", "1h")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "multiplier = -1: must be positive")

	_, _, code = rld("unblock", bid)
	require.Equal(t, 0, code)
	out, _, code = rld("override", "delete", id)
	require.Equal(t, 0, code)
	assert.Equal(t, "deleted "+id+"\n", out)
	out, _, code = rld("override", "list")
	require.Equal(t, 0, code)
	assert.Equal(t, "no overrides or blocks\n", out)
}
