package redisx

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDialsWait: a call waits for a set-up to its node (or, with anyAddr,
// to any node) until the set-up's first bytes come back or its deadline
// passes, and not at all for another node's.
func TestDialsWait(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	var d dials
	addr := ln.Addr().String()
	dialCtx, cancelDial := context.WithTimeout(context.Background(), time.Minute) // a call's
	defer cancelDial()
	conn, err := d.dialFn()(dialCtx, addr, &net.Dialer{}, nil)
	require.NoError(t, err)
	defer conn.Close()
	peer := <-accepted
	defer peer.Close()

	assert.NoError(t, d.wait(context.Background(), "127.0.0.1:1"), "another node's set-up")
	for _, key := range []string{addr, anyAddr} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		assert.ErrorIs(t, d.wait(ctx, key), context.DeadlineExceeded, "no answer yet: %q waits to its deadline", key)
		cancel()
	}
	waited := make(chan error, 1)
	go func() { waited <- d.wait(context.Background(), addr) }()
	_, err = peer.Write([]byte("+OK\r\n"))
	require.NoError(t, err)
	buf := make([]byte, 8)
	_, err = conn.Read(buf)
	require.NoError(t, err)
	require.NoError(t, <-waited, "the first bytes end the set-up")
	assert.Zero(t, d.busy.Load())
	assert.NoError(t, d.wait(context.Background(), anyAddr))

	// A set-up that fails ends too.
	_, err = d.dialFn()(dialCtx, "127.0.0.1:1", &net.Dialer{}, nil)
	require.Error(t, err)
	assert.Zero(t, d.busy.Load())
}

// TestDialsDedicated: a dedicated connection's set-up (a subscription's,
// or, in Standalone mode, any dialled with a context that never ends)
// makes no call wait.
func TestDialsDedicated(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // never answers
		}
	}()
	var d dials
	marked, cancelMarked := context.WithTimeout(withDedicatedDial(context.Background()), time.Minute)
	defer cancelMarked()
	for _, ctx := range []context.Context{marked, context.Background()} {
		conn, err := d.dialFn()(ctx, ln.Addr().String(), &net.Dialer{}, nil)
		require.NoError(t, err)
		defer conn.Close()
	}
	assert.Zero(t, d.busy.Load())
	// Where rueidis's refreshes dial with a context that never ends
	// (Cluster, Sentinel), those dials count.
	d.background = true
	conn, err := d.dialFn()(context.Background(), ln.Addr().String(), &net.Dialer{}, nil)
	require.NoError(t, err)
	assert.EqualValues(t, 1, d.busy.Load())
	conn.Close()
	assert.Zero(t, d.busy.Load(), "the close ends it")
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	assert.NoError(t, d.wait(ctx, ln.Addr().String()))
}
