package coalesce

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testTimeout bounds every wait in these tests, so that a bug fails a test
// instead of hanging it.
const testTimeout = 10 * time.Second

var errFail = errors.New("run failed")

// action tells a blocked run of the harness how to end.
type action int

const (
	answer    action = iota // fill out[i] = 10 * reqs[i]
	fail                    // return errFail
	panicking               // panic("boom")
	goexit                  // runtime.Goexit()
)

// call is what the harness's run reports when it starts.
type call struct {
	key  string
	reqs []int
}

// harness is a Group whose run reports each start on started and then
// blocks until the test sends it an action on release.
type harness struct {
	t       *testing.T
	g       *Group[int, int]
	started chan call
	release chan action
}

func newHarness(t *testing.T, o Options) *harness {
	t.Helper()
	h := &harness{t: t, started: make(chan call), release: make(chan action)}
	h.g = New(func(key string, reqs, out []int) error {
		h.started <- call{key, slices.Clone(reqs)}
		switch <-h.release {
		case fail:
			return errFail
		case panicking:
			panic("boom")
		case goexit:
			runtime.Goexit()
		}
		for i, r := range reqs {
			out[i] = 10 * r
		}
		return nil
	}, o)
	return h
}

type result struct {
	resp int
	err  error
}

// do calls Do in a new goroutine and returns where its result will be.
func (h *harness) do(ctx context.Context, key string, req int) <-chan result {
	ch := make(chan result, 1)
	go func() {
		resp, err := h.g.Do(ctx, []byte(key), req)
		ch <- result{resp, err}
	}()
	return ch
}

// queue calls do for each req, in order, each once the one before is
// queued for key, where n requests were queued already.
func (h *harness) queue(key string, n int, reqs ...int) []<-chan result {
	h.t.Helper()
	var out []<-chan result
	for i, r := range reqs {
		out = append(out, h.do(context.Background(), key, r))
		waitQueued(h.t, h.g, key, n+i+1)
	}
	return out
}

// expectRun waits for a run to start and checks its key and requests.
func (h *harness) expectRun(key string, reqs ...int) {
	h.t.Helper()
	select {
	case c := <-h.started:
		if c.key != key || !slices.Equal(c.reqs, reqs) {
			h.t.Fatalf("run(%q, %v), want run(%q, %v)", c.key, c.reqs, key, reqs)
		}
	case <-time.After(testTimeout):
		h.t.Fatalf("no run started, want run(%q, %v)", key, reqs)
	}
}

// end lets the running run end with a.
func (h *harness) end(a action) {
	h.t.Helper()
	select {
	case h.release <- a:
	case <-time.After(testTimeout):
		h.t.Fatal("no run to release")
	}
}

// expectNoRun checks that no run is waiting to start.
func (h *harness) expectNoRun() {
	h.t.Helper()
	select {
	case c := <-h.started:
		h.t.Fatalf("unexpected run(%q, %v)", c.key, c.reqs)
	default:
	}
}

func recv(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(testTimeout):
		t.Fatal("Do did not return")
		return result{}
	}
}

func expectResp(t *testing.T, ch <-chan result, want int) {
	t.Helper()
	if r := recv(t, ch); r.err != nil || r.resp != want {
		t.Fatalf("Do = %d, %v; want %d, nil", r.resp, r.err, want)
	}
}

// poll waits until cond holds, failing the test after testTimeout.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// queued returns how many requests wait, not removed, in key's queue.
func queued[Req, Resp any](g *Group[Req, Resp], key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	if ks := g.m[key]; ks != nil {
		for _, b := range ks.queue {
			n += b.live
		}
	}
	return n
}

func waitQueued[Req, Resp any](t *testing.T, g *Group[Req, Resp], key string, n int) {
	t.Helper()
	poll(t, fmt.Sprintf("%d requests queued for %q", n, key), func() bool { return queued(g, key) == n })
}

// waitIdle waits until g holds no key state.
func waitIdle[Req, Resp any](t *testing.T, g *Group[Req, Resp]) {
	t.Helper()
	poll(t, "the group to hold no key", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.m) == 0
	})
	if s := g.Stats(); s.InFlight != 0 {
		t.Fatalf("idle group has InFlight = %d", s.InFlight)
	}
}

// checkGoroutines waits until no more than n goroutines run.
func checkGoroutines(t *testing.T, n int) {
	t.Helper()
	poll(t, fmt.Sprintf("goroutines to return to %d", n), func() bool { return runtime.NumGoroutine() <= n })
}

