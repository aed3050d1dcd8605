package daemon_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
)

// TestAdminRoles runs a daemon with a write token, a read token, and this
// process's uid in admin.read_socket_uids only. The read token explains,
// tops, lists and reads the config, and is refused a block (403, nothing
// stored); so is the read uid on the socket. The scheme name is
// case-insensitive; a GET never changes state (405, Allow: POST) and an
// unknown method gets 405 naming GET and POST. Each refusal is logged with
// its op and counted in rld_admin_refused_total by reason.
func TestAdminRoles(t *testing.T) {
	dir := t.TempDir()
	const write, read = "write-token-0123456789", "read-token-0123456789"
	wf, rf := filepath.Join(dir, "write.token"), filepath.Join(dir, "read.token")
	require.NoError(t, os.WriteFile(wf, []byte(write+"\n"), 0o600))
	require.NoError(t, os.WriteFile(rf, []byte(read+"\n"), 0o600))
	uid := os.Getuid()
	l := startLogged(t, dir, fmt.Sprintf("[admin]\ntoken_file = %q\nread_token_file = %q\nsocket_uids = [%d]\nread_socket_uids = [%d]\n",
		wf, rf, uid+1, uid)+changeRules)
	addr := l.d.AdminHTTPAddr()
	require.NotEmpty(t, addr)
	do := func(method, auth, op, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+"/v1/admin/"+op, strings.NewReader(body))
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	refused := func() map[admin.Reason]float64 {
		m := map[admin.Reason]float64{}
		for _, r := range admin.Reasons {
			m[r] = l.metric(t, `rld_admin_refused_total{reason="`+string(r)+`"}`)
			require.GreaterOrEqual(t, m[r], 0.0, "rld_admin_refused_total{reason=%q} is exported", r)
		}
		return m
	}
	blocks := func() int {
		t.Helper()
		var list admin.ListResult
		resp, body := do(http.MethodGet, "Bearer "+read, "list", "")
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.NoError(t, jsonUnmarshal(body, &list))
		return len(list.Blocks)
	}
	before := refused()
	explain := `{"descriptors":[{"name":"api_key","value":"k1"}]}`
	block := `{"match":{"ip":"10.*"},"ttl":"1h","reason":"test"}`

	// The read token, its scheme in any case: the reads, not a block.
	for _, auth := range []string{"Bearer " + read, "bearer " + read, "BEARER  " + read} {
		resp, body := do(http.MethodPost, auth, "explain", explain)
		assert.Equal(t, http.StatusOK, resp.StatusCode, "%q: %s", auth, body)
	}
	for _, op := range []string{"top", "list", "config"} {
		resp, body := do(http.MethodGet, "Bearer "+read, op, "")
		assert.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s", op, body)
	}
	resp, body := do(http.MethodPost, "bearer "+read, "block", block)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, body)
	assert.Contains(t, body, `"code":"forbidden"`)
	assert.Contains(t, body, "the read role may run only explain, top, list and config")
	assert.Zero(t, blocks(), "the read token's block changed nothing")

	// The read uid on the socket: the same.
	var e admin.ExplainResult
	require.Nil(t, changeCall(t, l.d.SocketPath(), "explain", admin.ExplainArgs{Descriptors: []admin.Descriptor{{Name: "api_key", Value: "k1"}}}, &e))
	aerr := changeCall(t, l.d.SocketPath(), "block", admin.BlockArgs{Match: admin.Pairs{"ip": "10.*"}, TTL: "1h"}, nil)
	require.NotNil(t, aerr)
	assert.Equal(t, admin.CodeForbidden, aerr.Code)
	assert.Zero(t, blocks(), "the read uid's block changed nothing")

	// The write token (lower-case scheme) blocks; a GET of unblock is
	// refused 405 and lifts nothing.
	resp, body = do(http.MethodPost, "bearer "+write, "block", block)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var b admin.BlockEntry
	require.NoError(t, jsonUnmarshal(body, &b))
	resp, body = do(http.MethodGet, "Bearer "+write, "unblock?id="+b.ID, "")
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, body)
	assert.Equal(t, "POST", resp.Header.Get("Allow"))
	assert.Contains(t, body, "a GET never does")
	assert.Equal(t, 1, blocks(), "GET unblock lifted nothing")
	resp, body = do(http.MethodPut, "Bearer "+write, "explain", explain)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, body)
	assert.Equal(t, "GET, POST", resp.Header.Get("Allow"))

	// No token, a wrong one, a uid not listed at all.
	resp, _ = do(http.MethodPost, "", "explain", explain)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp, _ = do(http.MethodPost, "Basic "+write, "explain", explain)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "another scheme is no bearer token")
	resp, _ = do(http.MethodPost, "Bearer not-a-token-at-all", "grant", "{}")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	other := startLogged(t, t.TempDir(), uidConfig(changeRules, uid+1))
	aerr = changeCall(t, other.d.SocketPath(), "override-set", admin.OverrideArgs{Rule: "per-key"}, nil)
	require.NotNil(t, aerr)
	assert.Equal(t, admin.CodeForbidden, aerr.Code)

	after := refused()
	want := map[admin.Reason]float64{admin.ReasonRole: 2, admin.ReasonMethod: 2, admin.ReasonNoToken: 2,
		admin.ReasonWrongToken: 1, admin.ReasonUID: 1}
	for _, r := range admin.Reasons {
		assert.Equal(t, want[r], after[r]-before[r], "rld_admin_refused_total{reason=%q}", r)
	}
	logs := l.logs.String() + other.logs.String()
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "admin request refused") {
			assert.NotContains(t, line, `op=""`, "every refusal names its op: %s", line)
		}
	}
	for _, s := range []string{`op=block reason=role`, `op=unblock reason=method`, `op=explain reason=no_token`,
		`op=grant reason=wrong_token`, `op=override-set reason=uid`} {
		assert.Contains(t, logs, s)
	}
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
