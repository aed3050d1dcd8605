package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rld/rld/policy"
	"github.com/rld/rld/wire"
)

// readBufSize is a connection's read buffer: room for the largest frame
// and then some, so a pipelining client is served in large batches.
const readBufSize = 2 * wire.MaxFrame

// outBufSize is the initial size of a connection's answer buffer; it grows
// to hold the answers of one batch.
const outBufSize = 8 << 10

// conn serves one client connection. It is owned by one goroutine.
type conn struct {
	d   *Daemon
	c   *net.UnixConn
	in  []byte // read buffer; in[start:end] holds unprocessed bytes
	out []byte // answers not yet written
	fs  frameState
	// writeDeadline is the write deadline in force.
	writeDeadline time.Time

	// With Redis, a read batch's frames that the host answers (a lease,
	// a denial in force: policy.TryCheckTo) are answered inline; those
	// that wait on Redis are handed to the connection's workers, so that
	// one does not hold up those behind it and checks of one key share a
	// Redis call. frames collects the batch, slots hold one frameState
	// per frame, and jobs feeds the workers, started as a batch first
	// needs them and kept until the connection ends.
	concurrent bool
	frames     [][]byte
	slots      []frameState
	wg         sync.WaitGroup
	jobs       chan *frameState
	workers    int
}

// frameState is what answering one frame needs; it is reused.
type frameState struct {
	req wire.Request
	res wire.Response
	dec policy.Decision
	sc  policy.Scratch
	obs *observer
	os  obsScratch
	out []byte // a concurrent frame's answer

	// A frame handed to a worker: what deciding it needs.
	ctx context.Context
	p   *policy.Policy
	now time.Time
}

func newFrameState(obs *observer) frameState {
	return frameState{
		req: wire.Request{Descs: make([]wire.Descriptor, 0, wire.MaxDescriptors)},
		sc:  policy.Scratch{Batch: true}, // counted when the answers are written
		obs: obs,
	}
}

func (d *Daemon) newConn(c *net.UnixConn) *conn {
	return &conn{
		d:          d,
		c:          c,
		in:         make([]byte, readBufSize),
		out:        make([]byte, 0, outBufSize),
		fs:         newFrameState(d.ops.obs),
		concurrent: d.fleet != nil,
	}
}

// drainGrace is how long a draining connection waits for more bytes
// before it closes: requests a client wrote before the drain are already
// in the socket buffer, so they are read and answered.
const drainGrace = 50 * time.Millisecond

// serve reads frames until the client closes, framing is lost or the
// daemon drains. Answers are written when no complete frame is left in the
// read buffer (or after max_inflight frames), so a pipelining client gets
// many answers per write.
func (cn *conn) serve(ctx context.Context) {
	defer cn.c.Close()
	defer cn.stopWorkers()
	start, end := 0, 0
	srv := cn.d.cfg().Server
	readTimeout, idleTimeout := time.Duration(srv.ReadTimeout), time.Duration(srv.IdleTimeout)
	maxInflight := srv.MaxInflight
	var partialSince time.Time // when the unfinished frame in in[start:end] began to arrive
	var graceUntil time.Time   // while draining: the end of the grace
	var readDeadline time.Time // the read deadline in force
	for {
		// A frame that has started must finish within readTimeout of its
		// first byte; an idle connection may wait idleTimeout (0: forever).
		var deadline time.Time
		switch {
		case cn.d.draining.Load():
			// One grace from the moment the drain is seen: a client
			// that keeps writing does not hold the shutdown up.
			if graceUntil.IsZero() {
				graceUntil = time.Now().Add(drainGrace)
			}
			deadline = graceUntil
		case end > start && readTimeout > 0:
			deadline = partialSince.Add(readTimeout)
		case end == start && idleTimeout > 0:
			deadline = time.Now().Add(idleTimeout)
		}
		// Setting a deadline takes a lock and moves a runtime timer: skip
		// it when it is the one in force (no deadline, the usual case).
		if !deadline.Equal(readDeadline) {
			if err := cn.c.SetReadDeadline(deadline); err != nil {
				return
			}
			readDeadline = deadline
		}
		if graceUntil.IsZero() && cn.d.draining.Load() {
			continue // the drain began meanwhile: read with its grace
		}
		before := end
		n, err := cn.c.Read(cn.in[end:])
		end += n
		if n > 0 {
			now := time.Now() // one timestamp per read batch
			var lost bool
			start, lost = cn.process(ctx, now, start, end, maxInflight)
			if len(cn.out) > 0 && !cn.flush() {
				return
			}
			if lost {
				return
			}
			checkDuration.UpdateDuration(now)
			if start >= before { // the unfinished frame began in this read
				partialSince = now
			}
			// Move a partial frame to the front of the buffer.
			if start == end {
				start, end = 0, 0
			} else if start > 0 {
				end = copy(cn.in, cn.in[start:end])
				start = 0
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// Woken by the drain's own deadline, which may land
				// after the grace was set: answer what is left.
				if cn.d.draining.Load() && (graceUntil.IsZero() || time.Now().Before(graceUntil)) {
					continue
				}
				if end > start && !cn.d.draining.Load() {
					cn.d.log.Debug("closing slow connection", slog.Int("partial_bytes", end-start))
				}
			}
			return
		}
	}
}