func TestOneCaller(t *testing.T) {
	h := newHarness(t, Options{})
	r := h.do(context.Background(), "k", 7)
	h.expectRun("k", 7)
	if s := h.g.Stats(); s.InFlight != 1 || s.Batches != 1 || s.Requests != 1 {
		t.Errorf("Stats during the run = %+v, want 1 batch, 1 request, 1 in flight", s)
	}
	h.end(answer)
	expectResp(t, r, 70)
	waitIdle(t, h.g)
	if s := h.g.Stats(); s != (Stats{Batches: 1, Requests: 1}) {
		t.Errorf("Stats = %+v, want 1 batch, 1 request", s)
	}
}

func TestDoesNotKeepKey(t *testing.T) {
	h := newHarness(t, Options{})
	key := []byte("k")
	ch := make(chan result, 1)
	go func() {
		resp, err := h.g.Do(context.Background(), key, 1)
		ch <- result{resp, err}
	}()
	h.expectRun("k", 1)
	key[0] = 'x' // the caller's buffer, reused
	queued := h.queue("k", 0, 2)
	h.end(answer)
	expectResp(t, ch, 10)
	h.expectRun("k", 2)
	h.end(answer)
	expectResp(t, queued[0], 20)
	waitIdle(t, h.g)
}

func TestArrivalsJoinNextBatch(t *testing.T) {
	h := newHarness(t, Options{})
	first := h.do(context.Background(), "k", 0)
	h.expectRun("k", 0)

	const n = 20
	reqs := make([]int, n)
	for i := range reqs {
		reqs[i] = i + 1
	}
	results := h.queue("k", 0, reqs...)
	h.expectNoRun() // they did not join the running flight

	h.end(answer)
	expectResp(t, first, 0)
	h.expectRun("k", reqs...) // one batch, in arrival order
	h.end(answer)
	for i, r := range results {
		expectResp(t, r, 10*reqs[i])
	}
	waitIdle(t, h.g)
	h.expectNoRun()
	if s := h.g.Stats(); s.Batches != 2 || s.Requests != n+1 {
		t.Errorf("Stats = %+v, want 2 batches, %d requests", s, n+1)
	}
}

func TestArrivalsDuringQueuedBatchRun(t *testing.T) {
	h := newHarness(t, Options{})
	first := h.do(context.Background(), "k", 0)
	h.expectRun("k", 0)
	second := h.queue("k", 0, 1, 2)
	h.end(answer)
	expectResp(t, first, 0)
	h.expectRun("k", 1, 2)
	third := h.queue("k", 0, 3, 4) // during the queued batch's run
	h.end(answer)
	expectResp(t, second[0], 10)
	expectResp(t, second[1], 20)
	h.expectRun("k", 3, 4)
	h.end(answer)
	expectResp(t, third[0], 30)
	expectResp(t, third[1], 40)
	waitIdle(t, h.g)
}

func TestKeysRunConcurrently(t *testing.T) {
	h := newHarness(t, Options{})
	a := h.do(context.Background(), "a", 1)
	b := h.do(context.Background(), "b", 2)
	// Both runs start before either ends.
	got := map[string][]int{}
	for range 2 {
		select {
		case c := <-h.started:
			got[c.key] = c.reqs
		case <-time.After(testTimeout):
			t.Fatalf("runs started: %v; want a and b at once", got)
		}
	}
	if !slices.Equal(got["a"], []int{1}) || !slices.Equal(got["b"], []int{2}) {
		t.Fatalf("runs %v, want a: [1], b: [2]", got)
	}
	if s := h.g.Stats(); s.InFlight != 2 {
		t.Errorf("InFlight = %d, want 2", s.InFlight)
	}
	h.end(answer)
	h.end(answer)
	expectResp(t, a, 10)
	expectResp(t, b, 20)
	waitIdle(t, h.g)
}

func TestMaxBatch(t *testing.T) {
	h := newHarness(t, Options{MaxBatch: 3})
	first := h.do(context.Background(), "k", 0)
	h.expectRun("k", 0)
	results := h.queue("k", 0, 1, 2, 3, 4, 5, 6, 7)
	h.end(answer)
	expectResp(t, first, 0)
	for _, batch := range [][]int{{1, 2, 3}, {4, 5, 6}, {7}} {
		h.expectRun("k", batch...)
		h.end(answer)
		for _, r := range batch {
			expectResp(t, results[r-1], 10*r)
		}
	}
	waitIdle(t, h.g)
}

