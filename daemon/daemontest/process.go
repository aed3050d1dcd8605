package daemontest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/rld/rld/wire"
)

// Process is an rld daemon running as its own process, for tests that
// kill it (SIGKILL) or stop it (SIGTERM) as an operator or a crash would.
type Process struct {
	// Dir is the temporary directory holding the config and the socket.
	Dir string
	// Socket is the daemon's Unix socket path.
	Socket string

	cmd    *exec.Cmd
	logs   bytes.Buffer
	exited chan struct{}
	err    error // Wait's result, once exited is closed
}

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
)

// BuildFlags are the go build flags of the binary StartProcess runs,
// with CGO_ENABLED=0: those of `make build` but its linker stamps (the
// Makefile's TAGS), so that every test that builds cmd/rld, the
// packaging tests' `make build` among them, shares one compilation of
// the tree in the build cache.
var BuildFlags = []string{"-trimpath", "-tags", "grpcnotrace"}

// binary builds cmd/rld once per test process and returns its path.
func binary() (string, error) {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rld-bin")
		if err != nil {
			buildErr = err
			return
		}
		buildBin = filepath.Join(dir, "rld")
		args := append(append([]string{"build"}, BuildFlags...), "-o", buildBin, "github.com/rld/rld/cmd/rld")
		cmd := exec.Command("go", args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("daemontest: go build cmd/rld: %w\n%s", err, out)
		}
	})
	return buildBin, buildErr
}

// Binary returns the path of the rld binary that StartProcess runs,
// building it on the first call, for tests that run it themselves (from
// another language's test suite, say).
func Binary() (string, error) { return binary() }

// StartProcess writes config to a new temporary directory and runs the
// rld binary (built once per test process) on it, with its socket in that
// directory and HTTP and the admin HTTP API off, and waits until it
// answers a PING. flags follow those and win over them ("-http",
// "127.0.0.1:PORT" serves HTTP and /metrics).
func StartProcess(config string, flags ...string) (*Process, error) {
	bin, err := binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "rld")
	if err != nil {
		return nil, fmt.Errorf("daemontest: %w", err)
	}
	p := &Process{Dir: dir, Socket: filepath.Join(dir, "rld.sock"), exited: make(chan struct{})}
	cfg := filepath.Join(dir, "rld.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("daemontest: %w", err)
	}
	args := append([]string{"serve", "-config", cfg, "-socket", p.Socket, "-http", "off", "-admin-http", "off"}, flags...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stderr = &syncWriter{w: &p.logs}
	if err := p.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("daemontest: start rld: %w", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !ping(p.Socket) {
		select {
		case <-p.exited:
			os.RemoveAll(dir)
			return nil, fmt.Errorf("daemontest: rld exited before serving: %v\n%s", p.err, p.Logs())
		default:
		}
		if time.Now().After(deadline) {
			p.Close()
			return nil, fmt.Errorf("daemontest: rld not serving after 10s\n%s", p.Logs())
		}
		time.Sleep(10 * time.Millisecond) // polling readiness
	}
	return p, nil
}

// ping reports whether a daemon answers a PING on socket.
func ping(socket string) bool {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpPing, ID: 1})); err != nil {
		return false
	}
	buf := make([]byte, wire.MaxFrame)
	n := 0
	for {
		m, err := c.Read(buf[n:])
		n += m
		if f, _, ferr := wire.Next(buf[:n]); ferr == nil && f != nil {
			var res wire.Response
			return wire.DecodeResponse(f, &res) == nil && res.ID == 1
		}
		if err != nil {
			return false
		}
	}
}

// Kill sends SIGKILL and waits for the process to exit.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Term sends SIGTERM, as systemd's stop does, and waits up to timeout for
// the process to exit; it returns the exit error (nil for status 0).
func (p *Process) Term(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		var ee *exec.ExitError
		if errors.As(p.err, &ee) {
			return fmt.Errorf("daemontest: rld exited with %v", ee)
		}
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("daemontest: rld still running %v after SIGTERM", timeout)
	}
}

// Logs returns what the process wrote to stderr so far.
func (p *Process) Logs() string {
	w := p.cmd.Stderr.(*syncWriter)
	w.mu.Lock()
	defer w.mu.Unlock()
	return p.logs.String()
}

// Close kills the process if it still runs and removes its directory.
func (p *Process) Close() {
	select {
	case <-p.exited:
	default:
		p.Kill()
	}
	os.RemoveAll(p.Dir)
}

// syncWriter serialises writes to w, so that Logs may read it while the
// process writes.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}
