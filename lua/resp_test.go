package lua_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// conn is a minimal RESP2 client for the tests: one connection, commands
// written in pipelines, replies read in order.
type conn struct {
	t  testing.TB
	nc net.Conn
	r  *bufio.Reader
	w  *bufio.Writer
}

// redisError is an error reply.
type redisError string

func (e redisError) Error() string { return string(e) }

func dial(t testing.TB, addr string) *conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { nc.Close() })
	return &conn{t: t, nc: nc, r: bufio.NewReader(nc), w: bufio.NewWriter(nc)}
}

// send buffers one command; flush sends the buffered commands.
func (c *conn) send(args ...string) {
	fmt.Fprintf(c.w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(c.w, "$%d\r\n%s\r\n", len(a), a)
	}
}

func (c *conn) flush() {
	c.t.Helper()
	c.nc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.w.Flush(); err != nil {
		c.t.Fatalf("redis write: %v", err)
	}
}

// read returns the next reply: int64, string, nil, []any or redisError.
func (c *conn) read() any {
	c.t.Helper()
	c.nc.SetDeadline(time.Now().Add(5 * time.Second))
	v, err := readValue(c.r)
	if err != nil {
		c.t.Fatalf("redis read: %v", err)
	}
	return v
}

// do sends one command and returns its reply.
func (c *conn) do(args ...string) any {
	c.t.Helper()
	c.send(args...)
	c.flush()
	return c.read()
}

func readValue(r *bufio.Reader) (any, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("bad reply line %q", line)
	}
	kind, body := line[0], string(line[1:len(line)-2])
	switch kind {
	case '+':
		return body, nil
	case '-':
		return redisError(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		vs := make([]any, n)
		for i := range vs {
			if vs[i], err = readValue(r); err != nil {
				return nil, err
			}
		}
		return vs, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}

// ints converts a script's reply to its integers: five, or six for
// takelease.
func ints(v any) ([]int64, error) {
	if err, ok := v.(redisError); ok {
		return nil, err
	}
	vs, ok := v.([]any)
	if !ok || len(vs) != 5 && len(vs) != 7 { // 7: takelease
		return nil, fmt.Errorf("reply %#v, want 5 or 7 integers", v)
	}
	out := make([]int64, len(vs))
	for i, x := range vs {
		n, ok := x.(int64)
		if !ok {
			return nil, errors.New("reply element " + fmt.Sprint(x) + " is not an integer")
		}
		out[i] = n
	}
	return out, nil
}