func TestCancelWhileQueued(t *testing.T) {
	h := newHarness(t, Options{})
	first := h.do(context.Background(), "k", 0)
	h.expectRun("k", 0)

	r1 := h.queue("k", 0, 1)[0]
	ctx, cancel := context.WithCancel(context.Background())
	r2 := h.do(ctx, "k", 2)
	waitQueued(t, h.g, "k", 2)
	r3 := h.queue("k", 2, 3)[0]

	cancel()
	r := recv(t, r2)
	if !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, ErrNotRun) {
		t.Fatalf("canceled queued Do: err = %v, want context.Canceled and ErrNotRun", r.err)
	}
	waitQueued(t, h.g, "k", 2)

	h.end(answer)
	expectResp(t, first, 0)
	h.expectRun("k", 1, 3) // 2 is gone
	h.end(answer)
	expectResp(t, r1, 10)
	expectResp(t, r3, 30)
	waitIdle(t, h.g)
}

func TestCancelWholeQueuedBatch(t *testing.T) {
	h := newHarness(t, Options{MaxBatch: 2})
	first := h.do(context.Background(), "k", 0)
	h.expectRun("k", 0)

	ctx, cancel := context.WithCancel(context.Background())
	var gone []<-chan result
	for i := range 2 { // fill the first queued batch
		gone = append(gone, h.do(ctx, "k", 1+i))
		waitQueued(t, h.g, "k", 1+i)
	}
	kept := h.queue("k", 2, 3)[0] // the second queued batch
	cancel()
	for _, r := range gone {
		if err := recv(t, r).err; !errors.Is(err, ErrNotRun) {
			t.Fatalf("err = %v, want ErrNotRun", err)
		}
	}
	h.end(answer)
	expectResp(t, first, 0)
	h.expectRun("k", 3) // the emptied batch is skipped
	h.end(answer)
	expectResp(t, kept, 30)
	waitIdle(t, h.g)
	h.expectNoRun()
}

func TestCanceledBeforeDo(t *testing.T) {
	g := New(func(string, []int, []int) error {
		t.Error("run called for a canceled context")
		return nil
	}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Do(ctx, []byte("k"), 1); !errors.Is(err, ErrNotRun) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want ErrNotRun and context.Canceled", err)
	}
	waitIdle(t, g)
}

// manualCtx is a context whose deadline the test passes by calling expire.
type manualCtx struct {
	context.Context
	done chan struct{}
}

func newManualCtx() *manualCtx {
	return &manualCtx{Context: context.Background(), done: make(chan struct{})}
}

