package main

import (
	"bufio"
	"context"
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
	"time"

	"github.com/rld/rld/wire"
)

const (
	// readyTimeout bounds the wait for a started process to answer.
	readyTimeout = 15 * time.Second
	// pollInterval is the pause between two readiness probes.
	pollInterval = 20 * time.Millisecond
	// stopTimeout is how long a process may take to exit after SIGTERM
	// before it gets SIGKILL.
	stopTimeout = 3 * time.Second
	// portTries is how many free ports redis-server is offered, in case
	// another process takes one first.
	portTries = 3
	// tailLines is how many lines of a process's log an error quotes.
	tailLines = 10
)

// procs are the processes rld-bench started, in a temporary directory
// holding their sockets, configurations and logs. close stops them all
// and removes the directory. Not safe for concurrent use.
type procs struct {
	dir  string
	list []*proc
}

// proc is one started process.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when it has exited
}

func newProcs() (*procs, error) {
	dir, err := os.MkdirTemp("", "rld-bench-")
	if err != nil {
		return nil, fmt.Errorf("cannot make a temporary directory: %w", err)
	}
	return &procs{dir: dir}, nil
}

// start runs bin with args, its output going to a log file named after
// name in the directory.
func (ps *procs) start(name, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, log: filepath.Join(ps.dir, name+".log"), done: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	defer logf.Close() // the child has its own descriptor
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = ps.dir
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start %s (%s): %w", name, bin, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	ps.list = append(ps.list, p)
	return p, nil
}

