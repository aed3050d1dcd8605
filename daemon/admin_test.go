package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon"
	"github.com/rld/rld/wire"
)

// logged is a daemon run with its log kept, for the tests that assert
// what it says.
type logged struct {
	d    *daemon.Daemon
	dir  string
	cfg  string
	logs *syncBuffer
}

// startLogged runs a daemon on config (HTTP and admin HTTP on free
// loopback ports) and keeps its log.
func startLogged(t *testing.T, dir, config string) *logged {
	t.Helper()
	l := &logged{dir: dir, cfg: filepath.Join(dir, "rld.toml"), logs: new(syncBuffer)}
	require.NoError(t, os.WriteFile(l.cfg, []byte(config), 0o644))
	httpAddr, adminAddr := "127.0.0.1:0", "127.0.0.1:0"
	d, err := daemon.New(daemon.Options{ConfigPath: l.cfg, Socket: filepath.Join(dir, "rld.sock"),
		HTTP: &httpAddr, AdminHTTP: &adminAddr,
		Logger: slog.New(slog.NewTextHandler(l.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-d.Ready()
	l.d = d
	return l
}

// get returns the body of GET path on the daemon's HTTP listener.
func (l *logged) get(t *testing.T, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + l.d.HTTPAddr() + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// metric returns the value of the series named exactly series in
// /metrics, or -1 when it is absent.
func (l *logged) metric(t *testing.T, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(l.get(t, "/metrics"), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	return -1
}

func (l *logged) healthHash(t *testing.T) string {
	t.Helper()
	var h daemon.Health
	require.NoError(t, json.Unmarshal([]byte(l.get(t, "/healthz")), &h))
	require.NotNil(t, h.Config, "healthz carries the config")
	return h.Config.Hash
}

// explain asks the daemon over its socket, as uid of this process.
func (l *logged) explain(t *testing.T, kv ...string) (admin.ExplainResult, *admin.Error) {
	t.Helper()
	var a admin.ExplainArgs
	for i := 0; i < len(kv); i += 2 {
		a.Descriptors = append(a.Descriptors, admin.Descriptor{Name: kv[i], Value: kv[i+1]})
	}
	args, _ := json.Marshal(a)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := admin.CallSocket(ctx, l.d.SocketPath(), admin.Request{Op: "explain", Args: args})
	require.NoError(t, err)
	var out admin.ExplainResult
	if res.Err == nil {
		require.NoError(t, json.Unmarshal(res.Result, &out))
	}
	return out, res.Err
}

// eventually polls cond every 10 ms for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition
	}
}

func uidConfig(rules string, uids ...int) string {
	list := make([]string, len(uids))
	for i, u := range uids {
		list[i] = strconv.Itoa(u)
	}
	return "[server]\nconfig_poll = \"20ms\"\n[admin]\nsocket_uids = [" + strings.Join(list, ",") + "]\n" + rules
}

const oneRule = `
[[rule]]
name = "per-key"
by = ["api_key"]
limit = %d
period = "1h"
`

// TestConfigFollowsItsFile edits rld.toml under a running daemon: the new
// rules are in force without a signal, /healthz and rld_config_info show
// the new hash; an invalid edit is refused with a log line, counted, and
// the rules and hash in force stay.
func TestConfigFollowsItsFile(t *testing.T) {
	first := uidConfig(fmt.Sprintf(oneRule, 2), os.Getuid())
	l := startLogged(t, t.TempDir(), first)
	require.Equal(t, daemon.ConfigHash([]byte(first)), l.healthHash(t))
	assert.Equal(t, 1.0, l.metric(t, `rld_config_info{hash="`+daemon.ConfigHash([]byte(first))+`"}`))
	e, aerr := l.explain(t, "api_key", "k")
	require.Nil(t, aerr)
	require.Len(t, e.Rules, 1)
	assert.Equal(t, int64(2), e.Rules[0].Limit)

	second := uidConfig(fmt.Sprintf(oneRule, 7), os.Getuid())
	require.NoError(t, os.WriteFile(l.cfg, []byte(second), 0o644))
	eventually(t, "the edited limit is in force", func() bool {
		e, _ := l.explain(t, "api_key", "k")
		return len(e.Rules) == 1 && e.Rules[0].Limit == 7
	})
	c := client.New(l.d.SocketPath())
	defer c.Close()
	for i := range 7 {
		res, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "fresh"}}, 1)
		require.NoError(t, err)
		require.Equal(t, wire.StatusAllowed, res.Status, "check %d under the new limit of 7", i)
	}
	newHash := daemon.ConfigHash([]byte(second))
	assert.Equal(t, newHash, l.healthHash(t))
	assert.Equal(t, 1.0, l.metric(t, `rld_config_info{hash="`+newHash+`"}`))
	assert.Equal(t, -1.0, l.metric(t, `rld_config_info{hash="`+daemon.ConfigHash([]byte(first))+`"}`), "the old hash's series is gone")

	failures := l.metric(t, `rld_config_reloads_total{result="failure"}`)
	require.NoError(t, os.WriteFile(l.cfg, []byte(second+"\n[[rule]]\nname = \"broken\"\nby = [\"ip\"]\nlimit = 1\nperiod = \"1m\"\nalgorithm = \"leaky\"\n"), 0o644))
	eventually(t, "the failed reload is counted", func() bool {
		return l.metric(t, `rld_config_reloads_total{result="failure"}`) == failures+1
	})
	assert.Contains(t, l.logs.String(), "config reload failed; keeping the rules in force")
	assert.Contains(t, l.logs.String(), "leaky")
	e, _ = l.explain(t, "api_key", "k")
	require.Len(t, e.Rules, 1)
	assert.Equal(t, int64(7), e.Rules[0].Limit, "the last good rules stay")
	assert.Equal(t, newHash, l.healthHash(t), "the hash in force stays")
	// The same bad content is not tried again at every poll.
	waitPolls(t, l.d, 5)
	assert.Equal(t, failures+1, l.metric(t, `rld_config_reloads_total{result="failure"}`))
	assert.Equal(t, 0.0, l.metric(t, `rld_config_last_reload_successful`))

	// Put back, the file holds the rules in force: the failure no
	// longer stands, and nothing is reloaded or counted.
	require.NoError(t, os.WriteFile(l.cfg, []byte(second), 0o644))
	eventually(t, "the failure is cleared", func() bool {
		return l.metric(t, `rld_config_last_reload_successful`) == 1
	})
	assert.Contains(t, l.logs.String(), "config file is back to the configuration in force")

	// A bad edit that SIGHUP (Reload) finds first is not tried again by
	// the poll: one failure for one edit. A second SIGHUP tries it again
	// (a file it names may have been fixed meanwhile).
	require.NoError(t, os.WriteFile(l.cfg, []byte(second+"\n[server2]\n"), 0o644))
	err := l.d.Reload()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "server2")
	waitPolls(t, l.d, 5)
	assert.Equal(t, failures+2, l.metric(t, `rld_config_reloads_total{result="failure"}`))
	require.Error(t, l.d.Reload())
	assert.Equal(t, failures+3, l.metric(t, `rld_config_reloads_total{result="failure"}`))
	assert.Equal(t, 0.0, l.metric(t, `rld_config_last_reload_successful`))
	// Put back and reloaded by hand: unchanged, and the failure cleared.
	require.NoError(t, os.WriteFile(l.cfg, []byte(second), 0o644))
	require.NoError(t, l.d.Reload())
	assert.Equal(t, 1.0, l.metric(t, `rld_config_last_reload_successful`))
	assert.Equal(t, failures+3, l.metric(t, `rld_config_reloads_total{result="failure"}`))
	assert.Equal(t, newHash, l.healthHash(t))
}

