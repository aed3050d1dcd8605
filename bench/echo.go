package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/rld/rld/wire"
)

// benchRule is the name of the spawned daemon's rule; the echo server's
// answers carry it too, so that they have the size of rld's.
const benchRule = "bench"

// echoAnswer is the echo server's answer, but for the id: an allowed
// CHECK decided by the rule benchRule, the size of rld's typical answer.
var echoAnswer = wire.AppendResponse(nil, &wire.Response{
	Op: wire.OpCheck, Status: wire.StatusAllowed, Limit: 1_000_000_000, Remaining: 999_999_999,
	ResetMs: 1, WindowMs: 1000, Quota: 1_000_000_000, QuotaWindowMs: 1000, NextMs: 0, Rule: []byte(benchRule),
})

// serveEcho answers every connection of ln with serveEchoConn until ln
// is closed.
func serveEcho(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("echo: accept: %w", err)
		}
		go serveEchoConn(c)
	}
}

// serveEchoConn is the physical floor of the benchmark: it reads request
// frames as rld does (one read, every complete frame in it) and answers
// each with echoAnswer carrying the request's op and id, writing the answers of
// one read at once, as rld does. It does no other work.
func serveEchoConn(c net.Conn) {
	defer c.Close()
	in := make([]byte, readBufSize)
	out := make([]byte, 0, writeBufSize)
	start, end := 0, 0
	for {
		n, err := c.Read(in[end:])
		if err != nil {
			return
		}
		end += n
		for {
			f, n, err := wire.Next(in[start:end])
			if err != nil {
				return // framing lost
			}
			if f == nil {
				break
			}
			start += n
			out = append(out, echoAnswer...)
			a := out[len(out)-len(echoAnswer):]
			a[5] = f[5] | byte(wire.OpResponse)
			copy(a[8:wire.HeaderSize], f[8:wire.HeaderSize]) // the id
		}
		if len(out) > 0 {
			if _, err := c.Write(out); err != nil {
				return
			}
			out = out[:0]
		}
		end = copy(in, in[start:end])
		start = 0
	}
}

// echoMain is `rld-bench echo -socket PATH`: the echo server as a process
// of its own, as the daemon is. -spawn starts it. It stops on SIGINT or
// SIGTERM.
func echoMain(path string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-sig; ln.Close() }()
	return serveEcho(ln)
}
