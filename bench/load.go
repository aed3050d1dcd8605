package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/rld/rld/wire"
)

// Load modes (-mode).
const (
	// modeOpen sends at a fixed rate on a schedule, whatever the target
	// does, and measures each latency from when its request was due.
	modeOpen = "open"
	// modeClosed keeps depth requests in flight on every connection and
	// sends the next as soon as an answer frees a slot.
	modeClosed = "closed"
)

const (
	// startDelay separates the dials from the first request.
	startDelay = 20 * time.Millisecond
	// drainTimeout is how long a run waits, after the measurement, for
	// the answers still due; then it closes the connections, and the
	// requests never answered count as timeouts.
	drainTimeout = 2 * time.Second
	// maxSleep bounds one sleep of a sender, so that it sees an abort.
	maxSleep = 50 * time.Millisecond
	// maxLatency is the largest latency a histogram holds; larger ones
	// are recorded as maxLatency.
	maxLatency = int64(10 * time.Minute)
)

// load is the load a run puts on each target: the same for all.
type load struct {
	mode     string
	rate     float64 // requests/s over all connections; open loop only
	conns    int
	depth    int // requests in flight per connection, at most
	warmup   time.Duration
	duration time.Duration
	keys     *keySpace
	seed     uint64
	drain    time.Duration // 0 means drainTimeout
}

// measurement is what a run of a load on a target recorded.
type measurement struct {
	hist *hdrhistogram.Histogram // latency (ns) of the answers to requests due in the window
	lag  *hdrhistogram.Histogram // open loop: how late (ns) those requests were sent

	arrived  int64 // answers that arrived in the window
	answered int64 // answers to requests due in the window
	byStatus [wire.StatusError + 1]int64
	byCode   map[wire.Code]int64
	firstErr string
	sent     int64  // requests due in the window that were sent
	unsent   int64  // open loop: requests due in the window never sent
	strays   int64  // answers whose id was not in flight
	costs    *Costs // what the probe read over the window; nil without one
	bound    *Bound // what the bound check found over the run; nil without one
}

// timeouts returns how many requests due in the window were sent but
// never answered.
func (m *measurement) timeouts() int64 { return m.sent - m.answered }

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, maxLatency, 3) }

// record adds the latency v (ns) to h, clamped to its range.
func record(h *hdrhistogram.Histogram, v int64) {
	_ = h.RecordValue(min(max(v, 0), maxLatency)) // in range: never fails
}

// runState is the timeline of one run and its abort signal, shared by
// its workers.
type runState struct {
	start, from, end, stop int64 // nanotime: first request, window [from, end), hard stop

	abort     chan struct{} // closed to stop every worker
	abortOnce sync.Once
	mu        sync.Mutex
	err       error // guarded by mu: the first failure
}

func (s *runState) stopAll() { s.abortOnce.Do(func() { close(s.abort) }) }

func (s *runState) aborted() bool {
	select {
	case <-s.abort:
		return true
	default:
		return false
	}
}

// fail records err, if it is the first failure, and aborts the run.
func (s *runState) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.stopAll()
}

