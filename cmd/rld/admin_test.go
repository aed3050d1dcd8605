package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/wire"
)

// TestAdminThroughBinary runs `rld admin` of the built binary against a
// daemon of the same binary, over the socket (this process's uid listed,
// then not) and over the admin HTTP API with its token: exit codes 0, 1
// and 2 as `rld check` gives them.
func TestAdminThroughBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin, err := daemontest.Binary()
	require.NoError(t, err)
	token := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(token, []byte("a-token-of-enough-length\n"), 0o600))
	adminAddr := freePort(t)

	serve := func(uid int, adminHTTP string) string {
		sock := filepath.Join(t.TempDir(), "rld.sock")
		cfg := filepath.Join(t.TempDir(), "rld.toml")
		require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`
[admin]
socket_uids = [%d]
token_file = %q
[[rule]]
name = "search"
match = { endpoint = "/v1/search*" }
by = ["api_key"]
limit = 30
period = "1m"
[[rule]]
name = "per-ip"
by = ["ip"]
limit = 5
period = "1m"
`, uid, token)), 0o644))
		srv := exec.Command(bin, "serve", "-config", cfg, "-socket", sock, "-http", "off", "-admin-http", adminHTTP)
		var logs strings.Builder
		srv.Stderr = &logs
		require.NoError(t, srv.Start())
		t.Cleanup(func() {
			srv.Process.Kill()
			srv.Wait()
			if t.Failed() {
				t.Logf("daemon log:\n%s", logs.String())
			}
		})
		c := client.New(sock)
		defer c.Close()
		require.Eventually(t, func() bool { return c.Ping(context.Background()) == nil }, 10*time.Second, 20*time.Millisecond, "daemon answers PING")
		return sock
	}
	rld := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
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

	sock := serve(os.Getuid(), adminAddr)
	out, errOut, code := rld("admin", "-socket", sock, "explain", "api_key=demo", "endpoint=/v1/search")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "a check now: allowed by search remaining=29 reset=2000ms\n"+
		"search: key api_key=demo token_bucket 30/1m cached fail=open remaining=29 reset=2000ms\n"+
		"per-ip: does not apply (no ip descriptor)\n", out)
	out, errOut, code = rld("admin", "-socket", sock, "-json", "explain", "api_key=demo", "endpoint=/v1/search")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"rules":[{"rule":"search","key":"api_key=demo"`)
	assert.Contains(t, out, `"decision":{"status":"allowed","rule":"search","allowed":true,"limit":30,"remaining":29,`)
	out, _, code = rld("admin", "-socket", sock, "config")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "2 rules")
	out, errOut, code = rld("admin", "-socket", sock, "top", "-local")
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `^denials of this daemon\n  \S+ \(this daemon\)\nno denials yet\n$`, out)
	out, errOut, code = rld("admin", "-socket", sock, "-json", "top")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"fleet":false`, "without Redis: this daemon's")
	_, errOut, code = rld("admin", "-socket", sock, "top", "-rule", "nope")
	assert.Equal(t, 1, code, "not found")
	assert.Contains(t, errOut, `not_found: no rule "nope"`)
	_, errOut, code = rld("admin", "-socket", sock, "explain", "novalue")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `descriptor "novalue" is not name=value`)
	_, _, code = rld("admin", "-socket", filepath.Join(dir, "missing.sock"), "config")
	assert.Equal(t, 2, code, "no daemon")

	// Over HTTP: the right token, then none.
	out, errOut, code = rld("admin", "-http", "http://"+adminAddr, "-token-file", token, "explain", "ip=192.0.2.1")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "per-ip: key ip=192.0.2.1")
	_, errOut, code = rld("admin", "-http", "http://"+adminAddr, "config")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "unauthorized")

	// reset over the socket, grant over HTTP, of a key used up.
	c := client.New(sock)
	defer c.Close()
	ip := []client.Descriptor{{Name: "ip", Value: "192.0.2.9"}}
	useUp := func() {
		t.Helper()
		for {
			res, err := c.Check(context.Background(), ip, 1)
			require.NoError(t, err)
			if res.Status != wire.StatusAllowed {
				return
			}
		}
	}
	allowed := func() int {
		t.Helper()
		n := 0
		for range 10 {
			res, err := c.Check(context.Background(), ip, 1)
			require.NoError(t, err)
			if res.Status == wire.StatusAllowed {
				n++
			}
		}
		return n
	}
	useUp()
	out, errOut, code = rld("admin", "-socket", sock, "reset", "-rule", "per-ip", "-key", "ip=192.0.2.9")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "per-ip: key ip=192.0.2.9 token_bucket cached remaining=4")
	assert.Equal(t, 5, allowed(), "a fresh key: its whole limit")
	out, errOut, code = rld("admin", "-http", "http://"+adminAddr, "-token-file", token, "grant", "-n", "2", "ip=192.0.2.9")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "per-ip: key ip=192.0.2.9 token_bucket cached remaining=1")
	assert.Equal(t, 2, allowed(), "a grant of 2")
	_, errOut, code = rld("admin", "-socket", sock, "grant", "-n", "0", "ip=192.0.2.9")
	assert.Equal(t, 2, code, "bad request")
	assert.Contains(t, errOut, "n = 0")
	_, errOut, code = rld("admin", "-socket", sock, "reset", "-rule", "nope", "-key", "ip=1")
	assert.Equal(t, 1, code, "not found")
	assert.Contains(t, errOut, `unknown rule "nope"`)
	assert.Zero(t, allowed(), "the refused requests changed nothing")

	// A daemon that does not list this uid refuses: exit 1.
	other := serve(os.Getuid()+1, "off")
	_, errOut, code = rld("admin", "-socket", other, "config")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "forbidden")
}
