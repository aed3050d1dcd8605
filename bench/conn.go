package main

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rld/rld/wire"
)

// target is one system under test. Every connection of a run is opened
// with dial before the load starts.
type target interface {
	dial() (conn, error)
}

// conn is one connection to a target, driven by two goroutines: the
// sender calls queue and flush, the receiver calls recv. close may be
// called from any goroutine, more than once; it makes a blocked flush or
// recv return.
type conn interface {
	// queue adds the request with this id, for key number key, to the
	// next flush.
	queue(id uint32, key int) error
	// flush sends the queued requests.
	flush() error
	// recv waits for answers and calls fn for each answer available, in
	// arrival order. The answer is valid only during the call.
	recv(fn func(*answer)) error
	close() error
}

// answer is one response as a conn reports it.
type answer struct {
	at     int64 // when it arrived, in nanotime
	id     uint32
	status wire.Status
	code   wire.Code // for StatusError
	msg    []byte    // error detail, if any
}

// epoch is the origin of nanotime.
var epoch = time.Now()

// nanotime returns monotonic nanoseconds since the program started. It
// does not allocate.
func nanotime() int64 { return int64(time.Since(epoch)) }

// Buffer sizes of a wireConn.
const (
	readBufSize  = 64 << 10
	writeBufSize = 16 << 10
)

// socketTarget is a target speaking rld's protocol on a Unix socket: rld
// itself, or the echo server.
type socketTarget struct {
	path string
	tmpl *template
	cost uint32
}

func (t *socketTarget) dial() (conn, error) {
	c, err := net.DialTimeout("unix", t.path, dialTimeout)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to %s: %w", t.path, err)
	}
	return newWireConn(c, t.tmpl, t.cost), nil
}

// dialTimeout bounds the connection of a conn.
const dialTimeout = 5 * time.Second

// wireConn is a conn speaking rld's protocol: requests are encoded into
// one reused buffer and written together by flush; answers are decoded
// from one reused read buffer. Neither side allocates per request.
type wireConn struct {
	c         net.Conn
	closeOnce sync.Once

	// Sender side.
	tmpl    *template
	req     wire.Request
	scratch []byte // the descriptor values of req
	out     []byte

	// Receiver side.
	in         []byte
	start, end int // the unread bytes of in
	res        wire.Response
	ans        answer
}

func newWireConn(c net.Conn, tmpl *template, cost uint32) *wireConn {
	return &wireConn{
		c:       c,
		tmpl:    tmpl,
		req:     wire.Request{Op: wire.OpCheck, Cost: cost, Descs: make([]wire.Descriptor, 0, wire.MaxDescriptors)},
		scratch: make([]byte, 0, 256),
		out:     make([]byte, 0, writeBufSize),
		in:      make([]byte, readBufSize),
	}
}

func (w *wireConn) queue(id uint32, key int) error {
	w.req.ID = id
	w.scratch, w.req.Descs = w.tmpl.expand(key, w.scratch, w.req.Descs)
	w.out = wire.AppendRequest(w.out, &w.req)
	return nil
}

func (w *wireConn) flush() error {
	if len(w.out) == 0 {
		return nil
	}
	_, err := w.c.Write(w.out)
	w.out = w.out[:0]
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

func (w *wireConn) recv(fn func(*answer)) error {
	if w.end == len(w.in) { // a frame fills the buffer: never, frames are ≤ MaxFrame
		return errors.New("read buffer full")
	}
	n, err := w.c.Read(w.in[w.end:])
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	w.ans.at = nanotime()
	w.end += n
	for {
		f, n, err := wire.Next(w.in[w.start:w.end])
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if f == nil {
			break
		}
		w.start += n
		if err := wire.DecodeResponse(f, &w.res); err != nil {
			return fmt.Errorf("decode answer to request %d: %w", w.res.ID, err)
		}
		w.ans.id, w.ans.status, w.ans.code, w.ans.msg = w.res.ID, w.res.Status, w.res.Code, w.res.Message
		if w.res.Flags&wire.FlagDegraded != 0 && w.res.Status == wire.StatusAllowed {
			w.ans.status = wire.StatusAllowedDegraded
		}
		fn(&w.ans)
	}
	w.end = copy(w.in, w.in[w.start:w.end])
	w.start = 0
	return nil
}

func (w *wireConn) close() error {
	var err error
	w.closeOnce.Do(func() { err = w.c.Close() })
	return err
}