// runLoad puts l on t: it opens l.conns connections, drives each with a
// sender and a receiver goroutine for the warm-up and the measurement,
// waits up to l.drain for the last answers, and returns what was
// recorded in the measurement window, with the costs that p (nil: none)
// read at its start and end, and what bc (nil: none) found of the allowed
// answers of each key over the whole run. It stops early, with an error,
// when ctx is done or a connection fails.
func runLoad(ctx context.Context, t target, l *load, p *probe, bc *boundCheck) (*measurement, error) {
	workers := make([]*worker, 0, l.conns)
	defer func() {
		for _, w := range workers {
			w.c.close()
		}
	}()
	for i := range l.conns {
		c, err := t.dial()
		if err != nil {
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
		workers = append(workers, newWorker(i, c, l, bc))
	}
	if bc != nil {
		bc.first = time.Now().UnixMicro() // before the first request
	}

	s := &runState{abort: make(chan struct{})}
	s.start = nanotime() + int64(startDelay)
	s.from = s.start + int64(l.warmup)
	s.end = s.from + int64(l.duration)
	drain := l.drain
	if drain <= 0 {
		drain = drainTimeout
	}
	s.stop = s.end + int64(drain)
	finished := make(chan struct{})
	go func() { // the watchdog: interruption and the hard stop
		timer := time.NewTimer(time.Duration(s.stop - nanotime()))
		defer timer.Stop()
		select {
		case <-ctx.Done():
			s.stopAll()
		case <-timer.C:
			s.stopAll()
		case <-s.abort:
		case <-finished:
			return
		}
		for _, w := range workers {
			w.shut()
		}
	}()

	var snaps [2]snapshot
	var probeErr error
	read := 0 // snapshots taken
	probed := make(chan struct{})
	if p.empty() {
		close(probed)
	} else {
		go func() {
			defer close(probed)
			for i, at := range [2]int64{s.from, s.end} {
				if !sleepUntil(at, s.abort) {
					return
				}
				if snaps[i], probeErr = p.read(); probeErr != nil {
					return
				}
				read++
			}
		}()
	}

	var wg sync.WaitGroup
	for _, w := range workers {
		w.s = s
		wg.Add(2)
		go func() { defer wg.Done(); w.send() }()
		go func() { defer wg.Done(); w.receive() }()
	}
	wg.Wait()
	close(finished)
	<-probed // by the end of the window, or at the abort
	if bc != nil {
		// After the last answer: not when the drain ended, which would
		// add to the bound the refill of a time no request was sent in.
		last := int64(0)
		for _, w := range workers {
			last = max(last, w.lastAt)
		}
		bc.last = max(bc.first, epoch.Add(time.Duration(last)+boundMargin).UnixMicro())
	}

	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("interrupted: %w", err)
	}
	if s.err != nil {
		return nil, s.err
	}
	m := &measurement{hist: newHist(), lag: newHist(), byCode: map[wire.Code]int64{}}
	for _, w := range workers {
		m.hist.Merge(w.hist)
		m.lag.Merge(w.lag)
		m.arrived += w.arrived
		m.answered += w.answered
		for i, n := range w.byStatus {
			m.byStatus[i] += n
		}
		for i, n := range w.byCode {
			if n > 0 {
				m.byCode[wire.Code(i)] += n
			}
		}
		if m.firstErr == "" {
			m.firstErr = w.firstErr
		}
		m.sent += w.sent
		m.unsent += w.unsent
		m.strays += w.strays
	}
	if probeErr != nil {
		return nil, fmt.Errorf("cannot read the costs: %w", probeErr)
	}
	if read == len(snaps) {
		m.costs = p.costs(snaps[0], snaps[1], m.arrived)
	}
	if bc != nil {
		m.bound = bc.result()
	}
	return m, nil
}

// sleepUntil sleeps until the nanotime at, and reports false when abort
// closes first.
func sleepUntil(at int64, abort <-chan struct{}) bool {
	d := time.Duration(at - nanotime())
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-abort:
		return false
	}
}

// maxCode bounds the error codes counted apart; larger ones count as it.
const maxCode = 31

// worker drives one connection. Its fields are owned by the goroutine
// named in their group; runLoad reads them once both have returned.
type worker struct {
	id    int
	c     conn
	l     *load
	s     *runState
	slots *slots
	// started holds, by request id, the start of the request in flight:
	// when it was due or, if sooner, sent. It is negated for a request
	// outside the window (warm-up), and 0 when none is in flight. The
	// sender alone decides which requests are in the window.
	started []atomic.Int64
	// keyOf holds, by request id, the key number of the request in
	// flight: written by the sender before it stores started[id], read
	// by the receiver after it takes started[id].
	keyOf  []int32
	bound  *boundCheck   // counts the allowed answers by key; nil: none
	onAns  func(*answer) // w.answer, bound once
	closed atomic.Bool   // set before the connection is closed on purpose

	// Sender.
	next   int64 // open loop: the index of the next request to send
	rng    *rand.Rand
	lag    *hdrhistogram.Histogram
	sent   int64
	unsent int64

	// Receiver.
	freed    []uint32 // ids answered in the current read, given back after it
	hist     *hdrhistogram.Histogram
	arrived  int64
	answered int64
	byStatus [wire.StatusError + 1]int64
	byCode   [maxCode + 1]int64
	firstErr string
	strays   int64
	lastAt   int64 // nanotime of the last answer
}

func newWorker(id int, c conn, l *load, bc *boundCheck) *worker {
	w := &worker{
		id:      id,
		c:       c,
		l:       l,
		slots:   newSlots(l.depth),
		started: make([]atomic.Int64, l.depth),
		keyOf:   make([]int32, l.depth),
		bound:   bc,
		rng:     rand.New(rand.NewPCG(l.seed, uint64(id))),
		lag:     newHist(),
		freed:   make([]uint32, 0, l.depth),
		hist:    newHist(),
	}
	w.onAns = w.answer
	return w
}

// shut closes the connection on purpose: its goroutines stop quietly.
func (w *worker) shut() {
	w.closed.Store(true)
	w.c.close()
}

// send runs the sender: the load's schedule, then, once every request is
// sent, a wait for the last answers; then it shuts the connection.
func (w *worker) send() {
	defer w.shut()
	var err error
	if w.l.mode == modeOpen {
		err = w.sendOpen()
		w.countUnsent()
	} else {
		err = w.sendClosed()
	}
	if err != nil {
		if !w.closed.Load() {
			w.s.fail(fmt.Errorf("connection %d: %w", w.id, err))
		}
		return
	}
	for !w.slots.idle() {
		select {
		case <-w.slots.wake:
		case <-w.s.abort:
			return
		}
	}
}

