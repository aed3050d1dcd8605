package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
)

// TestHelpTexts: rld help and every command's -h print useful text on
// stdout and exit 0.
func TestHelpTexts(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"help"}, []string{"rld check", "rld config check", "rld admin", "rld version", "SIGHUP"}},
		{[]string{"--help"}, []string{"rld check"}},
		{[]string{"serve", "-h"}, []string{"usage: rld [serve]", "socket activation", "-config", "-socket", "-http", "WATCHDOG=1"}},
		{[]string{"-h"}, []string{"rld check", "rld config check"}},
		{[]string{"check", "-h"}, []string{"usage: rld check", "exit status", "-cost", "-peek", "-json", "rld group"}},
		{[]string{"help", "check"}, []string{"usage: rld check"}},
		{[]string{"config", "check", "-h"}, []string{"usage: rld config check FILE", "validate"}},
		{[]string{"config", "-h"}, []string{"usage: rld config check FILE"}},
		{[]string{"version", "-h"}, []string{"usage: rld version", "-json", "rld_build_info"}},
		{[]string{"admin", "-h"}, []string{"usage: rld admin", "explain", "-token-file"}},
		{[]string{"help", "admin"}, []string{"usage: rld admin"}},
	} {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut)
		assert.Equal(t, 0, code, "rld %v: %s", tc.args, errOut.String())
		assert.Empty(t, errOut.String(), "rld %v writes nothing to stderr", tc.args)
		for _, w := range tc.want {
			assert.Contains(t, strings.ToLower(out.String()), strings.ToLower(w), "rld %v", tc.args)
		}
	}
	var out, errOut bytes.Buffer
	assert.Equal(t, exitError, run([]string{"check", "-bogus"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "usage: rld check", "a bad flag prints the usage on stderr")
	assert.Empty(t, out.String())
}

// buildStamped builds the binary the way `make build` does: static, with
// the version and commit stamped by the linker.
func buildStamped(t *testing.T, version, commit string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rld")
	args := append(append([]string{"build"}, daemontest.BuildFlags...), "-o", bin, "-ldflags",
		"-X github.com/rld/rld/buildinfo.Version="+version+" -X github.com/rld/rld/buildinfo.Commit="+commit, ".")
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// TestStampedVersion: a binary stamped with -ldflags -X prints its version
// and commit.
func TestStampedVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildStamped(t, "0.3.0", "abcdef0123456789")
	out, err := exec.Command(bin, "version").Output()
	require.NoError(t, err)
	assert.Regexp(t, `^rld 0\.3\.0 \(commit abcdef0123456789, go1\.\S+\)\n$`, string(out))
}

// TestSocketActivation: systemd-socket-activate (systemd's own tool,
// doing what rld.socket does) listens, hands the socket to rld on the
// first connection, and rld answers on it and logs the socket it was
// handed, not the configured one. On SIGTERM the socket stays, as the
// socket unit owns it.
func TestSocketActivation(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	activate, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Fatalf("systemd-socket-activate is missing (package systemd; make deps installs it): %v", err)
	}
	bin := buildStamped(t, "v0.0.0-activation", "feed")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rld.toml")
	configured := filepath.Join(dir, "configured.sock")
	handed := filepath.Join(dir, "handed.sock")
	require.NoError(t, os.WriteFile(cfg, []byte(`[server]
socket = "`+configured+`"
http = ""

[[rule]]
name = "act"
by = ["k"]
limit = 5
period = "1m"
`), 0o644))

	logs := &syncBuffer{}
	cmd := exec.Command(activate, "-l", handed, bin, "serve", "-config", cfg)
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("log:\n%s", logs.String())
		}
	})
	require.Eventually(t, func() bool { _, err := os.Stat(handed); return err == nil },
		10*time.Second, 10*time.Millisecond, "systemd-socket-activate listens")

	c := client.New(handed)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.Check(ctx, []client.Descriptor{{Name: "k", Value: "v"}}, 1)
	require.NoError(t, err, "the first connection starts rld, which answers it")
	assert.Equal(t, "act", res.Rule)
	assert.Equal(t, uint64(4), uint64(res.Remaining))

	// The answer may overtake the log lines on their way through the pipe.
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "activated=true") },
		10*time.Second, 10*time.Millisecond, "rld logs that it serves")
	log := logs.String()
	assert.Contains(t, log, "socket="+handed, "the log names the socket systemd passed")
	assert.Contains(t, log, "configured="+configured)
	_, err = os.Stat(configured)
	assert.ErrorIs(t, err, os.ErrNotExist, "rld did not listen on the configured path")

	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-exited:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("rld did not exit after SIGINT")
	}
	_, err = os.Stat(handed)
	assert.NoError(t, err, "the socket file belongs to the activator and stays")
}

// syncBuffer is a bytes.Buffer that a process writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
