package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/wire"
)

// TestListPagesThousands: with 4000 overrides and blocks in force (more
// than one ADMIN answer holds), list answers in pages on the socket and
// on the admin HTTP API (POST with a JSON body, GET with a query);
// following the cursors lists every entry once on every face; each socket answer fits in a frame; a bad cursor or limit
// is refused.
func TestListPagesThousands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	token := "s3cret-token-0123456789"
	tokenFile := filepath.Join(dir, "admin.token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token), 0o600))

	// The state file a daemon left: it loads them at start.
	const n = 4000
	now := time.Now()
	var ch policy.Changes
	want := map[string]bool{}
	for i := range n {
		id := fmt.Sprintf("%016x%04x", now.UnixNano()+int64(i), i)
		if i%4 == 0 {
			ch.Blocks = append(ch.Blocks, policy.Block{ID: "b-" + id, Rule: "per-ip", Key: map[string]string{"ip": fmt.Sprintf("192.0.2.%d", i)},
				Expires: now.Add(time.Hour), Reason: strings.Repeat("abuse ", i%40), Author: "uid=0", Created: now})
			want["b-"+id] = true
			continue
		}
		ch.Overrides = append(ch.Overrides, policy.Override{ID: "o-" + id, Rule: "per-key", Key: map[string]string{"api_key": fmt.Sprintf("customer-%d", i)},
			Limit: int64(10 + i), Expires: now.Add(time.Hour), Reason: "trial", Author: "uid=0", Created: now})
		want["o-"+id] = true
	}
	b, err := json.Marshal(struct {
		Version int `json:"version"`
		policy.Changes
	}{1, ch})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rld.sock.changes.json"), b, 0o600))
	l := startLogged(t, dir, fmt.Sprintf("[admin]\nsocket_uids = [%d]\ntoken_file = %q\n", os.Getuid(), tokenFile)+changeRules)
	sock := l.d.SocketPath()
	n0, _ := admits(t, sock, 20, "api_key", "customer-1")
	assert.Equal(t, 11, n0, "an override loaded from the state file is in force")

	pages := func(face string, call func(a admin.ListArgs) admin.ListResult, limit int) {
		t.Helper()
		seen := map[string]bool{}
		a := admin.ListArgs{Limit: limit}
		np := 0
		for {
			p := call(a)
			np++
			for _, o := range p.Overrides {
				require.False(t, seen[o.ID], "%s: %s listed twice", face, o.ID)
				seen[o.ID] = true
			}
			for _, b := range p.Blocks {
				require.False(t, seen[b.ID], "%s: %s listed twice", face, b.ID)
				seen[b.ID] = true
			}
			if p.Next == "" {
				break
			}
			require.Greater(t, p.Next, a.Cursor, "%s: the cursor moves on", face)
			a.Cursor = p.Next
		}
		assert.Equal(t, want, seen, "%s: every entry, once", face)
		assert.Greater(t, np, 1, "%s: more than one page", face)
		t.Logf("%s, limit %d: %d entries in %d pages", face, limit, len(seen), np)
	}
	socketList := func(a admin.ListArgs) admin.ListResult {
		t.Helper()
		body, err := json.Marshal(a)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		res, err := admin.CallSocket(ctx, sock, admin.Request{Op: "list", Args: body})
		require.NoError(t, err)
		require.Nil(t, res.Err)
		require.LessOrEqual(t, len(res.Result), wire.MaxAdminBody)
		var p admin.ListResult
		require.NoError(t, json.Unmarshal(res.Result, &p))
		return p
	}
	httpList := func(a admin.ListArgs) admin.ListResult {
		t.Helper()
		body, err := json.Marshal(a)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		res, err := admin.CallHTTP(ctx, "http://"+l.d.AdminHTTPAddr(), token, admin.Request{Op: "list", Args: body})
		require.NoError(t, err)
		require.Nil(t, res.Err)
		var p admin.ListResult
		require.NoError(t, json.Unmarshal(res.Result, &p))
		return p
	}
	httpGet := func(query string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+l.d.AdminHTTPAddr()+"/v1/admin/list"+query, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, b
	}
	httpGetList := func(a admin.ListArgs) admin.ListResult {
		t.Helper()
		q := url.Values{}
		if a.Cursor != "" {
			q.Set("cursor", a.Cursor)
		}
		if a.Limit != 0 {
			q.Set("limit", strconv.Itoa(a.Limit))
		}
		query := ""
		if len(q) > 0 {
			query = "?" + q.Encode()
		}
		code, b := httpGet(query)
		require.Equal(t, http.StatusOK, code, "%s", b)
		var p admin.ListResult
		require.NoError(t, json.Unmarshal(b, &p))
		return p
	}
	pages("http GET", httpGetList, 250)
	for _, q := range []string{"?cursor=nope", "?limit=-1", "?limit=5&limit=6", "?bogus=1"} {
		code, b := httpGet(q)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", q, b)
		if q == "?limit=5&limit=6" {
			assert.Contains(t, string(b), `repeated query parameter \"limit\": give each parameter once`)
		}
	}
	pages("socket", socketList, 0)
	pages("http", httpList, 60)

	// Bad cursors and limits: bad_request on both faces, nothing listed.
	for _, args := range []string{`{"cursor":"nope"}`, `{"cursor":"o-"}`, `{"limit":-1}`, `{"limit":100000}`, `{"cursor":1}`} {
		res, err := admin.CallSocket(context.Background(), sock, admin.Request{Op: "list", Args: json.RawMessage(args)})
		require.NoError(t, err)
		require.NotNil(t, res.Err, args)
		assert.Equal(t, admin.CodeBadRequest, res.Err.Code, args)
		res, err = admin.CallHTTP(context.Background(), "http://"+l.d.AdminHTTPAddr(), token, admin.Request{Op: "list", Args: json.RawMessage(args)})
		require.NoError(t, err)
		require.NotNil(t, res.Err, args)
		assert.Equal(t, admin.CodeBadRequest, res.Err.Code, args)
	}

	// The key's text form, as explain prints it, names the same counter
	// as the object form, on HTTP as on the socket.
	req, err := http.NewRequest(http.MethodPost, "http://"+l.d.AdminHTTPAddr()+"/v1/admin/reset", strings.NewReader(`{"rule":"per-key","key":"api_key=customer-1"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	n0, _ = admits(t, sock, 20, "api_key", "customer-1")
	assert.Equal(t, 11, n0, "reset by the key's text: a fresh key, under its override")
	var st admin.StateResult
	require.Nil(t, changeCall(t, sock, "reset", admin.ResetArgs{Target: admin.Target{Rule: "per-key", Key: admin.Pairs{"api_key": "customer-1"}}}, &st))
	require.Len(t, st.Counters, 1)
	assert.Equal(t, "api_key=customer-1", st.Counters[0].Key)
}