// process answers every complete frame in in[start:end] and returns the new
// start. lost is true when framing is lost and the connection must close.
func (cn *conn) process(ctx context.Context, now time.Time, start, end, maxInflight int) (int, bool) {
	p := cn.d.policy.Load()
	served := 0
	defer func() { framesServed.Add(served) }()
	for {
		frame, n, err := wire.Next(cn.in[start:end])
		if err != nil {
			cn.answerFrames(ctx, p, now)
			// Framing is lost. Answer the request id when the header is
			// there to read, then close.
			code := wire.CodeOf(err)
			countFrameError(code)
			if h, herr := wire.ParseHeader(cn.in[start:end]); herr == nil || len(cn.in[start:end]) >= wire.HeaderSize {
				cn.appendError(h.Op, h.ID, code, err.Error())
			}
			return end, true
		}
		if frame == nil {
			cn.answerFrames(ctx, p, now)
			return start, false
		}
		start += n
		served++
		if wire.Op(frame[5]) == wire.OpAdmin {
			// Admin frames are rare: answered in order, inline, after
			// the frames before them.
			cn.answerFrames(ctx, p, now)
			cn.out = cn.d.answerAdmin(ctx, cn.c, frame, cn.out)
		} else if cn.concurrent {
			cn.frames = append(cn.frames, frame)
		} else {
			cn.out = cn.fs.answer(ctx, p, now, frame, cn.out)
		}
		if served%maxInflight == 0 {
			cn.answerFrames(ctx, p, now)
			if !cn.flush() {
				return end, true
			}
		}
	}
}

// answerFrames answers the frames collected in cn.frames and appends the
// answers to cn.out in the frames' order: inline those the host answers,
// the others on the connection's workers when there are several (see
// conn.jobs).
func (cn *conn) answerFrames(ctx context.Context, p *policy.Policy, now time.Time) {
	n := len(cn.frames)
	switch n {
	case 0:
		return
	case 1:
		cn.out = cn.fs.answer(ctx, p, now, cn.frames[0], cn.out)
	default:
		for len(cn.slots) < n {
			cn.slots = append(cn.slots, newFrameState(cn.d.ops.obs))
		}
		var last *frameState
		for i, f := range cn.frames {
			s := &cn.slots[i]
			if s.answerLocal(ctx, p, now, f) {
				continue
			}
			if last != nil {
				cn.handOff(last)
			}
			s.ctx, s.p, s.now = ctx, p, now
			last = s
		}
		if last != nil {
			last.decide() // the batch's last waiting frame: on this goroutine
		}
		cn.wg.Wait()
		for i := range n {
			s := &cn.slots[i]
			s.ctx, s.p = nil, nil
			cn.out = append(cn.out, s.out...)
		}
	}
	clear(cn.frames) // drop the references to the read buffer
	cn.frames = cn.frames[:0]
}

// handOff gives fs, decoded and waiting on Redis, to a worker, starting
// one when every worker is busy.
func (cn *conn) handOff(fs *frameState) {
	if cn.jobs == nil {
		cn.jobs = make(chan *frameState)
	}
	cn.wg.Add(1)
	select {
	case cn.jobs <- fs:
	default:
		cn.workers++
		go cn.work()
		cn.jobs <- fs
	}
}

// work decides the frames handed off until the connection ends.
func (cn *conn) work() {
	for fs := range cn.jobs {
		fs.decide()
		cn.wg.Done()
	}
}

// stopWorkers ends the connection's workers.
func (cn *conn) stopWorkers() {
	if cn.jobs != nil {
		close(cn.jobs)
	}
}

// answer appends the answer to one complete frame to out.
func (fs *frameState) answer(ctx context.Context, p *policy.Policy, now time.Time, frame, out []byte) []byte {
	req := &fs.req
	if err := wire.DecodeRequest(frame, req); err != nil {
		code := wire.CodeOf(err)
		countFrameError(code)
		return fs.appendError(out, req.Op, req.ID, code, err.Error())
	}
	res := &fs.res
	if req.Op == wire.OpPing {
		*res = wire.Response{Op: req.Op, ID: req.ID, NextMs: wire.NextUnknown}
		return wire.AppendResponse(out, res)
	}
	fs.decideOn(ctx, p, now)
	return fs.respond(p, now, out)
}

