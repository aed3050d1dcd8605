// Package redistest starts real redis-server processes for tests: a
// standalone server, a Cluster and a Sentinel group, each on free loopback
// ports in a temporary directory, killed when the test ends.
package redistest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	// readyTimeout bounds every readiness and failover poll. It is
	// generous: a loaded two-core machine is slow, and a passing test never
	// waits for it.
	readyTimeout = 30 * time.Second
	// pollInterval is the pause between two checks of a poll.
	pollInterval = 20 * time.Millisecond
	// logName is the file, in the server's Dir, its output is appended to.
	logName = "redis.log"
	// tailLines is how many lines of a log a failure message quotes.
	tailLines = 15
	// portTries is how many ports a new server tries when another process
	// takes the probed one before redis-server binds it.
	portTries = 3
)

var (
	// errExited reports that a process exited while a poll waited for it.
	errExited = errors.New("process exited")
	// errPortTaken reports that redis-server could not bind its port.
	errPortTaken = errors.New("port already in use")
)

// Server is one redis-server process. Start, Kill, Pause and Resume are
// not safe for concurrent use; the exported fields do not change after the
// Server is returned.
type Server struct {
	// Addr is host:port.
	Addr string
	// Port is the TCP port.
	Port int
	// Dir is the server's working directory; its output goes to redis.log
	// there.
	Dir string
	// TLSAddr is host:port of the server's TLS port, "" when it serves
	// no TLS (see StandaloneTLS and ClusterTLS).
	TLSAddr string

	args []string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Standalone starts a standalone redis-server and stops it when t ends.
func Standalone(t testing.TB, extra ...string) *Server {
	t.Helper()
	s := &Server{Dir: t.TempDir()}
	t.Cleanup(s.Kill)
	err := s.spawn(func(port int) ([]string, error) {
		return append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", s.Dir}, extra...), nil
	})
	if err != nil {
		t.Fatalf("redistest: standalone: %v", err)
	}
	return s
}

// Start (re)starts the process with its original arguments and port, and
// waits until it answers on its port.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Kill stops the process with SIGKILL and waits for it to exit. It does
// nothing when the process is not running.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Pause stops the process with SIGSTOP; Resume continues it.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused process.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	if s.cmd != nil {
		s.cmd.Process.Signal(sig)
	}
}

// running reports whether the process was started and has not exited.
func (s *Server) running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// spawn picks a free port (with port+offset free too, for each offset),
// sets Port, Addr and the arguments args returns for it, and starts the
// server. When another process takes the port before redis-server binds
// it, it tries another. It does not use a testing.TB, so that servers can
// start concurrently.
func (s *Server) spawn(args func(port int) ([]string, error), offsets ...int) error {
	var err error
	for range portTries {
		if s.Port, err = freePort(offsets...); err != nil {
			return err
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		if s.args, err = args(s.Port); err != nil {
			return err
		}
		if err = s.start(); !errors.Is(err, errPortTaken) {
			return err
		}
	}
	return err
}

// start launches the process, its output appended to its log, and waits
// until it answers on its address as itself (INFO's process_id is its
// pid). On failure the process is killed and the error quotes the log.
func (s *Server) start() error {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return fmt.Errorf("redis-server not found in PATH: run `make deps` (it installs it with apt-get)")
	}
	if s.running() {
		return fmt.Errorf("redis-server %s is already running", s.Addr)
	}
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	logStart, _ := logf.Seek(0, io.SeekEnd)
	cmd := exec.Command("redis-server", s.args...)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Start()
	logf.Close() // the child has its own descriptor
	if err != nil {
		return fmt.Errorf("cannot start redis-server %s: %w", s.Addr, err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(s.done)

	err = pollUntil(readyTimeout, func() error {
		if !s.running() {
			return fmt.Errorf("%w (%v)", errExited, cmd.ProcessState)
		}
		// Not PING: a server of another test that took the port first
		// would answer it while this one fails to bind. The server must
		// be this process.
		reply, err := call(s.Addr, pollTimeout, "INFO", "server")
		if err != nil {
			return err
		}
		info, _ := reply.(string)
		if pid := infoField(info, "process_id"); pid != strconv.Itoa(cmd.Process.Pid) {
			return fmt.Errorf("%s is served by process %q, not by pid %d", s.Addr, pid, cmd.Process.Pid)
		}
		return nil
	})
	if err == nil {
		return nil
	}
	s.Kill()
	if b, _ := os.ReadFile(s.logPath()); int64(len(b)) > logStart &&
		strings.Contains(string(b[logStart:]), "Address already in use") {
		err = fmt.Errorf("%w: %w", errPortTaken, err)
	}
	return fmt.Errorf("redis-server %s did not answer: %w%s", s.Addr, err, s.logTail())
}

func (s *Server) logPath() string { return filepath.Join(s.Dir, logName) }

// logTail returns the last lines of the server's log, headed by its path,
// for failure messages.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return fmt.Sprintf("\n--- %s: %v", s.logPath(), err)
	}
	return fmt.Sprintf("\n--- %s (%s), last lines:\n%s", s.logPath(), s.Addr, tail(string(b), tailLines))
}

// tail returns the last n lines of text.
func tail(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// FreePort returns a loopback TCP port that is free now, and whose
// port+offset is free too when offset is not 0 (a Cluster node needs its
// bus port at port+10000).
func FreePort(t testing.TB, offset int) int {
	t.Helper()
	port, err := freePort(offset)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return port
}

// freePort returns a loopback TCP port that is free now, with port+o
// free too for each of offsets.
func freePort(offsets ...int) (int, error) {
next:
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		for _, o := range offsets {
			if o == 0 {
				continue
			}
			if port+o > 65535 {
				continue next
			}
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+o))
			if err != nil {
				continue next
			}
			l.Close()
		}
		return port, nil
	}
	return 0, fmt.Errorf("no free port with free ports at the offsets %v found", offsets)
}

// WaitFor polls cond until it holds, failing t with what after
// readyTimeout.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll(t, what, func() error {
		if !cond() {
			return errors.New("condition not met")
		}
		return nil
	})
}

// poll calls check until it returns nil, failing t after readyTimeout with
// what, check's last error and the tail of each of logs.
func poll(t testing.TB, what string, check func() error, logs ...*Server) {
	t.Helper()
	if err := pollUntil(readyTimeout, check); err != nil {
		var b strings.Builder
		for _, s := range logs {
			b.WriteString(s.logTail())
		}
		t.Fatalf("redistest: waiting for %s: %v%s", what, err, b.String())
	}
}

// pollUntil calls check every pollInterval until it returns nil, and
// returns its last error, annotated, once timeout has passed or when the
// error is errExited, which waiting cannot fix.
func pollUntil(timeout time.Duration, check func() error) error {
	start := time.Now()
	for {
		err := check()
		if err == nil {
			return nil
		}
		if errors.Is(err, errExited) || time.Since(start) > timeout {
			return fmt.Errorf("gave up after %s: %w", time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(pollInterval)
	}
}
