package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rld/rld/decisions"
	"github.com/rld/rld/derive"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/wire"
)

// readBufSize is a connection's read buffer: room for many typical frames,
// so a pipelining client is served in large batches. A frame that does not
// fit (one carrying a request's attributes at their limits) grows it to
// maxReadBufSize, for the rest of the connection.
const (
	readBufSize    = 32 << 10
	maxReadBufSize = 2 * wire.MaxFrame
)

// outBufSize is the initial size of a connection's answer buffer; it grows
// to hold the answers of one batch.
const outBufSize = 8 << 10

// conn serves one client connection. Its read loop runs on one goroutine;
// with Redis, the connection's workers answer frames alongside it (see
// concurrent).
type conn struct {
	d   *Daemon
	c   *net.UnixConn
	in  []byte // read buffer; in[start:end] holds unprocessed bytes
	out []byte // the read loop's answers not yet written
	fs  frameState
	// writeDeadline is the write deadline in force; only the writer of
	// the moment (the read loop, or the one holding writing) uses it.
	writeDeadline time.Time

	// With Redis (concurrent), the read loop answers at once the frames
	// the host decides (a lease, a denial in force: policy.TryCheckTo);
	// a frame that waits on Redis is copied into a frameState of its own
	// and handed to the connection's workers, and its answer is written
	// when its decision is ready, out of order, while the read loop goes
	// on. Answers reach the socket one write at a time: whoever has some
	// to write and finds no write in progress writes them, with those
	// added to pending meanwhile; the others append to pending and go on.
	concurrent bool
	// pipelining is set once a read brings more than one frame, or a
	// frame and the start of the next: the client sends requests before
	// it has its answers. Until then a frame that waits on Redis is
	// decided on the read loop, which has nothing else to answer or read
	// meanwhile, saving two goroutine hand-offs per request; no frame is
	// then waiting on a worker. Read loop only.
	pipelining bool
	jobs       chan *frameState // feeds the workers; nil until the first hand-off
	nworkers   int              // workers started; read loop only
	workers    sync.WaitGroup   // the running workers

	mu sync.Mutex // guards the fields below
	// cond is signalled (on mu) when waiting falls, a write ends or a
	// write takes pending: the read loop waits on it for room or for the
	// answers it handed off.
	cond    sync.Cond
	pending []byte        // answers waiting for the writer
	spare   []byte        // the buffer pending is swapped with for a write
	writing bool          // a write is in progress
	failed  bool          // a write failed: nothing more is written
	waiting int           // frames handed off and not yet answered
	free    []*frameState // frameStates of answered hand-offs, for reuse
}

// frameState is what answering one frame needs; it is reused.
type frameState struct {
	req wire.Request
	// in holds req's descriptors as package descriptor's type: a
	// scratch slice, reused from frame to frame.
	in []descriptor.Descriptor
	// descs are the descriptors decided on: in, or those derived from
	// its attributes by dv (oversize: the request is refused).
	descs    []descriptor.Descriptor
	oversize bool
	dv       *derive.Deriver
	ds       derive.Scratch
	res      wire.Response
	dec      policy.Decision
	sc       policy.Scratch
	obs      *decisions.Observer
	os       decisions.Scratch
	out      []byte // a handed-off frame's answer

	// A frame handed to a worker: a copy of it (its request's fields
	// point into it, never into the read buffer), and what deciding it
	// needs.
	frame []byte
	ctx   context.Context
	p     *policy.Policy
	now   time.Time
}

func newFrameState(obs *decisions.Observer) frameState {
	return frameState{
		req: wire.Request{Descs: make([]wire.Descriptor, 0, wire.MaxDescriptors)},
		in:  make([]descriptor.Descriptor, 0, descriptor.MaxDescriptors),
		sc:  policy.Scratch{Batch: true}, // counted when the answers are written
		obs: obs,
	}
}

