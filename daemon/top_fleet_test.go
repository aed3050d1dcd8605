package daemon_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// topFleetConfig is rld.toml of a daemon of the fleet top test: a rule
// of 2 per hour, strict so that the fleet's count decides at once.
func topFleetConfig(redisAddr, tokenFile string) string {
	return fmt.Sprintf(`
[admin]
socket_uids = [%d]
token_file = %q
[store]
redis = [%q]
timeout = %q
[[rule]]
name = "per-key"
by = ["api_key"]
limit = 2
period = "1h"
mode = "strict"
`, os.Getuid(), tokenFile, redisAddr, fleetTimeout)
}

// topCall runs top with args on the daemon at socket.
func topCall(t *testing.T, socket string, args admin.TopArgs) admin.TopResult {
	t.Helper()
	var r admin.TopResult
	require.Nil(t, changeCall(t, socket, "top", args, &r))
	return r
}

// TestTopFleet: three daemon processes on one Redis; keys are denied on
// daemons 1 and 2 only (one key on both). top through daemon 0 lists
// them, each with the daemons that denied it, and names the three
// daemons heard from with the age of their reports; -local (and the
// HTTP form's ?local=true) gives daemon 0's own view: no denials.
func TestTopFleet(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("fleet-top-token-0123456789abcdef\n"), 0o600))
	var ps []*daemontest.Process
	adminHTTP := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, 0))
	for i := range 3 {
		var flags []string
		if i == 0 {
			flags = []string{"-admin-http", adminHTTP}
		}
		p, err := daemontest.StartProcess(topFleetConfig(srv.Addr, tokenFile), flags...)
		require.NoError(t, err)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("daemon %d log:\n%s", i, p.Logs())
			}
			p.Close()
		})
		ps = append(ps, p)
	}
	ids := make([]string, 3)
	for i, p := range ps {
		r := topCall(t, p.Socket, admin.TopArgs{Local: true})
		require.Len(t, r.Daemons, 1)
		assert.False(t, r.Fleet)
		ids[i] = r.Daemons[0].Daemon
	}

	denied := func(d int, key string, n int) {
		t.Helper()
		cs := clients(t, ps[d:d+1])
		got := 0
		for range n {
			if checkStatus(t, cs[0], key) == wire.StatusLimited {
				got++
			}
		}
		require.Equal(t, n-2, got, "daemon %d, key %s: the limit is 2", d, key)
	}
	denied(1, "only-1", 8)      // 6 denials on daemon 1
	denied(2, "only-2", 5)      // 3 on daemon 2
	denied(1, "both", 4)        // 2 on daemon 1…
	checkN(t, ps[2], "both", 3) // …and 3 on daemon 2

	var r admin.TopResult
	redistest.WaitFor(t, "daemons 1 and 2 to publish their denials", func() bool {
		r = topCall(t, ps[0].Socket, admin.TopArgs{Rule: "per-key", N: 10})
		return len(r.Rules) == 1 && r.Rules[0].Denied == 6+3+2+3
	})
	assert.True(t, r.Fleet)
	var heard []string
	for _, d := range r.Daemons {
		heard = append(heard, d.Daemon)
		assert.Less(t, d.AgeMs, int64(10_000), "%s: a report within its ttl", d.Daemon)
		assert.Equal(t, d.Daemon == ids[0], d.Self)
	}
	assert.ElementsMatch(t, ids, heard, "the three daemons heard from")
	keys := map[string]admin.KeyCount{}
	for _, k := range r.Rules[0].Keys {
		keys[k.Key] = k
	}
	assert.Equal(t, []admin.DaemonCount{{Daemon: ids[1], Count: 6}}, keys["api_key=only-1"].By)
	assert.Equal(t, []admin.DaemonCount{{Daemon: ids[2], Count: 3}}, keys["api_key=only-2"].By)
	assert.Equal(t, uint64(5), keys["api_key=both"].Count)
	assert.ElementsMatch(t, []admin.DaemonCount{{Daemon: ids[1], Count: 2}, {Daemon: ids[2], Count: 3}}, keys["api_key=both"].By,
		"the key denied on two daemons names both")
	assert.Equal(t, "api_key=only-1", r.Rules[0].Keys[0].Key, "the most denied first")

	local := topCall(t, ps[0].Socket, admin.TopArgs{Local: true})
	assert.Empty(t, local.Rules, "daemon 0 denied nothing itself")

	// The HTTP form: GET /v1/admin/top, the fleet's; ?local=true, daemon 0's.
	get := func(query string) admin.TopResult {
		req, err := http.NewRequest(http.MethodGet, "http://"+adminHTTP+"/v1/admin/top"+query, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer fleet-top-token-0123456789abcdef")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		var r admin.TopResult
		require.NoError(t, json.Unmarshal(b, &r))
		return r
	}
	fleet := get("")
	assert.True(t, fleet.Fleet)
	require.Len(t, fleet.Rules, 1)
	assert.Equal(t, uint64(14), fleet.Rules[0].Denied)
	assert.Len(t, fleet.Daemons, 3)
	local = get("?local=true")
	assert.False(t, local.Fleet)
	assert.Empty(t, local.Rules)
	assert.True(t, slices.ContainsFunc(local.Daemons, func(d admin.DaemonSeen) bool { return d.Self && d.Daemon == ids[0] }))
}

// checkN checks key n times on p and requires every check denied.
func checkN(t *testing.T, p *daemontest.Process, key string, n int) {
	t.Helper()
	cs := clients(t, []*daemontest.Process{p})
	for range n {
		require.Equal(t, wire.StatusLimited, checkStatus(t, cs[0], key))
	}
}
