// Package client is the Go client of rld: it sends checks over the daemon's
// Unix socket, pipelining the calls of many goroutines over one connection.
package client

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rld/rld/header"
	"github.com/rld/rld/header/wireheader"
	"github.com/rld/rld/wire"
)

// DefaultSocket is the daemon's default socket path.
const DefaultSocket = "/run/rld/rld.sock"

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("rld client: closed")

// ErrConnLost is returned for a call whose connection broke before its
// answer arrived. The request may or may not have been counted; the next
// call reconnects.
var ErrConnLost = errors.New("rld client: connection lost")

// ErrTooLarge is returned, without sending anything, for a request that
// breaks the protocol's limits: too many descriptors, an empty or too long
// name, a frame over wire.MaxFrame, or a lease (of Release or Settle) that
// is empty or longer than wire.MaxTokenLen. A value longer than its limit
// is no error: it is sent as its digest (wire.AppendValue), as every
// client sends it.
var ErrTooLarge = errors.New("rld client: request breaks the protocol limits")

// Descriptor is one (name, value) pair of a check, such as
// {"api_key", "sk_123"}.
type Descriptor struct {
	Name, Value string
}

// Result is the daemon's answer to a check.
type Result struct {
	Status     wire.Status
	Limit      uint64        // the deciding limit's capacity (its burst, when it has one)
	Remaining  uint64        // units left after this check
	Reset      time.Duration // until the limit is fully replenished
	RetryAfter time.Duration // 0 unless limited
	Window     time.Duration // the deciding limit's period; 0 when none applied
	// Quota is the sustained units per QuotaWindow: a client spacing its
	// requests evenly at that rate is never refused (RateLimit-Policy's
	// q); 0 when no limit applied.
	Quota       uint64
	QuotaWindow time.Duration // the window of Quota (RateLimit-Policy's w)
	// Next is the time until quota comes back, within which no more than
	// Remaining units can be used (RateLimit's t); negative when the
	// daemon does not know it.
	Next     time.Duration
	Rule     string // the rule that decided; "" when none applied
	Degraded bool   // decided on local state only
	// Lease is, for Acquire, what Release takes to give the concurrency
	// slots back and Settle to correct the cost; "" when the acquire
	// took nothing (denied, or no rule counted it).
	Lease string
}

// Allowed reports whether the request may go through. A Result returned
// with an error is the zero Result, which is allowed: check the error
// first, and choose there whether to fail open or closed.
func (r Result) Allowed() bool { return r.Status.Allowed() }

// Answer returns r as header.Answer, whose AppendFields renders the HTTP
// header fields the daemon's HTTP endpoint renders for the same decision.
func (r Result) Answer() header.Answer {
	return header.Answer{
		Rule: r.Rule, Limit: r.Limit, Quota: r.Quota, QuotaWindow: r.QuotaWindow,
		Remaining: r.Remaining, Window: r.Window, Reset: r.Reset, Retry: r.RetryAfter, Next: r.Next,
	}
}

// ResponseError is the daemon's error answer to a request.
type ResponseError struct {
	Code    wire.Code
	Message string
}

// Error returns the code's name and the daemon's message.
func (e *ResponseError) Error() string {
	return fmt.Sprintf("rld: %s: %s", e.Code, e.Message)
}

// Client is a connection to an rld daemon. It is safe for concurrent use:
// calls from many goroutines share one connection and are pipelined. After
// the daemon restarts, the next call reconnects.
type Client struct {
	path   string
	nextID atomic.Uint32

	mu     sync.Mutex // guards cur and closed
	cur    *conn
	closed bool
}

// New returns a client of the daemon at socket path. It connects on the
// first call.
func New(path string) *Client {
	return &Client{path: path}
}

