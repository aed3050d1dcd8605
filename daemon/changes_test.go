package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/wire"
)

// changeCall runs op with args on the daemon at socket, as this process's
// uid, and decodes its result into out (when not nil).
func changeCall(t *testing.T, socket, op string, args any, out any) *admin.Error {
	t.Helper()
	var raw json.RawMessage
	if args != nil {
		b, err := json.Marshal(args)
		require.NoError(t, err)
		raw = b
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := admin.CallSocket(ctx, socket, admin.Request{Op: op, Args: raw})
	require.NoError(t, err)
	if res.Err == nil && out != nil {
		require.NoError(t, json.Unmarshal(res.Result, out))
	}
	return res.Err
}

// admits counts how many of n checks carrying kv the daemon at socket
// admits, and returns the last status.
func admits(t *testing.T, socket string, n int, kv ...string) (int, wire.Status) {
	t.Helper()
	c := client.New(socket)
	defer c.Close()
	var descs []client.Descriptor
	for i := 0; i < len(kv); i += 2 {
		descs = append(descs, client.Descriptor{Name: kv[i], Value: kv[i+1]})
	}
	ok, last := 0, wire.Status(0)
	for range n {
		res, err := c.Check(context.Background(), descs, 1)
		require.NoError(t, err)
		last = res.Status
		if res.Status == wire.StatusAllowed {
			ok++
		}
	}
	return ok, last
}

const changeRules = `
[[rule]]
name = "per-key"
by = ["api_key"]
limit = 2
period = "1h"
[[rule]]
name = "per-ip"
by = ["ip"]
limit = 1000
period = "1h"
`

// TestOverridesAndBlocks sets, lists and deletes overrides and blocks over
// the socket: a key override raises the rule's limit, a glob override
// sets another, a multiplier scales it; a block answers blocked until it
// is lifted; bad requests are refused and change nothing; every change is
// logged with its caller; a reload keeps the changes and reports one
// whose rule is gone.
func TestOverridesAndBlocks(t *testing.T) {
	l := startLogged(t, t.TempDir(), uidConfig(changeRules, os.Getuid()))
	sock := l.d.SocketPath()

	var o admin.OverrideEntry
	require.Nil(t, changeCall(t, sock, "override-set", admin.OverrideArgs{Rule: "per-key", Key: map[string]string{"api_key": "vip"},
		Limit: 5, TTL: "1h", Reason: "customer asked"}, &o))
	assert.NotEmpty(t, o.ID)
	assert.Equal(t, fmt.Sprintf("uid=%d", os.Getuid()), o.Author)
	require.Nil(t, changeCall(t, sock, "override-set", admin.OverrideArgs{Rule: "per-key", Match: map[string]string{"api_key": "team-*"},
		Multiplier: 2, TTL: "1h", Author: "ops"}, nil))
	n, _ := admits(t, sock, 10, "api_key", "vip")
	assert.Equal(t, 5, n, "the key override raises the limit of 2 to 5")
	n, _ = admits(t, sock, 10, "api_key", "team-x")
	assert.Equal(t, 4, n, "the glob multiplier doubles it")
	n, _ = admits(t, sock, 10, "api_key", "plain")
	assert.Equal(t, 2, n, "the rule's limit")
	e, aerr := l.explain(t, "api_key", "vip")
	require.Nil(t, aerr)
	assert.Equal(t, int64(5), e.Rules[0].Limit, "explain shows the limit in force")
	assert.True(t, e.Rules[0].Overridden)

	var list admin.ListResult
	require.Nil(t, changeCall(t, sock, "list", nil, &list))
	require.Len(t, list.Overrides, 2)
	assert.Equal(t, "customer asked", list.Overrides[0].Reason)
	assert.Equal(t, "ops", list.Overrides[1].Author)

	// Bad requests: a clear error, nothing changed.
	stateFile := filepath.Join(l.dir, "rld.sock.changes.json")
	before, err := os.ReadFile(stateFile)
	require.NoError(t, err)
	past := time.Now().Add(-time.Minute)
	for name, bad := range map[string]admin.OverrideArgs{
		"unknown rule":   {Rule: "nope", Key: map[string]string{"api_key": "a"}, Limit: 5, TTL: "1h"},
		"bad glob":       {Rule: "per-key", Match: map[string]string{"api_key": ""}, Limit: 5, TTL: "1h"},
		"past expiry":    {Rule: "per-key", Key: map[string]string{"api_key": "a"}, Limit: 5, ExpiresAt: &past},
		"no expiry":      {Rule: "per-key", Key: map[string]string{"api_key": "a"}, Limit: 5},
		"zero limit":     {Rule: "per-key", Key: map[string]string{"api_key": "a"}, TTL: "1h"},
		"bad multiplier": {Rule: "per-key", Key: map[string]string{"api_key": "a"}, Multiplier: -1, TTL: "1h"},
		"wrong key":      {Rule: "per-key", Key: map[string]string{"ip": "a"}, Limit: 5, TTL: "1h"},
	} {
		aerr := changeCall(t, sock, "override-set", bad, nil)
		require.NotNil(t, aerr, name)
		want := admin.CodeBadRequest
		if name == "unknown rule" {
			want = admin.CodeNotFound
		}
		assert.Equal(t, want, aerr.Code, "%s: %s", name, aerr.Message)
	}
	aerr = changeCall(t, sock, "block", admin.BlockArgs{Rule: "nope", Key: map[string]string{"ip": "1"}, TTL: "1h"}, nil)
	require.NotNil(t, aerr)
	assert.Equal(t, admin.CodeNotFound, aerr.Code)
	aerr = changeCall(t, sock, "override-delete", admin.IDArgs{ID: "o-nosuch"}, nil)
	require.NotNil(t, aerr)
	assert.Equal(t, admin.CodeNotFound, aerr.Code)
	after, err := os.ReadFile(stateFile)
	require.NoError(t, err)
	assert.Equal(t, string(before), string(after), "refused requests change nothing")
	require.Nil(t, changeCall(t, sock, "list", nil, &list))
	assert.Len(t, list.Overrides, 2)

	// Blocks.
	var b1, b2 admin.BlockEntry
	require.Nil(t, changeCall(t, sock, "block", admin.BlockArgs{Match: map[string]string{"ip": "203.0.113.*"}, TTL: "1h", Reason: "abuse"}, &b1))
	require.Nil(t, changeCall(t, sock, "block", admin.BlockArgs{Rule: "per-key", Key: map[string]string{"api_key": "stolen"}, TTL: "1h"}, &b2))
	_, st := admits(t, sock, 1, "ip", "203.0.113.9")
	assert.Equal(t, wire.StatusBlocked, st)
	_, st = admits(t, sock, 1, "api_key", "stolen", "ip", "198.51.100.1")
	assert.Equal(t, wire.StatusBlocked, st)
	e, _ = l.explain(t, "api_key", "stolen")
	assert.True(t, e.Rules[0].Blocked, "explain shows the key's block")
	n, _ = admits(t, sock, 1, "ip", "198.51.100.1")
	assert.Equal(t, 1, n, "another ip is not blocked")
	require.Nil(t, changeCall(t, sock, "unblock", admin.IDArgs{ID: b1.ID}, nil))
	_, st = admits(t, sock, 1, "ip", "203.0.113.9")
	assert.Equal(t, wire.StatusAllowed, st, "unblocked")

	// Delete: the rule's limit again (for a fresh key of the glob).
	require.Nil(t, changeCall(t, sock, "override-delete", admin.IDArgs{ID: list.Overrides[1].ID}, nil))
	n, _ = admits(t, sock, 10, "api_key", "team-y")
	assert.Equal(t, 2, n)

	logs := l.logs.String()
	assert.Contains(t, logs, "admin change")
	assert.Contains(t, logs, fmt.Sprintf(`who="uid=%d" op=override-set`, os.Getuid()))

	// A reload without the per-key rule keeps the changes and reports
	// them as orphaned; with the rule back, the override applies again.
	require.NoError(t, os.WriteFile(l.cfg, []byte(uidConfig(changeRules[strings.Index(changeRules, "[[rule]]\nname = \"per-ip\""):], os.Getuid())), 0o644))
	eventually(t, "the override is reported orphaned", func() bool {
		list = admin.ListResult{}
		require.Nil(t, changeCall(t, sock, "list", nil, &list))
		return len(list.Overrides) == 1 && list.Overrides[0].Orphaned
	})
	assert.Equal(t, 2.0, l.metric(t, "rld_changes_orphaned"), "the override and the key block")
	assert.Contains(t, l.logs.String(), "names a rule the configuration does not have")
	require.NoError(t, os.WriteFile(l.cfg, []byte(uidConfig(changeRules, os.Getuid())), 0o644))
	eventually(t, "the rule is back", func() bool {
		list = admin.ListResult{} // decoding into a used value keeps absent fields
		require.Nil(t, changeCall(t, sock, "list", nil, &list))
		return len(list.Overrides) == 1 && !list.Overrides[0].Orphaned
	})
	n, _ = admits(t, sock, 10, "api_key", "vip")
	assert.Equal(t, 0, n, "vip used its 5 before the reloads: the override is in force again")
	e, _ = l.explain(t, "api_key", "vip")
	assert.Equal(t, int64(5), e.Rules[0].Limit)
}

// TestChangeExpiry: an override and a block stop applying at their
// expiry, and list no longer shows them.
func TestChangeExpiry(t *testing.T) {
	l := startLogged(t, t.TempDir(), uidConfig(changeRules, os.Getuid()))
	sock := l.d.SocketPath()
	require.Nil(t, changeCall(t, sock, "override-set", admin.OverrideArgs{Rule: "per-key", Match: map[string]string{"api_key": "k*"},
		Limit: 5, TTL: "300ms"}, nil))
	require.Nil(t, changeCall(t, sock, "block", admin.BlockArgs{Match: map[string]string{"ip": "192.0.2.1"}, TTL: "300ms"}, nil))
	n, _ := admits(t, sock, 10, "api_key", "k1")
	assert.Equal(t, 5, n, "the override's limit of 5")
	_, st := admits(t, sock, 1, "ip", "192.0.2.1")
	assert.Equal(t, wire.StatusBlocked, st)
	eventually(t, "the block expires", func() bool {
		_, st := admits(t, sock, 1, "ip", "192.0.2.1")
		return st == wire.StatusAllowed
	})
	eventually(t, "the override expires", func() bool {
		e, _ := l.explain(t, "api_key", "k2")
		return e.Rules[0].Limit == 2
	})
	n, _ = admits(t, sock, 10, "api_key", "k2")
	assert.Equal(t, 2, n, "the rule's limit of 2 for a fresh key")
	var list admin.ListResult
	require.Nil(t, changeCall(t, sock, "list", nil, &list))
	assert.Empty(t, list.Overrides)
	assert.Empty(t, list.Blocks)
}

// TestChangesOverAdminHTTP sets an override and a block through the admin
// HTTP API with the bearer token.
func TestChangesOverAdminHTTP(t *testing.T) {
	dir := t.TempDir()
	token := "s3cret-token-0123456789"
	tokenFile := filepath.Join(dir, "admin.token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token), 0o600))
	l := startLogged(t, dir, fmt.Sprintf("[admin]\ntoken_file = %q\n", tokenFile)+changeRules)
	post := func(op, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+l.d.AdminHTTPAddr()+"/v1/admin/"+op, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := post("override-set", `{"rule":"per-key","key":{"api_key":"h"},"limit":4,"ttl":"1h","reason":"r"}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"author":"http 127.0.0.1:`)
	code, body = post("block", `{"match":{"ip":"10.*"},"ttl":"1h"}`)
	require.Equal(t, http.StatusOK, code, body)
	code, body = post("override-set", `{"rule":"per-key","key":{"api_key":"h"},"limit":0,"ttl":"1h"}`)
	assert.Equal(t, http.StatusBadRequest, code, body)
	code, body = post("list", "")
	require.Equal(t, http.StatusOK, code, body)
	var list admin.ListResult
	require.NoError(t, json.Unmarshal([]byte(body), &list))
	assert.Len(t, list.Overrides, 1)
	assert.Len(t, list.Blocks, 1)
	n, _ := admits(t, l.d.SocketPath(), 6, "api_key", "h")
	assert.Equal(t, 4, n)
	_, st := admits(t, l.d.SocketPath(), 1, "ip", "10.1.2.3")
	assert.Equal(t, wire.StatusBlocked, st)
}

// TestChangesSurviveRestart: on the embedded store, overrides and blocks
// are kept in the state file and in force again after the daemon process
// is killed and restarted.
func TestChangesSurviveRestart(t *testing.T) {
	p, err := daemontest.StartProcess(uidConfig(changeRules, os.Getuid()))
	require.NoError(t, err)
	defer p.Close()
	require.Nil(t, changeCall(t, p.Socket, "override-set", admin.OverrideArgs{Rule: "per-key", Key: map[string]string{"api_key": "vip"},
		Limit: 6, TTL: "1h", Reason: "kept"}, nil))
	require.Nil(t, changeCall(t, p.Socket, "block", admin.BlockArgs{Rule: "per-ip", Key: map[string]string{"ip": "192.0.2.7"}, TTL: "1h"}, nil))
	p.Kill()
	require.NoError(t, p.Restart())
	assert.Contains(t, p.Logs(), "overrides and blocks loaded")
	var list admin.ListResult
	require.Nil(t, changeCall(t, p.Socket, "list", nil, &list))
	require.Len(t, list.Overrides, 1)
	assert.Equal(t, "kept", list.Overrides[0].Reason)
	require.Len(t, list.Blocks, 1)
	n, _ := admits(t, p.Socket, 10, "api_key", "vip")
	assert.Equal(t, 6, n, "the override is in force after the restart")
	_, st := admits(t, p.Socket, 1, "ip", "192.0.2.7")
	assert.Equal(t, wire.StatusBlocked, st)
}
