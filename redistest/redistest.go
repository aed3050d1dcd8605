// Package redistest starts real redis-server processes for tests: a
// standalone server, a Cluster and a Sentinel group, each on free loopback
// ports in a temporary directory, killed when the test ends.
package redistest

import (
	"bufio"
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

// readyTimeout bounds how long a process may take to answer.
const readyTimeout = 20 * time.Second

// Server is one redis-server process.
type Server struct {
	// Addr is host:port.
	Addr string
	// Port is the TCP port.
	Port int
	// Dir is the server's working directory.
	Dir string

	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

// Standalone starts a standalone redis-server and stops it when t ends.
func Standalone(t testing.TB, extra ...string) *Server {
	t.Helper()
	s := &Server{Dir: t.TempDir()}
	s.Port = FreePort(t, 0)
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
	s.args = append([]string{"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.Dir}, extra...)
	t.Cleanup(s.Kill)
	s.Start(t)
	return s
}

// Start (re)starts the process with its original arguments and waits until
// it answers PING.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redistest: redis-server not found: run `make deps` (it installs it with apt-get)")
	}
	s.cmd = exec.Command("redis-server", s.args...)
	s.cmd.Dir = s.Dir
	log, err := os.Create(filepath.Join(s.Dir, "redis.log"))
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("redistest: cannot start redis-server: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); log.Close(); close(done) }(s.cmd, s.done)
	WaitFor(t, "redis "+s.Addr+" answers PING", func() bool {
		reply, err := Do(s.Addr, "PING")
		return err == nil && reply == "PONG"
	})
}

// Kill stops the process with SIGKILL and waits for it to exit.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Pause stops the process with SIGSTOP; Resume continues it.
func (s *Server) Pause() { s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused process.
func (s *Server) Resume() { s.cmd.Process.Signal(syscall.SIGCONT) }

// Do sends one command to addr and returns the reply as text: simple and
// bulk strings as they are, integers in decimal, arrays one element a
// line. It is for test set-up and inspection, not for the code under test.
func Do(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("redistest: empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		parts := make([]string, 0, max(n, 0))
		for range n {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("redistest: unexpected reply %q", line)
}

// FreePort returns a loopback TCP port that is free now, and whose
// port+offset is free too when offset is not 0 (a Cluster node needs its
// bus port at port+10000).
func FreePort(t testing.TB, offset int) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if offset == 0 {
			return port
		}
		if port+offset > 65535 {
			continue
		}
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+offset))
		if err == nil {
			l2.Close()
			return port
		}
	}
	t.Fatalf("redistest: no free port pair found")
	return 0
}

// WaitFor polls cond until it holds, failing t with what after
// readyTimeout.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: gave up after %s waiting for: %s", readyTimeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
