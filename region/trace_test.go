package region_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// tracing reports whether the multi-region tests log the regional and
// global stores' commands (RLD_REGIONS_TRACE=1): the timestamps of each
// flush of demand, renewal and load show where a share's lag goes.
func tracing() bool { return os.Getenv("RLD_REGIONS_TRACE") != "" }

// monitor records the commands a Redis runs on rld's region keys, with
// the server's timestamps, through MONITOR on a connection of its own.
type monitor struct {
	name  string
	mu    sync.Mutex
	lines []traced
}

// traced is one command a monitor saw.
type traced struct {
	at   time.Time
	from string // the client's address, "lua" inside a script
	cmd  string
}

// startMonitor starts a monitor of the Redis at addr until t ends.
func startMonitor(t testing.TB, name, addr string) *monitor {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	m := &monitor{name: name}
	go m.read(bufio.NewReader(c))
	return m
}

// read parses MONITOR lines: +1700000000.123456 [0 127.0.0.1:5555] "CMD" "arg"...
func (m *monitor) read(r *bufio.Reader) {
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimSpace(strings.TrimPrefix(line, "+"))
		ts, rest, ok := strings.Cut(line, " [")
		if !ok || !strings.Contains(rest, "rld:") {
			continue
		}
		who, cmd, _ := strings.Cut(rest, "] ")
		if _, addr, ok := strings.Cut(who, " "); ok {
			who = addr
		}
		sec, err := strconv.ParseFloat(ts, 64)
		if err != nil {
			continue
		}
		at := time.UnixMicro(int64(sec * 1e6))
		m.mu.Lock()
		m.lines = append(m.lines, traced{at: at, from: who, cmd: shorten(cmd)})
		m.mu.Unlock()
	}
}

// shorten keeps a command's name, key and last arguments, dropping
// script bodies and SHAs.
func shorten(cmd string) string {
	f := strings.Fields(cmd)
	if len(f) > 0 && (f[0] == `"EVALSHA"` || f[0] == `"EVAL"`) && len(f) > 3 {
		f = append(f[:1], f[3:]...)
	}
	s := strings.Join(f, " ")
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// log logs the commands seen within [from, to], timed from origin.
func (m *monitor) log(t testing.TB, origin, from, to time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	for _, l := range m.lines {
		if l.at.Before(from) || l.at.After(to) {
			continue
		}
		fmt.Fprintf(&b, "\n  %s %+7.1fms %-21s %s", m.name, float64(l.at.Sub(origin).Microseconds())/1000, l.from, l.cmd)
	}
	t.Logf("trace of %s:%s", m.name, b.String())
}