// Dial returns a client connected to the daemon at socket path.
func Dial(ctx context.Context, path string) (*Client, error) {
	c := New(path)
	if _, err := c.conn(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Close closes the connection; calls in flight fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.cur != nil {
		c.cur.fail(ErrClosed)
		c.cur = nil
	}
	return nil
}

// Check asks whether a request with these descriptors may go through,
// consuming cost units when it may. Cost 0 means 1.
func (c *Client) Check(ctx context.Context, descs []Descriptor, cost uint32) (Result, error) {
	return c.do(ctx, wire.OpCheck, descs, cost)
}

// Peek answers like Check but consumes nothing.
func (c *Client) Peek(ctx context.Context, descs []Descriptor, cost uint32) (Result, error) {
	return c.do(ctx, wire.OpPeek, descs, cost)
}

// Acquire answers like Check (the rate rules take cost units, 0 meaning
// 1), and the concurrency rules that apply hold one slot each until
// Release (or Settle) of the Result's Lease, or until their timeout:
// release them when the request is done, whatever its outcome. A call
// whose ctx ends before the answer may still have taken slots, which are
// then held until their timeout.
func (c *Client) Acquire(ctx context.Context, descs []Descriptor, cost uint32) (Result, error) {
	return c.do(ctx, wire.OpAcquire, descs, cost)
}

// Release gives back the concurrency slots that Acquire's Result.Lease
// names, and leaves the rate rules as the acquire took them (it does not
// settle them: a later Settle still corrects them once). A lease whose
// slots are gone (released or settled already, or expired: the rule's
// timeout passed) is a *ResponseError with code wire.CodeNotFound, and
// changes nothing. The Result describes the last limit that got slots
// back, after the release; a lease that never held a slot (only rate
// rules counted its acquire) releases nothing and is allowed with no
// rule.
func (c *Client) Release(ctx context.Context, lease string) (Result, error) {
	if len(lease) == 0 || len(lease) > wire.MaxTokenLen {
		return Result{}, fmt.Errorf("%w: a lease of %d bytes, want 1 to %d", ErrTooLarge, len(lease), wire.MaxTokenLen)
	}
	return c.call(ctx, wire.OpRelease, nil, 0, lease)
}

// Settle ends the request that Acquire's Result.Lease names, whose cost
// was an estimate, at its actual cost (0 means 1): the rate rules'
// units are corrected by the difference (charged beyond the estimate,
// which may put a key in debt, or refunded below it), and its
// concurrency slots go back. A lease is settled once; an unknown one
// (settled already, acquired more than 10 minutes ago, or one that no
// rate rule counted and that was released already) is a *ResponseError
// with code wire.CodeNotFound, and changes nothing. A Release does not
// settle: a Settle after it still corrects the rate rules once.
func (c *Client) Settle(ctx context.Context, lease string, actual uint32) (Result, error) {
	if len(lease) == 0 || len(lease) > wire.MaxTokenLen {
		return Result{}, fmt.Errorf("%w: a lease of %d bytes, want 1 to %d", ErrTooLarge, len(lease), wire.MaxTokenLen)
	}
	return c.call(ctx, wire.OpSettle, nil, actual, lease)
}

// Ping checks that the daemon answers.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.do(ctx, wire.OpPing, nil, 0)
	return err
}

func (c *Client) conn(ctx context.Context) (*conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.cur != nil && !c.cur.broken() {
		return c.cur, nil
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.path)
	if err != nil {
		return nil, fmt.Errorf("rld client: cannot connect to %q: %w", c.path, err)
	}
	cn := &conn{nc: nc, pending: make(map[uint32]chan answer)}
	go cn.readLoop()
	c.cur = cn
	return cn, nil
}

func (c *Client) do(ctx context.Context, op wire.Op, descs []Descriptor, cost uint32) (Result, error) {
	if err := checkLimits(descs); err != nil {
		return Result{}, err
	}
	return c.call(ctx, op, descs, cost, "")
}

// call sends one request and waits for its answer.
func (c *Client) call(ctx context.Context, op wire.Op, descs []Descriptor, cost uint32, token string) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err // do not spend quota on a call nobody waits for
	}
	cn, err := c.conn(ctx)
	if err != nil {
		return Result{}, err
	}
	id := c.nextID.Add(1)
	ch := make(chan answer, 1)
	if err := cn.send(ctx, id, ch, op, descs, cost, token); err != nil {
		return Result{}, err
	}
	select {
	case a := <-ch:
		return a.res, a.err
	case <-ctx.Done():
		cn.forget(id)
		return Result{}, ctx.Err()
	}
}

