package python

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/internal/reqcorpus"
)

// systemPython is Debian's python3, which has gunicorn and uvicorn
// (scripts/deps.sh installs them).
const systemPython = "/usr/bin/python3"

// webServer is tests/serve.py running one real server (wsgiref, gunicorn
// or uvicorn) with rld.py's middleware in front of a hello app.
type webServer struct {
	kind     string
	v4, v6   string // host:port on 127.0.0.1 and [::1]
	cmd      *exec.Cmd
	mu       sync.Mutex
	stderr   bytes.Buffer
	waitDone chan struct{}
}

// startServer runs serve.py KIND SOCKET and waits for its "listening"
// line; the server is stopped (SIGTERM to its process group, then
// SIGKILL) when the test ends.
func startServer(t *testing.T, kind, socket string) *webServer {
	t.Helper()
	if _, err := os.Stat(systemPython); err != nil {
		t.Fatalf("%s is missing (make deps): %v", systemPython, err)
	}
	s := &webServer{kind: kind, waitDone: make(chan struct{})}
	s.cmd = exec.Command(systemPython, filepath.Join("tests", "serve.py"), kind, socket)
	s.cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s.cmd.Stderr = writerFunc(func(b []byte) (int, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.stderr.Write(b)
	})
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", kind, err)
	}
	go func() { s.cmd.Wait(); close(s.waitDone) }()
	t.Cleanup(s.stop)
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		lines <- line
	}()
	select {
	case line := <-lines:
		var f []string
		if f = strings.Fields(line); len(f) != 3 || f[0] != "listening" {
			t.Fatalf("%s did not start: %q\n%s", kind, line, s.logs())
		}
		s.v4, s.v6 = f[1], f[2]
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not say where it listens within 30 s\n%s", kind, s.logs())
	}
	return s
}

func (s *webServer) logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

func (s *webServer) stop() {
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.waitDone:
	case <-time.After(10 * time.Second):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.waitDone
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// servedStatus reports whether an answer came from the middleware (the
// app's 200, or 403 for the daemon's blocked answer to an oversize target)
// rather than from the server refusing the request itself.
func servedStatus(code int) bool { return code == 200 || code == 403 }

// serverRefuses reports whether kind refuses c by itself, by a rule of
// its own that the corpus does not mark (may_refuse): h11, uvicorn's
// HTTP/1.1 parser, refuses a request target holding bytes outside ASCII
// (RFC 9112 allows none there).
func serverRefuses(kind string, c *reqcorpus.Case) bool {
	if kind != "uvicorn" {
		return false
	}
	for i := 0; i < len(c.Target); i++ {
		if c.Target[i] >= 0x80 {
			return true
		}
	}
	return false
}

// TestRequestCorpus replays clients/testdata/requests.tsv through each real
// server — gunicorn (WSGI, RAW_URI), uvicorn (ASGI, raw_path) and wsgiref
// (WSGI, PATH_INFO re-quoted) — into one real daemon started on
// requests.toml with every decision logged, and requires, for each case,
// the descriptors the daemon logged to be the case's own: the client sends
// what the server saw and derives nothing itself. A case a server refuses
// by itself (4xx, nothing logged) must be marked may_refuse, or be one
// that serverRefuses names.
func TestRequestCorpus(t *testing.T) {
	cases, err := reqcorpus.Load()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "decisions.log")
	cfg, err := reqcorpus.Config(fmt.Sprintf("[log]\ndecisions = %q\nallowed_rate = 1.0\ndenied_rate = 1.0\ndenied_per_second = 0\n", logPath))
	if err != nil {
		t.Fatal(err)
	}
	p, err := daemontest.StartProcess(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	log := &reqcorpus.DecisionLog{Path: logPath}
	for _, kind := range []string{"gunicorn", "uvicorn", "wsgiref"} {
		t.Run(kind, func(t *testing.T) {
			srv := startServer(t, kind, p.Socket)
			var refused []string
			for i := range cases {
				c := &cases[i]
				if !replay(t, srv, c, log) {
					refused = append(refused, c.Name)
				}
			}
			t.Logf("%s: %d cases, refused by the server itself: %v", kind, len(cases), refused)
		})
	}
	if t.Failed() {
		t.Logf("rld's log:\n%s", p.Logs())
	}
}

// replay sends one case through srv and checks the decision it logged;
// it returns false when the server refused the case itself.
func replay(t *testing.T, srv *webServer, c *reqcorpus.Case, log *reqcorpus.DecisionLog) bool {
	t.Helper()
	code, err := c.Send(srv.v4, srv.v6, 10*time.Second)
	if err != nil && !c.MayRefuse {
		t.Errorf("%s (line %d): %v\n%s", c.Name, c.Line, err, srv.logs())
		return true
	}
	if err != nil || !servedStatus(code) {
		if !c.MayRefuse && !serverRefuses(srv.kind, c) {
			t.Errorf("%s (line %d): the server answered %d (%v) and the case is not may_refuse", c.Name, c.Line, code, err)
		}
		if err == nil && (code < 400 || code >= 500) {
			t.Errorf("%s (line %d): the server answered %d, want a 4xx refusal", c.Name, c.Line, code)
		}
		if got, err := log.Next(); err != nil || len(got) != 0 {
			t.Errorf("%s (line %d): refused by the server (%d), yet logged %v (%v)", c.Name, c.Line, code, got, err)
		}
		return false
	}
	got := nextDecision(t, c, log)
	if got == nil {
		return true
	}
	if c.Oversize {
		if got.Decision != "blocked" || got.Rule != "oversize" || code != 403 {
			t.Errorf("%s (line %d): answered %d, logged %s by %q; want 403, blocked by oversize", c.Name, c.Line, code, got.Decision, got.Rule)
		}
		return true
	}
	if want, have := reqcorpus.Lines(c.Want), reqcorpus.Lines(got.Descs); want != have {
		t.Errorf("%s (line %d) through %s: derived\n%swant\n%s", c.Name, c.Line, srv.kind, have, want)
	}
	return true
}

// nextDecision waits for the one decision a served case logs.
func nextDecision(t *testing.T, c *reqcorpus.Case, log *reqcorpus.DecisionLog) *reqcorpus.Logged {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := log.Next()
		if err != nil && !os.IsNotExist(err) {
			t.Fatalf("%s: reading the decision log: %v", c.Name, err)
		}
		switch {
		case len(got) == 1:
			return &got[0]
		case len(got) > 1:
			t.Errorf("%s (line %d): %d decisions logged, want 1: %v", c.Name, c.Line, len(got), got)
			return nil
		case time.Now().After(deadline):
			t.Errorf("%s (line %d): no decision logged within 10 s", c.Name, c.Line)
			return nil
		}
		time.Sleep(5 * time.Millisecond) // polling a file the daemon appends to
	}
}