// waitPolls waits until d has polled its config file n more times.
func waitPolls(t *testing.T, d *daemon.Daemon, n int64) {
	t.Helper()
	target := d.ConfigPolls() + n
	eventually(t, fmt.Sprintf("%d polls of the config file", n), func() bool { return d.ConfigPolls() >= target })
}

// TestAdminHTTPToken sends real HTTP requests to the admin API without a
// token, with a wrong one and with the right one: only the last is
// served, and each refusal is logged with the peer's address.
func TestAdminHTTPToken(t *testing.T) {
	dir := t.TempDir()
	token := "s3cret-token-0123456789"
	tokenFile := filepath.Join(dir, "admin.token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))
	l := startLogged(t, dir, fmt.Sprintf("[admin]\ntoken_file = %q\n", tokenFile)+fmt.Sprintf(oneRule, 3))
	addr := l.d.AdminHTTPAddr()
	require.NotEmpty(t, addr, "the admin API listens when a token file is set")
	post := func(tok, op, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/admin/"+op, strings.NewReader(body))
		require.NoError(t, err)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	explain := `{"descriptors":[{"name":"api_key","value":"k1"}]}`

	code, body := post("", "explain", explain)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	assert.Contains(t, body, `"code":"unauthorized"`)
	code, body = post("not-the-token-at-all", "explain", explain)
	assert.Equal(t, http.StatusForbidden, code, body)
	assert.Contains(t, body, `"code":"forbidden"`)
	logs := l.logs.String()
	assert.Equal(t, 2, strings.Count(logs, "admin request refused"), logs)
	assert.Contains(t, logs, "who=\"http 127.0.0.1:")

	code, body = post(token, "explain", explain)
	require.Equal(t, http.StatusOK, code, body)
	var e admin.ExplainResult
	require.NoError(t, json.Unmarshal([]byte(body), &e))
	require.Len(t, e.Rules, 1)
	allowed, remaining := true, int64(2)
	assert.Equal(t, admin.RuleMatch{Rule: "per-key", Key: "api_key=k1", Algorithm: "token_bucket", Limit: 3, Period: "1h",
		Mode: "cached", Fail: "open", Enforce: "100%", Enforced: true, Status: "allowed",
		Allowed: &allowed, Remaining: &remaining, ResetMs: e.Rules[0].ResetMs}, e.Rules[0])
	assert.Equal(t, admin.ExplainDecision{Status: "allowed", Rule: "per-key", Allowed: true, Limit: 3, Remaining: 2,
		ResetMs: e.Decision.ResetMs}, e.Decision)

	// Bad requests get a clear error and change nothing.
	code, body = post(token, "explain", `{"descriptors":[],"extra":1}`)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "unknown field")
	code, body = post(token, "frobnicate", `{}`)
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, `no admin op \"frobnicate\"`)
	code, body = post(token, "reset", `{}`)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "give descriptors")
	code, body = post(token, "grant", `{"rule":"per-key","key":"api_key=k1","n":0}`)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "n = 0")
	code, body = post(token, "reset", `{"rule":"nope","key":"api_key=k1"}`)
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, `unknown rule \"nope\"`)
	code, body = post(token, "top", `{"rule":"nope"}`)
	assert.Equal(t, http.StatusNotFound, code, body)
	code, body = post(token, "config", "")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, daemon.ConfigHash([]byte(fmt.Sprintf("[admin]\ntoken_file = %q\n", tokenFile)+fmt.Sprintf(oneRule, 3))))
	e2, _ := l.explain(t, "api_key", "k1")
	_ = e2 // the socket needs a listed uid; the HTTP explain above consumed nothing:
	c := client.New(l.d.SocketPath())
	defer c.Close()
	res, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "k1"}}, 1)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), res.Remaining, "explains consumed nothing")
}