func (c *manualCtx) expire()                     { close(c.done) }
func (c *manualCtx) Done() <-chan struct{}       { return c.done }
func (c *manualCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *manualCtx) Value(key any) any           { return nil }
func (c *manualCtx) String() string              { return "manualCtx" }
func (c *manualCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func TestDeadlineWhileRunning(t *testing.T) {
	h := newHarness(t, Options{})
	first := h.do(context.Background(), "k", 0)
	h.expectRun("k", 0)
	ctx := newManualCtx()
	r1 := h.do(ctx, "k", 1)
	waitQueued(t, h.g, "k", 1)
	r2 := h.queue("k", 1, 2)[0]
	h.end(answer)
	expectResp(t, first, 0)
	h.expectRun("k", 1, 2)

	ctx.expire()
	r := recv(t, r1) // while the run is still blocked
	if !errors.Is(r.err, context.DeadlineExceeded) || errors.Is(r.err, ErrNotRun) {
		t.Fatalf("Do = %d, %v; want context.DeadlineExceeded, not ErrNotRun", r.resp, r.err)
	}
	h.end(answer)
	expectResp(t, r2, 20)
	waitIdle(t, h.g)
}

func TestInlineCallerGetsAnswerAfterItsDeadline(t *testing.T) {
	h := newHarness(t, Options{})
	ctx := newManualCtx()
	r := h.do(ctx, "k", 4)
	h.expectRun("k", 4)
	ctx.expire()
	h.end(answer)
	expectResp(t, r, 40)
	waitIdle(t, h.g)
}

func TestRunError(t *testing.T) {
	h := newHarness(t, Options{})
	first := h.do(context.Background(), "k", 0)
	h.expectRun("k", 0)
	failed := h.queue("k", 0, 1, 2)
	h.end(answer)
	expectResp(t, first, 0)
	h.expectRun("k", 1, 2)
	after := h.queue("k", 0, 3)[0]
	h.end(fail)
	for _, r := range failed {
		if err := recv(t, r).err; !errors.Is(err, errFail) {
			t.Fatalf("err = %v, want %v", err, errFail)
		}
	}
	h.expectRun("k", 3)
	h.end(answer)
	expectResp(t, after, 30)
	waitIdle(t, h.g)
}

func TestRunPanics(t *testing.T) {
	h := newHarness(t, Options{})
	checkPanic := func(r result) {
		t.Helper()
		var pe *PanicError
		if !errors.As(r.err, &pe) || pe.Value != "boom" || len(pe.Stack) == 0 {
			t.Fatalf("Do = %d, %v; want a *PanicError for boom, with a stack", r.resp, r.err)
		}
	}

	// Inline.
	first := h.do(context.Background(), "k", 0)
	h.expectRun("k", 0)
	queued := h.queue("k", 0, 1, 2)
	h.end(panicking)
	checkPanic(recv(t, first))

	// Queued.
	h.expectRun("k", 1, 2)
	after := h.queue("k", 0, 3)[0]
	h.end(panicking)
	for _, r := range queued {
		checkPanic(recv(t, r))
	}

	// The key still works.
	h.expectRun("k", 3)
	h.end(answer)
	expectResp(t, after, 30)
	waitIdle(t, h.g)
}

func TestPanicErrorUnwraps(t *testing.T) {
	g := New(func(string, []int, []int) error { panic(errFail) }, Options{})
	_, err := g.Do(context.Background(), []byte("k"), 1)
	if !errors.Is(err, errFail) {
		t.Fatalf("err = %v, want it to wrap %v", err, errFail)
	}
}

func TestRunGoexit(t *testing.T) {
	h := newHarness(t, Options{})
	first := h.do(context.Background(), "k", 0)
	h.expectRun("k", 0)
	second := h.queue("k", 0, 1)
	h.end(goexit) // ends first's goroutine: it never reports
	h.expectRun("k", 1)
	third := h.queue("k", 0, 2)
	h.end(goexit)
	if err := recv(t, second[0]).err; !errors.Is(err, errGoexit) {
		t.Fatalf("err = %v, want %v", err, errGoexit)
	}
	h.expectRun("k", 2)
	h.end(answer)
	expectResp(t, third[0], 20)
	waitIdle(t, h.g)
	select {
	case r := <-first:
		t.Fatalf("Do returned %v after run called runtime.Goexit in its goroutine", r)
	default:
	}
}

func TestNewNilRunPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New(nil) did not panic")
		}
	}()
	New[int, int](nil, Options{})
}

// TestHeavyConcurrency checks that a busy key batches: 64 goroutines call
// Do on one key, 1000 times each, and each run takes about 50µs.
func TestHeavyConcurrency(t *testing.T) {
	const goroutines, calls = 64, 1000
	var running atomic.Int32
	g := New(func(_ string, reqs, out []int) error {
		if n := running.Add(1); n != 1 {
			t.Errorf("%d runs at once for one key", n)
		}
		time.Sleep(50 * time.Microsecond) // the round trip
		for i, r := range reqs {
			out[i] = -r
		}
		running.Add(-1)
		return nil
	}, Options{})

	var wg sync.WaitGroup
	for w := range goroutines {
		wg.Go(func() {
			key := []byte("hot")
			for i := range calls {
				req := w*calls + i
				resp, err := g.Do(context.Background(), key, req)
				if err != nil || resp != -req {
					t.Errorf("Do(%d) = %d, %v; want %d, nil", req, resp, err, -req)
					return
				}
			}
		})
	}
	wg.Wait()
	waitIdle(t, g)

	s := g.Stats()
	if s.Requests != goroutines*calls {
		t.Errorf("Requests = %d, want %d", s.Requests, goroutines*calls)
	}
	t.Logf("%d calls in %d runs: mean batch size %.1f", s.Requests, s.Batches, float64(s.Requests)/float64(s.Batches))
	if s.Batches >= goroutines*calls/4 {
		t.Errorf("%d runs for %d calls, want fewer than %d", s.Batches, goroutines*calls, goroutines*calls/4)
	}
}