// valueLimit returns the limit of a descriptor's value by its name: an
// attribute's (":target", ":h:…", the others), or a descriptor's.
func valueLimit(name string) int {
	switch {
	case name == ":target":
		return wire.MaxTargetLen
	case strings.HasPrefix(name, ":h:"):
		return wire.MaxHeaderLen
	}
	return wire.MaxValueLen
}

// checkLimits rejects a request the daemon would refuse, so that one bad
// call does not cost the other calls sharing the connection.
func checkLimits(descs []Descriptor) error {
	if len(descs) > wire.MaxDescriptors {
		return fmt.Errorf("%w: %d descriptors, at most %d", ErrTooLarge, len(descs), wire.MaxDescriptors)
	}
	size := wire.HeaderSize + 5
	for _, d := range descs {
		if len(d.Name) == 0 || len(d.Name) > wire.MaxNameLen {
			return fmt.Errorf("%w: descriptor name %.20q is empty or longer than %d bytes", ErrTooLarge, d.Name, wire.MaxNameLen)
		}
		size += 3 + len(d.Name) + min(len(d.Value), valueLimit(d.Name), wire.DigestLen)
	}
	if size > wire.MaxFrame {
		return fmt.Errorf("%w: %d-byte frame, at most %d", ErrTooLarge, size, wire.MaxFrame)
	}
	return nil
}

// writeTimeout bounds a write to the daemon: one that takes longer breaks
// the connection.
const writeTimeout = 5 * time.Second

type answer struct {
	res Result
	err error
}

// conn is one connection with its pending calls.
type conn struct {
	nc net.Conn

	wmu      sync.Mutex // guards wbuf, spare, writing
	wbuf     []byte     // requests not yet written
	spare    []byte
	writing  bool
	reqDescs []wire.Descriptor

	pmu     sync.Mutex // guards pending and err
	pending map[uint32]chan answer
	err     error
}

func (cn *conn) broken() bool {
	cn.pmu.Lock()
	defer cn.pmu.Unlock()
	return cn.err != nil
}

// send registers ch for id and writes the request. Writes are grouped: a
// caller that finds another one writing leaves its request in the buffer
// for that writer, so concurrent calls share syscalls.
func (cn *conn) send(ctx context.Context, id uint32, ch chan answer, op wire.Op, descs []Descriptor, cost uint32, token string) error {
	cn.pmu.Lock()
	if cn.err != nil {
		err := cn.err
		cn.pmu.Unlock()
		return err
	}
	cn.pending[id] = ch
	cn.pmu.Unlock()

	cn.wmu.Lock()
	cn.reqDescs = cn.reqDescs[:0]
	for _, d := range descs {
		v := []byte(d.Value)
		if limit := valueLimit(d.Name); len(v) > limit {
			v = wire.AppendValue(nil, v, limit) // a long value is sent as its digest
		}
		cn.reqDescs = append(cn.reqDescs, wire.Descriptor{Name: []byte(d.Name), Value: v})
	}
	req := wire.Request{Op: op, ID: id, Cost: cost, Descs: cn.reqDescs, Token: []byte(token)}
	cn.wbuf = wire.AppendRequest(cn.wbuf, &req)
	if cn.writing {
		cn.wmu.Unlock()
		return nil
	}
	cn.writing = true
	cn.writeOut(ctx)
	return nil
}