// TestAdminHTTPNeedsTokenFile: without admin.token_file the admin API
// does not listen, and the log says why.
func TestAdminHTTPNeedsTokenFile(t *testing.T) {
	l := startLogged(t, t.TempDir(), fmt.Sprintf(oneRule, 3))
	assert.Empty(t, l.d.AdminHTTPAddr())
	assert.Contains(t, l.logs.String(), "admin HTTP API off: no admin.token_file")
}

// TestAdminSocketUIDs sends admin frames from this process's uid to a
// daemon that lists it, and to one that does not: the second refuses,
// logs the uid, and keeps serving checks on the same connection.
func TestAdminSocketUIDs(t *testing.T) {
	uid := os.Getuid()
	allowed := startLogged(t, t.TempDir(), uidConfig(fmt.Sprintf(oneRule, 3), uid))
	e, aerr := allowed.explain(t, "api_key", "k1", "endpoint", "/x")
	require.Nil(t, aerr)
	require.Len(t, e.Rules, 1)
	assert.Equal(t, "api_key=k1", e.Rules[0].Key)
	require.NotNil(t, e.Rules[0].Remaining)
	assert.Equal(t, int64(2), *e.Rules[0].Remaining, "what a check of cost 1 would leave")

	refusing := startLogged(t, t.TempDir(), uidConfig(fmt.Sprintf(oneRule, 3), uid+1))
	_, aerr = refusing.explain(t, "api_key", "k1")
	require.NotNil(t, aerr)
	assert.Equal(t, admin.CodeForbidden, aerr.Code)
	assert.Contains(t, aerr.Message, fmt.Sprintf("uid %d may not", uid))
	assert.Contains(t, refusing.logs.String(), fmt.Sprintf(`who="uid=%d"`, uid))

	// On one connection: a refused admin frame, then a check, in order.
	raw := dialRaw(t, refusing.d.SocketPath())
	raw.write(append(wire.AppendRequest(nil, &wire.Request{Op: wire.OpAdmin, ID: 5, Body: []byte(`{"op":"config"}`)}),
		checkFrame(6, "api_key", "k1")...))
	f := readFrame(t, raw)
	var ar wire.AdminResponse
	require.NoError(t, wire.DecodeAdminResponse(f, &ar))
	assert.Equal(t, uint32(5), ar.ID)
	assert.Equal(t, wire.CodeForbidden, ar.Code)
	res := raw.mustRead()
	assert.Equal(t, uint32(6), res.ID)
	assert.Equal(t, wire.StatusAllowed, res.Status, "check ops stay open to everyone")

	// A malformed admin request changes nothing and says why.
	raw2 := dialRaw(t, allowed.d.SocketPath())
	raw2.write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpAdmin, ID: 7, Body: []byte(`{"op":"explain","args":{"descriptors":[{"name":"","value":"v"}]}}`)}))
	require.NoError(t, wire.DecodeAdminResponse(readFrame(t, raw2), &ar))
	assert.Equal(t, wire.CodeMalformed, ar.Code)
	assert.Contains(t, string(ar.Payload), "name \\\"\\\" empty")
}

