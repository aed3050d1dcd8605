package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
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
	assert.Contains(t, out, "override "+id+" rule per-key key api_key=vip limit 3 until ")
	assert.Contains(t, out, ": trial\n")
	assert.Contains(t, out, "block "+bid+" match api_key=evil* until ")

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

// TestAdminFlagsOneForm: -rule, -key and -match mean the same in every
// command that has them and give the same JSON (the object form);
// -key repeats or joins its pairs with ",".
func TestAdminFlagsOneForm(t *testing.T) {
	keyOf := func(args ...string) string {
		t.Helper()
		req, err := adminRequest(args[0], args[1:])
		require.NoError(t, err, args)
		var a struct {
			Rule  string          `json:"rule"`
			Key   json.RawMessage `json:"key"`
			Match json.RawMessage `json:"match"`
		}
		require.NoError(t, json.Unmarshal(req.Args, &a), string(req.Args))
		return a.Rule + " " + string(a.Key) + " " + string(a.Match)
	}
	const want = `r {"api_key":"k","tenant":"t"} `
	for _, cmd := range [][]string{{"reset"}, {"grant", "-n", "1"}, {"override", "set", "-limit", "2", "-ttl", "1h"}, {"block", "-ttl", "1h"}} {
		for _, key := range [][]string{{"-key", "api_key=k", "-key", "tenant=t"}, {"-key", "api_key=k,tenant=t"}, {"-key", "tenant=t,api_key=k"}} {
			args := append(append(append([]string(nil), cmd...), "-rule", "r"), key...)
			assert.Equal(t, want, keyOf(args...), args)
		}
	}
	assert.Equal(t, `  {"ip":"203.0.113.*"}`, keyOf("block", "-match", "ip=203.0.113.*", "-ttl", "1h"))
	assert.Equal(t, `r  {"api_key":"team-*"}`, keyOf("override", "set", "-rule", "r", "-match", "api_key=team-*", "-limit", "2", "-ttl", "1h"))
	for _, bad := range [][]string{
		{"reset", "-rule", "r", "-key", "api_key"},
		{"reset", "-rule", "r", "-key", "a=1", "-key", "a=2"},
		{"block", "-rule", "r", "-key", "=k", "-ttl", "1h"},
		{"block", "api_key=k", "-ttl", "1h"},
		{"list", "extra"},
	} {
		_, err := adminRequest(bad[0], bad[1:])
		assert.Error(t, err, bad)
	}
}

// TestAdminListFollowsPages: `rld admin list` asks for every page of a
// list longer than one ADMIN answer and prints every entry once.
func TestAdminListFollowsPages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	p, err := daemontest.StartProcess(fmt.Sprintf(`
[admin]
socket_uids = [%d]
[[rule]]
name = "per-ip"
by = ["ip"]
limit = 10
period = "1h"
`, os.Getuid()))
	require.NoError(t, err)
	defer p.Close()
	bin, err := daemontest.Binary()
	require.NoError(t, err)
	const n = 300 // six pages and more
	ids := map[string]bool{}
	for i := range n {
		args, _ := json.Marshal(admin.BlockArgs{Rule: "per-ip", Key: admin.Pairs{"ip": fmt.Sprintf("10.0.%d.%d", i/256, i%256)},
			TTL: "1h", Reason: strings.Repeat("scraping ", 10)})
		res, err := admin.CallSocket(context.Background(), p.Socket, admin.Request{Op: "block", Args: args})
		require.NoError(t, err)
		require.Nil(t, res.Err)
		var e admin.BlockEntry
		require.NoError(t, json.Unmarshal(res.Result, &e))
		ids[e.ID] = true
	}
	res, err := admin.CallSocket(context.Background(), p.Socket, admin.Request{Op: "list"})
	require.NoError(t, err)
	var first admin.ListResult
	require.NoError(t, json.Unmarshal(res.Result, &first))
	require.NotEmpty(t, first.Next, "more than one page")

	for _, args := range [][]string{{"list"}, {"override", "list"}, {"list", "-limit", "1000"}} {
		out, err := exec.Command(bin, append([]string{"admin", "-socket", p.Socket}, args...)...).Output()
		require.NoError(t, err, args)
		seen := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			require.GreaterOrEqual(t, len(f), 2, line)
			require.Equal(t, "block", f[0], line)
			require.False(t, seen[f[1]], "%s listed twice", f[1])
			seen[f[1]] = true
		}
		assert.Equal(t, ids, seen, "%v: every block once", args)
	}
	out, err := exec.Command(bin, "admin", "-socket", p.Socket, "-json", "list").Output()
	require.NoError(t, err)
	var all admin.ListResult
	require.NoError(t, json.Unmarshal(out, &all))
	assert.Len(t, all.Blocks, n)
	assert.Empty(t, all.Next)
}