// writeOut writes the buffered requests until none is left; it is called
// with wmu held and writing set, and returns with wmu released. A write
// is bounded by writeTimeout from its start: a daemon that does not read
// must not hold callers forever, and a write that times out has lost the
// framing, so the connection breaks, failing every pending call. The
// writing caller's own context does not bound the shared write, whose
// buffer holds other callers' requests too: when that context ends, the
// caller stops writing and a goroutine writes the rest, so that the
// connection and the other calls live on.
func (cn *conn) writeOut(ctx context.Context) {
	// A context's end wakes a Write blocked on a daemon that reads slowly.
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = cn.nc.SetWriteDeadline(time.Now()) })
		defer stop()
	}
	for len(cn.wbuf) > 0 {
		buf := cn.wbuf
		cn.wbuf = cn.spare[:0]
		cn.wmu.Unlock()
		limit := time.Now().Add(writeTimeout)
		n, err := 0, error(nil)
		for n < len(buf) && ctx.Err() == nil {
			_ = cn.nc.SetWriteDeadline(limit)
			if ctx.Err() != nil {
				break // it ended as the deadline was set: its wake-up is lost
			}
			var m int
			m, err = cn.nc.Write(buf[n:])
			n += m
			if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(limit) {
				err = nil // woken by a context's end, not by the daemon's silence
			}
			if err != nil {
				break
			}
		}
		cn.wmu.Lock()
		if err != nil {
			cn.writing = false
			cn.wbuf = cn.wbuf[:0]
			cn.wmu.Unlock()
			cn.fail(fmt.Errorf("%w: %v", ErrConnLost, err))
			return // the waiters learn the error from fail
		}
		if n < len(buf) {
			// This caller's context ended: what is left of its write goes
			// first, then what other callers queued meanwhile.
			cn.wbuf = append(buf[n:], cn.wbuf...)
			go func() {
				cn.wmu.Lock()
				cn.writeOut(context.Background())
			}()
			cn.wmu.Unlock()
			return
		}
		cn.spare = buf[:0]
	}
	cn.writing = false
	cn.wmu.Unlock()
}

func (cn *conn) forget(id uint32) {
	cn.pmu.Lock()
	delete(cn.pending, id)
	cn.pmu.Unlock()
}

// fail breaks the connection and fails every pending call with err.
func (cn *conn) fail(err error) {
	cn.pmu.Lock()
	if cn.err == nil {
		cn.err = err
	}
	for id, ch := range cn.pending {
		ch <- answer{err: cn.err}
		delete(cn.pending, id)
	}
	cn.pmu.Unlock()
	cn.nc.Close()
}

func (cn *conn) readLoop() {
	br := bufio.NewReaderSize(cn.nc, 64<<10)
	buf := make([]byte, wire.MaxFrame)
	var res wire.Response
	var lastRule string
	for {
		if _, err := io.ReadFull(br, buf[:4]); err != nil {
			cn.fail(fmt.Errorf("%w: %v", ErrConnLost, err))
			return
		}
		if _, _, err := wire.Next(buf[:4]); err != nil { // checks the length field
			cn.fail(fmt.Errorf("rld client: bad frame from daemon: %w", err))
			return
		}
		n := 4 + int(binary.BigEndian.Uint32(buf))
		if _, err := io.ReadFull(br, buf[4:n]); err != nil {
			cn.fail(fmt.Errorf("%w: %v", ErrConnLost, err))
			return
		}
		if err := wire.DecodeResponse(buf[:n], &res); err != nil {
			cn.fail(fmt.Errorf("rld client: bad answer from daemon: %w", err))
			return
		}
		if string(res.Rule) != lastRule {
			lastRule = string(res.Rule)
		}
		// The numbers as header reads them; the rule apart, since
		// wireheader.FromResponse would copy it and lastRule is reused.
		rule := res.Rule
		res.Rule = nil
		ha := wireheader.FromResponse(&res)
		res.Rule = rule
		a := answer{res: Result{
			Status:      res.Status,
			Limit:       ha.Limit,
			Remaining:   ha.Remaining,
			Reset:       ha.Reset,
			RetryAfter:  ha.Retry,
			Window:      ha.Window,
			Quota:       ha.Quota,
			QuotaWindow: ha.QuotaWindow,
			Next:        ha.Next,
			Rule:        lastRule,
			Degraded:    res.Flags&wire.FlagDegraded != 0,
			Lease:       string(res.Token),
		}}
		if res.Status == wire.StatusError {
			a.err = &ResponseError{Code: res.Code, Message: string(res.Message)}
		}
		cn.pmu.Lock()
		ch, ok := cn.pending[res.ID]
		delete(cn.pending, res.ID)
		cn.pmu.Unlock()
		if ok {
			ch <- a
		}
	}
}