// readFrame reads one whole frame from r.
func readFrame(t *testing.T, r *rawConn) []byte {
	t.Helper()
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [4]byte
	_, err := io.ReadFull(r.br, hdr[:])
	require.NoError(t, err)
	n := int(hdr[0])<<24 | int(hdr[1])<<16 | int(hdr[2])<<8 | int(hdr[3])
	f := make([]byte, 4+n)
	copy(f, hdr[:])
	_, err = io.ReadFull(r.br, f[4:])
	require.NoError(t, err)
	return f
}

// TestDecisionLogAndTop: denials and allowed answers are logged as JSON
// lines with their fields; top lists the most denied key first.
func TestDecisionLogAndTop(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "decisions.jsonl")
	cfg := uidConfig(fmt.Sprintf(oneRule, 2), os.Getuid()) +
		fmt.Sprintf("\n[log]\ndecisions = %q\ndenied_rate = 1.0\nallowed_rate = 1.0\ndenied_per_second = 0\n", logPath)
	l := startLogged(t, dir, cfg)
	c := client.New(l.d.SocketPath())
	defer c.Close()
	check := func(key string, n int) {
		for range n {
			_, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: key}}, 1)
			require.NoError(t, err)
		}
	}
	check("abuser", 30) // 2 allowed, 28 denied
	check("other", 5)   // 2 allowed, 3 denied

	f, err := os.Open(logPath)
	require.NoError(t, err)
	defer f.Close()
	kinds := map[string]int{}
	var denied map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), sc.Text())
		require.NotEmpty(t, line["daemon"])
		require.NotEmpty(t, line["time"])
		if line["kind"] == "decision" {
			kinds[line["decision"].(string)]++
			if line["decision"] == "limited" && line["key"] == "api_key=abuser" {
				denied = line
			}
		} else {
			kinds[line["kind"].(string)]++
		}
	}
	assert.Equal(t, map[string]int{"config": 1, "allowed": 4, "limited": 31}, kinds)
	require.NotNil(t, denied)
	assert.Equal(t, "per-key", denied["rule"])
	assert.EqualValues(t, 2, denied["limit"])
	assert.EqualValues(t, 0, denied["remaining"])
	assert.Greater(t, denied["retry_after_ms"].(float64), 0.0)
	assert.Contains(t, denied, "latency_us")

	top := topOf(t, l.d.SocketPath(), "per-key")
	assert.Equal(t, uint64(31), top.Denied)
	assert.Equal(t, []admin.KeyCount{{Key: "api_key=abuser", Count: 28}, {Key: "api_key=other", Count: 3}}, top.Keys)
}