// answerLocal writes to fs.out the answer to frame when it needs no wait
// (a malformed frame, a ping, a check the host decides: see
// policy.TryCheckTo) and reports whether it did. When not, fs holds the
// decoded request for decide.
func (fs *frameState) answerLocal(ctx context.Context, p *policy.Policy, now time.Time, frame []byte) bool {
	req := &fs.req
	if err := wire.DecodeRequest(frame, req); err != nil {
		code := wire.CodeOf(err)
		countFrameError(code)
		fs.out = fs.appendError(fs.out[:0], req.Op, req.ID, code, err.Error())
		return true
	}
	if req.Op == wire.OpPing {
		fs.res = wire.Response{Op: req.Op, ID: req.ID}
		fs.out = wire.AppendResponse(fs.out[:0], &fs.res)
		return true
	}
	switch req.Op {
	case wire.OpRelease, wire.OpSettle:
		return false // store calls: decided off the read loop
	case wire.OpAcquire:
		lease, ok := p.TryAcquireTo(ctx, now, req.Descs, int64(req.Cost), &fs.sc, &fs.dec)
		if !ok {
			return false
		}
		fs.res.Token = lease
	default:
		if !p.TryCheckTo(ctx, now, req.Descs, int64(req.Cost), req.Op == wire.OpPeek, &fs.sc, &fs.dec) {
			return false
		}
	}
	fs.out = fs.respond(p, now, fs.out[:0])
	return true
}

// decide answers the request that answerLocal left in fs, waiting on the
// stores as needed, to fs.out.
func (fs *frameState) decide() {
	fs.decideOn(fs.ctx, fs.p, fs.now)
	fs.out = fs.respond(fs.p, fs.now, fs.out[:0])
}

// decideOn decides fs.req, a CHECK, PEEK, ACQUIRE, RELEASE or SETTLE, into fs.dec
// (and an ACQUIRE's lease into fs.res.Token).
func (fs *frameState) decideOn(ctx context.Context, p *policy.Policy, now time.Time) {
	req := &fs.req
	switch req.Op {
	case wire.OpAcquire:
		fs.res.Token = p.AcquireTo(ctx, now, req.Descs, int64(req.Cost), &fs.sc, &fs.dec)
	case wire.OpRelease:
		fs.dec = p.Release(ctx, now, req.Token)
	case wire.OpSettle:
		fs.dec = p.Settle(ctx, now, req.Token, int64(req.Cost))
	default:
		p.CheckTo(ctx, now, req.Descs, int64(req.Cost), req.Op == wire.OpPeek, &fs.sc, &fs.dec)
	}
}

// respond appends the answer of fs's request, decided by p at now, to
// out; a check's decision is observed first.
func (fs *frameState) respond(p *policy.Policy, now time.Time, out []byte) []byte {
	if fs.req.Op == wire.OpCheck {
		fs.obs.observe(p, &fs.dec, fs.req.Descs, now, &fs.os)
	}
	res := &fs.res
	fillResponse(res, &fs.dec)
	fs.dec.Err = nil // not kept past its answer
	res.Op, res.ID = fs.req.Op, fs.req.ID
	out = wire.AppendResponse(out, res)
	res.Token = nil // aliases the Scratch: not kept past its answer
	return out
}

func (fs *frameState) appendError(out []byte, op wire.Op, id uint32, code wire.Code, msg string) []byte {
	fs.res = wire.Response{Op: op &^ wire.OpResponse, ID: id, Status: wire.StatusError, NextMs: wire.NextUnknown,
		Code: code, Message: []byte(msg)}
	return wire.AppendResponse(out, &fs.res)
}

func (cn *conn) appendError(op wire.Op, id uint32, code wire.Code, msg string) {
	cn.out = cn.fs.appendError(cn.out, op, id, code, msg)
}

// flush writes the pending answers; it reports whether the write succeeded.
func (cn *conn) flush() bool {
	// The checks are counted before their answers can be seen.
	cn.fs.sc.Flush()
	for i := range cn.slots {
		cn.slots[i].sc.Flush()
	}
	if len(cn.out) == 0 {
		return true
	}
	// The write deadline moves only once it is half spent: moving it costs
	// a lock and a timer update on every batch.
	if now := time.Now(); cn.writeDeadline.Sub(now) < writeTimeout/2 {
		cn.writeDeadline = now.Add(writeTimeout)
		_ = cn.c.SetWriteDeadline(cn.writeDeadline)
	}
	_, err := cn.c.Write(cn.out)
	cn.out = cn.out[:0]
	return err == nil
}

// writeTimeout bounds a write to a client that does not read its answers;
// since the deadline moves only once half spent, such a client is dropped
// after between writeTimeout/2 and writeTimeout.
const writeTimeout = 10 * time.Second