func (d *Daemon) newConn(c *net.UnixConn) *conn {
	cn := &conn{
		d:          d,
		c:          c,
		in:         make([]byte, readBufSize),
		out:        make([]byte, 0, outBufSize),
		fs:         newFrameState(d.ops.obs),
		concurrent: d.fleet != nil,
	}
	cn.cond.L = &cn.mu
	return cn
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
	defer cn.finish()
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
			if end == len(cn.in) && len(cn.in) < maxReadBufSize {
				// A frame larger than the buffer (its length was
				// checked against wire.MaxFrame): make room for it.
				cn.in = append(cn.in, make([]byte, maxReadBufSize-len(cn.in))...)
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
// start. lost is true when framing is lost, or an answer could not be
// written, and the connection must close.
func (cn *conn) process(ctx context.Context, now time.Time, start, end, maxInflight int) (int, bool) {
	live := cn.d.live.Load() // the policy and deriver of one configuration
	p := live.policy
	cn.fs.dv = live.deriver
	served := 0
	defer func() { framesServed.Add(served) }()
	for {
		frame, n, err := wire.Next(cn.in[start:end])
		if err != nil {
			// Framing is lost. The frames handed off are answered
			// first; then the request id, when the header is there to
			// read; then the connection closes.
			if cn.concurrent {
				cn.settle()
			}
			code := wire.CodeOf(err)
			countFrameError(code)
			if h, herr := wire.ParseHeader(cn.in[start:end]); herr == nil || len(cn.in[start:end]) >= wire.HeaderSize {
				cn.appendError(h.Op, h.ID, code, err.Error())
			}
			return end, true
		}
		if frame == nil {
			if start < end && served > 0 {
				cn.pipelining = true
			}
			return start, false
		}
		start += n
		served++
		if served > 1 {
			cn.pipelining = true
		}
		if wire.Op(frame[5]) == wire.OpAdmin {
			// Admin frames are rare: answered in order, inline, after
			// the frames before them and before those after them.
			if cn.concurrent && !cn.settle() {
				return end, true
			}
			cn.out = cn.d.answerAdmin(ctx, cn.c, frame, cn.out)
			if cn.concurrent && !cn.flush() {
				return end, true
			}
		} else if cn.concurrent {
			var ok bool
			cn.out, ok = cn.fs.answerLocal(ctx, p, now, frame, cn.out)
			switch {
			case ok:
			case !cn.pipelining && start == end:
				// One request at a time, and this read brought only it.
				cn.fs.decideOn(ctx, p, now)
				cn.out = cn.fs.respond(p, now, cn.out)
			case !cn.handOff(ctx, p, now, frame, maxInflight):
				return end, true
			}
		} else {
			cn.out = cn.fs.answer(ctx, p, now, frame, cn.out)
		}
		if served%maxInflight == 0 && !cn.flush() {
			return end, true
		}
	}
}

// handOff gives frame, which waits on Redis, to a worker: copied into a
// frameState of its own, so that the read buffer can be reused. With
// maxInflight frames already waiting, it first writes the answers at hand
// and waits for room (the read loop reads nothing meanwhile). It reports
// false when an answer could not be written.
func (cn *conn) handOff(ctx context.Context, p *policy.Policy, now time.Time, frame []byte, maxInflight int) bool {
	cn.mu.Lock()
	if cn.waiting >= maxInflight {
		cn.mu.Unlock()
		if !cn.flush() {
			return false
		}
		cn.mu.Lock()
		for cn.waiting >= maxInflight {
			cn.cond.Wait()
		}
	}
	var fs *frameState
	if n := len(cn.free); n > 0 {
		fs = cn.free[n-1]
		cn.free[n-1] = nil
		cn.free = cn.free[:n-1]
	}
	cn.waiting++
	cn.mu.Unlock()
	if fs == nil {
		fs = new(frameState)
		*fs = newFrameState(cn.d.ops.obs)
	}
	fs.frame = append(fs.frame[:0], frame...)
	if err := wire.DecodeRequest(fs.frame, &fs.req); err != nil {
		panic("BUG: a frame decoded once does not decode again: " + err.Error())
	}
	fs.dv = cn.fs.dv
	fs.deriveDescs(now)
	fs.ctx, fs.p, fs.now = ctx, p, now
	if cn.jobs == nil {
		cn.jobs = make(chan *frameState)
	}
	select {
	case cn.jobs <- fs:
	default:
		// Every worker is busy: start one, up to one per frame that
		// may wait (a worker between two frames may take this one).
		if cn.nworkers < maxInflight {
			cn.nworkers++
			cn.workers.Add(1)
			go cn.work()
		}
		cn.jobs <- fs
	}
	return true
}

// keptFrame is the largest copy of a frame a frameState keeps for reuse:
// typical frames fit, and max_inflight states holding frames of up to
// wire.MaxFrame each would hold far more memory than a connection needs.
const keptFrame = 4 << 10

// work decides the frames handed off, and delivers their answers, until
// the connection ends.
func (cn *conn) work() {
	defer cn.workers.Done()
	for fs := range cn.jobs {
		fs.decide()
		fs.sc.Flush() // the checks are counted before their answers can be seen
		read := fs.now
		fs.ctx, fs.p = nil, nil
		cn.deliver(fs) // fs may be reused from here on
		checkDuration.UpdateDuration(read)
	}
}

// deliver queues the answer in fs.out for writing, gives fs back for
// reuse, and writes what is pending unless a write is in progress (whose
// writer then writes it).
func (cn *conn) deliver(fs *frameState) {
	cn.mu.Lock()
	if !cn.failed {
		cn.pending = append(cn.pending, fs.out...)
	}
	if cap(fs.frame) > keptFrame {
		fs.frame = nil // a rare large frame's copy is not kept
	}
	cn.free = append(cn.free, fs)
	cn.waiting--
	cn.cond.Signal()
	if !cn.writing {
		cn.writePending()
	}
	cn.mu.Unlock()
}

// writePending writes pending, and what is added to it meanwhile, until
// it is empty or a write fails. It is called with mu held and no write in
// progress; mu is released during each write.
func (cn *conn) writePending() {
	cn.writing = true
	for len(cn.pending) > 0 && !cn.failed {
		buf := cn.pending
		cn.pending = cn.spare[:0]
		cn.cond.Signal() // pending has room again
		cn.mu.Unlock()
		err := cn.write(buf)
		cn.mu.Lock()
		cn.spare = buf[:0]
		if err != nil {
			cn.fail()
		}
	}
	cn.writing = false
	cn.cond.Signal()
}

// fail records, with mu held, that an answer could not be written: the
// connection is done. Its read side is shut so that a read loop waiting
// for the client's next bytes returns and closes it.
func (cn *conn) fail() {
	if cn.failed {
		return
	}
	cn.failed = true
	cn.pending = cn.pending[:0]
	_ = cn.c.CloseRead()
}

// settle writes the read loop's answers, then waits until every frame
// handed off is answered (its answer queued behind them). It reports
// whether the answers could be written.
func (cn *conn) settle() bool {
	ok := cn.flush()
	return cn.waitAnswered() && ok
}

// waitAnswered waits until every frame handed off is answered (its answer
// written or queued for writing); it reports whether no write failed.
func (cn *conn) waitAnswered() bool {
	cn.mu.Lock()
	for cn.waiting > 0 {
		cn.cond.Wait()
	}
	ok := !cn.failed
	cn.mu.Unlock()
	return ok
}

// finish ends a connection's work before it closes: every frame handed off
// is answered and written (or its write failed), then the workers end.
func (cn *conn) finish() {
	if cn.jobs == nil {
		return
	}
	cn.mu.Lock()
	for cn.waiting > 0 || cn.writing {
		cn.cond.Wait()
	}
	cn.mu.Unlock()
	close(cn.jobs)
	cn.workers.Wait()
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
	fs.deriveDescs(now)
	fs.decideOn(ctx, p, now)
	return fs.respond(p, now, out)
}

// answerLocal appends to out the answer to frame when it needs no wait (a
// malformed frame, a ping, a check the host decides: see
// policy.TryCheckTo) and reports true. When not, it reports false with out
// unchanged, having decided nothing: the frame goes to a worker.
func (fs *frameState) answerLocal(ctx context.Context, p *policy.Policy, now time.Time, frame, out []byte) ([]byte, bool) {
	req := &fs.req
	if err := wire.DecodeRequest(frame, req); err != nil {
		code := wire.CodeOf(err)
		countFrameError(code)
		return fs.appendError(out, req.Op, req.ID, code, err.Error()), true
	}
	if req.Op == wire.OpPing {
		fs.res = wire.Response{Op: req.Op, ID: req.ID}
		return wire.AppendResponse(out, &fs.res), true
	}
	switch req.Op {
	case wire.OpRelease, wire.OpSettle:
		return out, false // store calls: decided off the read loop
	}
	fs.deriveDescs(now)
	switch {
	case fs.oversize:
		fs.decideOn(ctx, p, now)
	case req.Op == wire.OpAcquire:
		lease, ok := p.TryAcquireTo(ctx, &policy.Request{Now: now, Descs: fs.descs, Cost: int64(req.Cost)}, &fs.sc, &fs.dec)
		if !ok {
			return out, false
		}
		fs.res.Token = lease
	default:
		pr := policy.Request{Now: now, Descs: fs.descs, Cost: int64(req.Cost), Peek: req.Op == wire.OpPeek}
		if !p.TryCheckTo(ctx, &pr, &fs.sc, &fs.dec) {
			return out, false
		}
	}
	return fs.respond(p, now, out), true
}

// deriveDescs sets fs.descs to the descriptors of fs.req: derived from
// its attributes when it carries any.
func (fs *frameState) deriveDescs(now time.Time) {
	fs.in = appendDescriptors(fs.in[:0], fs.req.Descs)
	r := fs.dv.Derive(fs.in, now, &fs.ds)
	fs.descs, fs.oversize = r.Descs, r.Oversize
}

// appendDescriptors appends the decoded descriptors src to dst, as
// package descriptor's type (the same pairs of slices: nothing is
// copied but the slice headers).
func appendDescriptors(dst []descriptor.Descriptor, src []wire.Descriptor) []descriptor.Descriptor {
	for i := range src {
		dst = append(dst, descriptor.Descriptor(src[i]))
	}
	return dst
}

// RuleOversize is the rule that refuses a request whose target was too
// long to be sent whole (derive.Result.Oversize).
const RuleOversize = "oversize"

// oversizeDecision refuses such a request.
var oversizeDecision = policy.Decision{Status: policy.StatusBlocked, Rule: RuleOversize}

// decide answers the request handed off in fs, waiting on the stores as
// needed, to fs.out.
func (fs *frameState) decide() {
	fs.decideOn(fs.ctx, fs.p, fs.now)
	fs.out = fs.respond(fs.p, fs.now, fs.out[:0])
}

// decideOn decides fs.req, a CHECK, PEEK, ACQUIRE, RELEASE or SETTLE, into fs.dec
// (and an ACQUIRE's lease into fs.res.Token).
func (fs *frameState) decideOn(ctx context.Context, p *policy.Policy, now time.Time) {
	req := &fs.req
	switch {
	case fs.oversize && req.Op != wire.OpRelease && req.Op != wire.OpSettle:
		fs.dec = oversizeDecision
		fs.res.Token = nil
	case req.Op == wire.OpAcquire:
		fs.res.Token = p.AcquireTo(ctx, &policy.Request{Now: now, Descs: fs.descs, Cost: int64(req.Cost)}, &fs.sc, &fs.dec)
	case req.Op == wire.OpRelease:
		fs.dec = p.Release(ctx, now, req.Token)
	case req.Op == wire.OpSettle:
		fs.dec = p.Settle(ctx, now, req.Token, int64(req.Cost))
	default:
		p.CheckTo(ctx, &policy.Request{Now: now, Descs: fs.descs, Cost: int64(req.Cost), Peek: req.Op == wire.OpPeek}, &fs.sc, &fs.dec)
	}
}

// respond appends the answer of fs's request, decided by p at now, to
// out; the decision of a check or an acquire is observed first.
func (fs *frameState) respond(p *policy.Policy, now time.Time, out []byte) []byte {
	if fs.req.Op == wire.OpCheck || fs.req.Op == wire.OpAcquire {
		fs.obs.Observe(p, &fs.dec, fs.descs, now, &fs.os)
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

// flush writes the read loop's answers; it reports whether the write
// succeeded. With workers (concurrent), a write in progress takes them
// along instead, unless more than maxPending bytes are already pending:
// then flush waits for room, so that a client that does not read its
// answers holds up its read loop rather than growing the buffer.
func (cn *conn) flush() bool {
	// The checks are counted before their answers can be seen.
	cn.fs.sc.Flush()
	if !cn.concurrent {
		if len(cn.out) == 0 {
			return true
		}
		err := cn.write(cn.out)
		cn.out = cn.out[:0]
		return err == nil
	}
	if len(cn.out) == 0 {
		return true
	}
	cn.mu.Lock()
	switch {
	case cn.failed:
	case !cn.writing && len(cn.pending) == 0:
		// The usual case: no answer of a worker to write with these.
		cn.writing = true
		cn.mu.Unlock()
		err := cn.write(cn.out)
		cn.mu.Lock()
		if err != nil {
			cn.fail()
		}
		cn.writePending() // those delivered during the write
	default:
		cn.pending = append(cn.pending, cn.out...)
		if !cn.writing {
			cn.writePending()
		}
		for cn.writing && len(cn.pending) > maxPending && !cn.failed {
			cn.cond.Wait()
		}
	}
	ok := !cn.failed
	cn.mu.Unlock()
	cn.out = cn.out[:0]
	return ok
}

// maxPending bounds the answers a connection's read loop adds to pending
// while a write is in progress (see flush).
const maxPending = readBufSize

// write writes b to the client; only one write is in progress at a time.
func (cn *conn) write(b []byte) error {
	// The write deadline moves only once it is half spent: moving it costs
	// a lock and a timer update on every batch.
	if now := time.Now(); cn.writeDeadline.Sub(now) < writeTimeout/2 {
		cn.writeDeadline = now.Add(writeTimeout)
		_ = cn.c.SetWriteDeadline(cn.writeDeadline)
	}
	_, err := cn.c.Write(b)
	if err != nil {
		// As a slow reader's close is: the client is gone, or did not
		// read its answers within the write deadline.
		cn.d.log.Debug("closing connection: its answers could not be written", slog.Any("error", err))
	}
	return err
}

// writeTimeout bounds a write to a client that does not read its answers;
// since the deadline moves only once half spent, such a client is dropped
// after between writeTimeout/2 and writeTimeout.
const writeTimeout = 10 * time.Second