// due returns when request i of this connection is due: the connections
// take turns, so that the requests of all are evenly spaced at the rate.
func (w *worker) due(i int64) int64 {
	return w.s.start + int64(float64(i*int64(w.l.conns)+int64(w.id))*1e9/w.l.rate)
}

// sendOpen sends every request when it is due, or as soon after as a
// slot is free, until the end of the window or an abort. A request sent
// late is timed from when it was due: that is the correction for
// coordinated omission (a stalled target would otherwise delay the
// requests that would have seen the stall, and hide it). The pacer wakes
// up to its lead early, and a request due within the lead goes out at
// once, timed from when it was sent.
func (w *worker) sendOpen() error {
	p, err := newPacer()
	if err != nil {
		return err
	}
	defer p.close()
	next := w.due(0)
	for next < w.s.end && !w.s.aborted() {
		now := nanotime()
		if next > now+p.lead() {
			if err := p.sleepUntil(min(next, now+int64(maxSleep))); err != nil {
				return err
			}
			continue
		}
		n := 0
		for next <= now+p.lead() && next < w.s.end {
			id, ok := w.slots.get()
			if !ok {
				break
			}
			key := w.l.keys.pick(w.rng)
			w.keyOf[id] = int32(key)
			w.start(id, min(next, now), next >= w.s.from)
			if next >= w.s.from {
				record(w.lag, now-next)
			}
			if err := w.c.queue(id, key); err != nil {
				return err
			}
			w.next++
			next = w.due(w.next)
			n++
		}
		if n > 0 {
			if err := w.c.flush(); err != nil {
				return err
			}
			continue
		}
		select { // every slot is in flight: wait for an answer
		case <-w.slots.wake:
		case <-w.s.abort:
		}
	}
	return nil
}

// countUnsent counts the requests due in the window that sendOpen did
// not send.
func (w *worker) countUnsent() {
	for i := w.next; w.due(i) < w.s.end; i++ {
		if w.due(i) >= w.s.from {
			w.unsent++
		}
	}
}

// sendClosed fills every free slot at once, timing each request from
// when it is sent, until the end of the window or an abort.
func (w *worker) sendClosed() error {
	if d := time.Duration(w.s.start - nanotime()); d > 0 {
		time.Sleep(d)
	}
	for !w.s.aborted() {
		now := nanotime()
		if now >= w.s.end {
			return nil
		}
		n := 0
		for {
			id, ok := w.slots.get()
			if !ok {
				break
			}
			key := w.l.keys.pick(w.rng)
			w.keyOf[id] = int32(key)
			w.start(id, now, now >= w.s.from)
			if err := w.c.queue(id, key); err != nil {
				return err
			}
			n++
		}
		if n > 0 {
			if err := w.c.flush(); err != nil {
				return err
			}
			continue
		}
		select {
		case <-w.slots.wake:
		case <-w.s.abort:
		}
	}
	return nil
}

// start notes that request id starts at nanotime at, and is measured
// when inWindow.
func (w *worker) start(id uint32, at int64, inWindow bool) {
	if inWindow {
		w.sent++
		w.started[id].Store(at)
	} else {
		w.started[id].Store(-at)
	}
}

// receive runs the receiver: it records every answer, and gives the ids
// of one read's answers back together.
func (w *worker) receive() {
	for {
		err := w.c.recv(w.onAns)
		if len(w.freed) > 0 {
			w.slots.put(w.freed)
			w.freed = w.freed[:0]
		}
		if err != nil {
			if !w.closed.Load() { // else shut closed it: not a failure
				w.s.fail(fmt.Errorf("connection %d: %w", w.id, err))
			}
			return
		}
	}
}

// answer records one answer.
func (w *worker) answer(a *answer) {
	if int(a.id) >= len(w.started) {
		w.strays++
		return
	}
	start := w.started[a.id].Swap(0)
	if start == 0 {
		w.strays++
		return
	}
	w.freed = append(w.freed, a.id)
	if a.at >= w.s.from && a.at < w.s.end {
		w.arrived++
	}
	w.lastAt = max(w.lastAt, a.at)
	if w.bound != nil && a.status == wire.StatusAllowed {
		w.bound.admit(int(w.keyOf[a.id]))
	}
	if start < 0 { // warm-up
		return
	}
	w.answered++
	record(w.hist, a.at-start)
	w.byStatus[a.status]++
	if a.status == wire.StatusError {
		w.byCode[min(int(a.code), maxCode)]++
		if w.firstErr == "" {
			w.firstErr = fmt.Sprintf("%s: %s", a.code, a.msg)
		}
	}
}
