package redistest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// shortTimeout is how long a call that must not be answered is given.
const shortTimeout = 100 * time.Millisecond

// TestProxy runs each fault against a real redis-server, each subtest
// with its own proxy, and then checks that the closed proxies left no
// goroutine behind.
func TestProxy(t *testing.T) {
	srv := Standalone(t)
	base := runtime.NumGoroutine()

	t.Run("forwards", func(t *testing.T) {
		p := StartProxy(t, srv.Addr)
		if got, err := Do(p.Addr(), "PING"); err != nil || got != "PONG" {
			t.Fatalf("PING through the proxy = %q, %v", got, err)
		}
		big := strings.Repeat("0123456789", 10*proxyChunk/10+7) // several chunks
		if got, err := Do(p.Addr(), "SET", "big", big); err != nil || got != "OK" {
			t.Fatalf("SET big = %q, %v", got, err)
		}
		if got, err := Do(p.Addr(), "GET", "big"); err != nil || got != big {
			t.Fatalf("GET big: %d bytes, %v; want %d bytes", len(got), err, len(big))
		}
	})

	t.Run("blackhole", func(t *testing.T) {
		p := StartProxy(t, srv.Addr)
		c := dialRESP(t, p.Addr())
		if got, err := c.ping(doTimeout); err != nil || got != "PONG" {
			t.Fatalf("PING before the blackhole = %q, %v", got, err)
		}

		p.Blackhole()
		if got, err := c.ping(shortTimeout); !isTimeout(err) {
			t.Errorf("PING on an open connection in a blackhole = %q, %v; want a timeout", got, err)
		}
		if got, err := call(p.Addr(), shortTimeout, "PING"); !isTimeout(err) {
			t.Errorf("PING on a new connection in a blackhole = %v, %v; want a timeout", got, err)
		}

		p.Heal()
		// The PING held by the blackhole is forwarded, then its answer.
		if got, err := c.readLine(doTimeout); err != nil || got != "+PONG" {
			t.Errorf("the held PING's reply after Heal = %q, %v", got, err)
		}
		if got, err := c.ping(doTimeout); err != nil || got != "PONG" {
			t.Errorf("PING on the same connection after Heal = %q, %v", got, err)
		}
		if got, err := Do(p.Addr(), "PING"); err != nil || got != "PONG" {
			t.Errorf("PING on a new connection after Heal = %q, %v", got, err)
		}
	})

	t.Run("delay", func(t *testing.T) {
		p := StartProxy(t, srv.Addr)
		c := dialRESP(t, p.Addr())
		const d = 50 * time.Millisecond
		p.Delay(d)
		start := time.Now()
		if got, err := c.ping(doTimeout); err != nil || got != "PONG" {
			t.Fatalf("PING with a delay = %q, %v", got, err)
		}
		// The request and the reply are each delayed by d.
		if rtt := time.Since(start); rtt < 2*d {
			t.Errorf("PING with a delay of %s each way took %s; want at least %s", d, rtt, 2*d)
		}
		p.Delay(0)
		if got, err := c.ping(doTimeout); err != nil || got != "PONG" {
			t.Errorf("PING after Delay(0) = %q, %v", got, err)
		}
	})

	t.Run("drop", func(t *testing.T) {
		p := StartProxy(t, srv.Addr)
		c := dialRESP(t, p.Addr())
		if got, err := c.ping(doTimeout); err != nil || got != "PONG" {
			t.Fatalf("PING before the drop = %q, %v", got, err)
		}
		p.Drop()
		got, err := c.ping(doTimeout)
		if err == nil || isTimeout(err) {
			t.Errorf("PING on a dropped connection = %q, %v; want a reset", got, err)
		}
		if got, err := Do(p.Addr(), "PING"); err != nil || got != "PONG" {
			t.Errorf("PING on a new connection after Drop = %q, %v", got, err)
		}
		WaitFor(t, "the dropped connections to be forgotten", func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return len(p.links) == 0
		})
	})

	t.Run("refuse", func(t *testing.T) {
		p := StartProxy(t, srv.Addr)
		c := dialRESP(t, p.Addr())
		if got, err := c.ping(doTimeout); err != nil || got != "PONG" { // accepted
			t.Fatalf("PING before refusing = %q, %v", got, err)
		}
		p.Refuse(true)
		if got, err := call(p.Addr(), doTimeout, "PING"); err == nil || isTimeout(err) {
			t.Errorf("PING on a new connection while refusing = %v, %v; want a refusal", got, err)
		}
		if got, err := c.ping(doTimeout); err != nil || got != "PONG" {
			t.Errorf("PING on an open connection while refusing = %q, %v", got, err)
		}
		p.Refuse(false)
		if got, err := Do(p.Addr(), "PING"); err != nil || got != "PONG" {
			t.Errorf("PING after Refuse(false) = %q, %v", got, err)
		}
	})

	t.Run("target down", func(t *testing.T) {
		down := Standalone(t)
		down.Kill()
		p := StartProxy(t, down.Addr)
		if got, err := call(p.Addr(), doTimeout, "PING"); err == nil || isTimeout(err) {
			t.Errorf("PING through a proxy to a dead server = %v, %v; want a reset", got, err)
		}
	})

	// Connections still open when the proxy closes, one of them with data
	// held by a blackhole, another by a delay: the proxy must close them
	// and end every goroutine of its own.
	var open []*respConn
	t.Run("close while open", func(t *testing.T) {
		p := StartProxy(t, srv.Addr)
		for range 3 {
			conn, err := net.DialTimeout("tcp", p.Addr(), doTimeout)
			if err != nil {
				t.Fatal(err)
			}
			c := &respConn{Conn: conn, r: bufio.NewReader(conn)}
			open = append(open, c)
			if got, err := c.ping(doTimeout); err != nil || got != "PONG" {
				t.Fatalf("PING = %q, %v", got, err)
			}
		}
		p.Delay(time.Hour)
		io.WriteString(open[1], "*1\r\n$4\r\nPING\r\n")
		p.Blackhole()
		io.WriteString(open[2], "*1\r\n$4\r\nPING\r\n")
	})
	for i, c := range open {
		if got, err := c.readLine(doTimeout); err == nil || isTimeout(err) {
			t.Errorf("connection %d after the proxy closed: read %q, %v; want it closed", i, got, err)
		}
		c.Close()
	}

	WaitFor(t, "the proxies' goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}

// respConn is a raw connection speaking RESP, for tests that need to keep
// one connection across a fault.
type respConn struct {
	net.Conn
	r *bufio.Reader
}

// dialRESP connects to addr; the connection is closed when t ends.
func dialRESP(t *testing.T, addr string) *respConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, doTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &respConn{Conn: c, r: bufio.NewReader(c)}
}

// ping sends PING and reads the reply within timeout.
func (c *respConn) ping(timeout time.Duration) (string, error) {
	c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "*1\r\n$4\r\nPING\r\n"); err != nil {
		return "", err
	}
	line, err := c.readLine(timeout)
	if err != nil {
		return "", err
	}
	if line != "+PONG" {
		return "", errors.New("reply " + line)
	}
	return "PONG", nil
}

// readLine reads one reply line, without its CRLF, within timeout.
func (c *respConn) readLine(timeout time.Duration) (string, error) {
	c.SetReadDeadline(time.Now().Add(timeout))
	line, err := c.r.ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