// TestNoLeaks runs a mixed load on a few keys — contexts that end at any
// point, runs that fail or panic — and checks every answer, that requests
// reported not run never ran, and that afterwards the group holds no key
// and no goroutine is left.
func TestNoLeaks(t *testing.T) {
	start := runtime.NumGoroutine()
	const (
		workers  = 32
		calls    = 300
		keys     = 8
		maxBatch = 4
	)
	var (
		ran     [workers * calls]atomic.Bool
		running [keys]atomic.Int32
	)
	g := New(func(key string, reqs, out []int) error {
		k := int(key[0] - 'a')
		if n := running[k].Add(1); n != 1 {
			t.Errorf("%d runs at once for key %q", n, key)
		}
		defer running[k].Add(-1)
		if len(reqs) < 1 || len(reqs) > maxBatch {
			t.Errorf("batch of %d, want 1 to %d", len(reqs), maxBatch)
		}
		for _, r := range reqs {
			if ran[r].Swap(true) {
				t.Errorf("request %d ran twice", r)
			}
		}
		time.Sleep(time.Duration(rand.IntN(30)) * time.Microsecond)
		switch {
		case reqs[0]%17 == 0:
			return errFail
		case reqs[0]%19 == 0:
			panic("boom")
		}
		for i, r := range reqs {
			out[i] = 10 * r
		}
		return nil
	}, Options{MaxBatch: maxBatch})

	var (
		mu      sync.Mutex
		notRun  []int
		mayHave []int
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			key := make([]byte, 1)
			for i := range calls {
				req := w*calls + i
				key[0] = 'a' + byte(rand.IntN(keys))
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if rand.IntN(2) == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(60))*time.Microsecond)
				}
				resp, err := g.Do(ctx, key, req)
				cancel()
				var pe *PanicError
				switch {
				case err == nil:
					if resp != 10*req {
						t.Errorf("Do(%d) = %d, want %d", req, resp, 10*req)
					}
				case errors.Is(err, ErrNotRun):
					mu.Lock()
					notRun = append(notRun, req)
					mu.Unlock()
				case errors.Is(err, context.DeadlineExceeded):
					mu.Lock()
					mayHave = append(mayHave, req)
					mu.Unlock()
				case errors.Is(err, errFail), errors.As(err, &pe):
				default:
					t.Errorf("Do(%d): unexpected error %v", req, err)
				}
			}
		})
	}
	wg.Wait()
	waitIdle(t, g)
	checkGoroutines(t, start)

	for _, r := range notRun {
		if ran[r].Load() {
			t.Errorf("request %d ran, but Do said it did not", r)
		}
	}
	for _, r := range mayHave {
		if !ran[r].Load() {
			t.Errorf("request %d was running when its caller left, but never ran", r)
		}
	}
	s := g.Stats()
	t.Logf("%d requests in %d runs; %d left a queued batch, %d a running one", s.Requests, s.Batches, len(notRun), len(mayHave))
}

func BenchmarkDo(b *testing.B) {
	g := New(func(_ string, reqs, out []int64) error {
		copy(out, reqs)
		return nil
	}, Options{})
	ctx := context.Background()
	key := []byte("login|tenant:acme|ip:192.0.2.1")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Do(ctx, key, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDoContended runs 32 goroutines per GOMAXPROCS, spread evenly
// over the keys, on a run that returns at once or takes 5µs, yielding
// meanwhile: a stand-in for a round trip (time.Sleep is too coarse here).
func BenchmarkDoContended(b *testing.B) {
	for _, bc := range []struct {
		keys int
		work time.Duration
	}{
		{1, 0},
		{16, 0},
		{1, 5 * time.Microsecond},
		{16, 5 * time.Microsecond},
	} {
		b.Run(fmt.Sprintf("keys=%d/run=%v", bc.keys, bc.work), func(b *testing.B) {
			g := New(func(_ string, reqs, out []int64) error {
				for t0 := time.Now(); time.Since(t0) < bc.work; {
					runtime.Gosched() // waiting on the network leaves the P to others
				}
				copy(out, reqs)
				return nil
			}, Options{})
			ctx := context.Background()
			var worker atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Appendf(nil, "login|tenant:%d", worker.Add(1)%int64(bc.keys))
				for pb.Next() {
					if _, err := g.Do(ctx, key, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
			s := g.Stats()
			b.ReportMetric(float64(s.Requests)/float64(s.Batches), "reqs/batch")
		})
	}
}