// close stops every process, newest first, and removes the directory.
func (ps *procs) close() {
	for i := len(ps.list) - 1; i >= 0; i-- {
		ps.list[i].stop()
	}
	ps.list = nil
	os.RemoveAll(ps.dir)
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, then SIGKILL after stopTimeout, and waits for the
// process to exit.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// failed returns err with the process's state and the end of its log.
func (p *proc) failed(err error) error {
	state := "running"
	if p.exited() {
		state = p.cmd.ProcessState.String()
	}
	return fmt.Errorf("%s (%s): %w\n--- last lines of %s:\n%s", p.name, state, err, p.log, tail(p.log, tailLines))
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// waitReady calls probe every pollInterval until it succeeds, p exits,
// ctx is done or readyTimeout passes.
func (p *proc) waitReady(ctx context.Context, probe func() error) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		err := probe()
		if err == nil {
			return nil
		}
		if p.exited() {
			return p.failed(errors.New("exited before it was ready"))
		}
		if time.Now().After(deadline) {
			return p.failed(fmt.Errorf("not ready after %v: %w", readyTimeout, err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollInterval):
		}
	}
}

// startEcho starts `rld-bench echo` (this program) on a socket in the
// directory and returns the socket's path and the process's pid once it
// accepts connections.
func (ps *procs) startEcho(ctx context.Context) (string, int, error) {
	self, err := os.Executable()
	if err != nil {
		return "", 0, fmt.Errorf("echo: cannot find this program: %w", err)
	}
	sock := filepath.Join(ps.dir, "echo.sock")
	p, err := ps.start("echo", self, "echo", "-socket", sock)
	if err != nil {
		return "", 0, err
	}
	return sock, p.cmd.Process.Pid, p.waitReady(ctx, func() error {
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// startRedis starts redis-server on a free loopback port, with no
// persistence, and returns its address once it answers PING.
func (ps *procs) startRedis(ctx context.Context) (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found in PATH (make deps installs it): %w", err)
	}
	for try := 1; ; try++ {
		port, err := freePort()
		if err != nil {
			return "", err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p, err := ps.start("redis-"+strconv.Itoa(port), bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", ps.dir)
		if err != nil {
			return "", err
		}
		err = p.waitReady(ctx, func() error { return redisPing(addr) })
		if err == nil {
			return addr, nil
		}
		p.stop()
		if try == portTries || !strings.Contains(tail(p.log, tailLines), "Address already in use") {
			return "", err
		}
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("cannot find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// redisPing sends PING to the Redis at addr and expects +PONG.
func redisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// rldConfig is what a spawned daemon is told.
type rldConfig struct {
	socket   string
	redis    []string // host:port, or none for the embedded store
	cluster  bool     // redis holds the seed nodes of a Cluster
	names    []string
	limit    int64
	period   time.Duration // 0 means defaultPeriod
	alg      string        // the rule's algorithm; "" means the default (token_bucket)
	mode     string        // the rule's mode; "" means the default (cached)
	prefix   string        // store.key_prefix; "" means the default
	keys     int
	inflight int
}

// Store settings of a spawned daemon.
const (
	// spawnRedisTimeout bounds the daemon's Redis calls: long enough that
	// a loaded two-core machine does not turn latency into errors.
	spawnRedisTimeout = "250ms"
	// spawnMinKeys is the least store.max_keys a spawned daemon gets.
	spawnMinKeys = 1_000_000
	// spawnMinInflight is the least server.max_inflight it gets.
	spawnMinInflight = 1024
)

// toml returns the configuration file: one rule (a token bucket unless
// alg says otherwise), keyed by every descriptor of the template,
// allowing limit per period.
func (c *rldConfig) toml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by rld-bench for one run.\n[server]\nsocket = %q\nhttp = \"\"\n", c.socket)
	fmt.Fprintf(&b, "max_inflight = %d\nlog_level = \"warn\"\ndrain_timeout = \"1s\"\n\n", max(c.inflight, spawnMinInflight))
	fmt.Fprintf(&b, "[store]\nmax_keys = %d\n", max(2*c.keys, spawnMinKeys))
	if len(c.redis) > 0 {
		b.WriteString("redis = [")
		for i, a := range c.redis {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%q", a)
		}
		fmt.Fprintf(&b, "]\ntimeout = %q\n", spawnRedisTimeout)
		if c.prefix != "" {
			// A table's daemon starts on fresh counters, whatever the
			// tables before it left in the same Redis.
			fmt.Fprintf(&b, "key_prefix = %q\n", c.prefix)
		}
		if c.cluster {
			b.WriteString("mode = \"cluster\"\n")
		}
	}
	fmt.Fprintf(&b, "\n[[rule]]\nname = %q\nby = [", benchRule)
	for i, n := range c.names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", n)
	}
	period := c.period
	if period == 0 {
		period = defaultPeriod
	}
	fmt.Fprintf(&b, "]\nlimit = %d\nperiod = %q\n", c.limit, period.String())
	if c.alg != "" {
		fmt.Fprintf(&b, "algorithm = %q\n", c.alg)
	}
	if c.mode != "" {
		fmt.Fprintf(&b, "mode = %q\n", c.mode)
	}
	return b.String()
}

// startRLD writes c's configuration into the directory, starts the
// daemon bin on it, and returns its pid once it answers PING on c.socket.
func (ps *procs) startRLD(ctx context.Context, name, bin string, c *rldConfig) (int, error) {
	path := filepath.Join(ps.dir, name+".toml")
	if err := os.WriteFile(path, []byte(c.toml()), 0o644); err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	p, err := ps.start(name, bin, "serve", "-config", path)
	if err != nil {
		return 0, err
	}
	return p.cmd.Process.Pid, p.waitReady(ctx, func() error { return ping(c.socket) })
}

// ping sends one PING to rld's socket at path and waits for its answer.
func ping(path string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpPing, ID: 1})); err != nil {
		return err
	}
	buf := make([]byte, wire.MaxFrame)
	n := 0
	for {
		m, err := c.Read(buf[n:])
		if err != nil {
			return err
		}
		n += m
		f, _, err := wire.Next(buf[:n])
		if err != nil {
			return err
		}
		if f == nil {
			continue
		}
		var res wire.Response
		if err := wire.DecodeResponse(f, &res); err != nil {
			return err
		}
		if res.Op != wire.OpPing || res.ID != 1 || res.Status != wire.StatusAllowed {
			return fmt.Errorf("PING answered op %#x id %d status %s", byte(res.Op), res.ID, res.Status)
		}
		return nil
	}
}

// findRLD returns the daemon binary: flag when set, else bin/rld under
// the working directory, else rld on PATH.
func findRLD(flag string) (string, error) {
	if flag != "" {
		if !strings.ContainsRune(flag, filepath.Separator) {
			return exec.LookPath(flag)
		}
		// Absolute: the daemon runs in the temporary directory.
		return filepath.Abs(flag)
	}
	if abs, err := filepath.Abs(filepath.Join("bin", "rld")); err == nil {
		if fi, err := os.Stat(abs); err == nil && !fi.IsDir() {
			return abs, nil
		}
	}
	p, err := exec.LookPath("rld")
	if err != nil {
		return "", errors.New("rld binary not found in bin/rld or PATH: build it with `go build -o bin/rld ./cmd/rld` or pass -rld PATH")
	}
	return p, nil
}
