package redistest

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// busyScript spins for ARGV[1] microseconds, by Redis's own clock.
const busyScript = `local t = redis.call('TIME')
local stop = t[1] * 1000000 + t[2] + tonumber(ARGV[1])
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop
return 1`

// Busy makes s run a script that spins for d, and returns when it has
// ended: meanwhile s answers nothing else, as a Redis busy with a slow
// command. It fails t when s does not run it.
func (s *Server) Busy(t testing.TB, d time.Duration) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", s.Addr, readyTimeout)
	if err != nil {
		t.Fatalf("redistest: busy %s: %v", s.Addr, err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(readyTimeout)); err != nil {
		t.Fatalf("redistest: busy %s: %v", s.Addr, err)
	}
	args := []string{"EVAL", busyScript, "0", strconv.FormatInt(d.Microseconds(), 10)}
	var cmd strings.Builder
	fmt.Fprintf(&cmd, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&cmd, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(cmd.String())); err != nil {
		t.Fatalf("redistest: busy %s: %v", s.Addr, err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != ":1\r\n" {
		t.Fatalf("redistest: busy %s: reply %q, %v", s.Addr, line, err)
	}
}