// TestDecisionLogCap: with every denial sampled and a cap of 5 a second,
// a burst of denials writes at most 5 lines per second it spans.
func TestDecisionLogCap(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "decisions.jsonl")
	cfg := fmt.Sprintf(oneRule, 1) + fmt.Sprintf("\n[log]\ndecisions = %q\ndenied_rate = 1.0\nallowed_rate = 0.0\ndenied_per_second = 5\n", logPath)
	l := startLogged(t, dir, cfg)
	c := client.New(l.d.SocketPath())
	defer c.Close()
	start := time.Now()
	for range 200 {
		_, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "k"}}, 1)
		require.NoError(t, err)
	}
	seconds := int(time.Since(start)/time.Second) + 2 // the seconds the burst can touch
	b, err := os.ReadFile(logPath)
	require.NoError(t, err)
	lines := strings.Count(string(b), `"kind":"decision"`)
	assert.GreaterOrEqual(t, lines, 5)
	assert.LessOrEqual(t, lines, 5*seconds, "at most 5 lines per second")
	assert.NotContains(t, string(b), `"decision":"allowed"`, "allowed_rate 0 logs no allowed answer")
}

// TestDecisionLogAcquiresAndErrors: an ACQUIRE over the socket is logged
// and counted in top as a check is, and an error answer (cost_too_large)
// is sampled, and counted, as a denial: with allowed_rate 0 it is still
// written, under the denied kind.
func TestDecisionLogAcquiresAndErrors(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "decisions.jsonl")
	cfg := uidConfig(fmt.Sprintf(oneRule, 2), os.Getuid()) +
		fmt.Sprintf("\n[log]\ndecisions = %q\ndenied_rate = 1.0\nallowed_rate = 0.0\ndenied_per_second = 0\n", logPath)
	l := startLogged(t, dir, cfg)
	c := client.New(l.d.SocketPath())
	defer c.Close()
	deniedLines := daemon.DecisionLogLines("denied")
	descs := []client.Descriptor{{Name: "api_key", Value: "acq"}}
	for i := range 3 {
		res, err := c.Acquire(context.Background(), descs, 1)
		require.NoError(t, err)
		assert.Equal(t, i < 2, res.Allowed(), "acquire %d", i)
	}
	_, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "big"}}, 5)
	var re *client.ResponseError
	require.ErrorAs(t, err, &re, "a cost above the capacity is an error answer")

	b, err := os.ReadFile(logPath)
	require.NoError(t, err)
	log := string(b)
	assert.Equal(t, 1, strings.Count(log, `"decision":"limited"`), log)
	assert.Contains(t, log, `"key":"api_key=acq","decision":"limited"`)
	assert.Equal(t, 1, strings.Count(log, `"decision":"error"`), log)
	assert.NotContains(t, log, `"decision":"allowed"`)
	assert.Equal(t, deniedLines+2, daemon.DecisionLogLines("denied"), "the acquire's denial and the error")

	top := topOf(t, l.d.SocketPath(), "per-key")
	assert.Equal(t, []admin.KeyCount{{Key: "api_key=acq", Count: 1}}, top.Keys)
}

// topOf asks the daemon on sock for the top denied keys of rule (5 of
// them) over its admin socket.
func topOf(t *testing.T, sock, rule string) admin.RuleTop {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	args, err := json.Marshal(map[string]any{"rule": rule, "n": 5})
	require.NoError(t, err)
	res, err := admin.CallSocket(ctx, sock, admin.Request{Op: "top", Args: args})
	require.NoError(t, err)
	require.Nil(t, res.Err)
	var top admin.TopResult
	require.NoError(t, json.Unmarshal(res.Result, &top))
	require.Len(t, top.Rules, 1)
	return top.Rules[0]
}
