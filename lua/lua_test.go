package lua_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/lua"
	"github.com/rld/rld/redistest"
)

// t0 is a unix time in µs aligned to the hour, so that windows of a
// second or a minute start at t0.
const t0 = 1_699_999_200_000_000

const (
	ms = time.Millisecond
	s1 = time.Second
)

var kinds = []algo.Kind{algo.TokenBucket, algo.GCRA, algo.SlidingLog, algo.SlidingCounter, algo.FixedWindow, algo.Concurrency}

// env is a Redis server with every script loaded.
type env struct {
	addr string
	c    *conn
	shas map[algo.Kind]string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := redistest.Standalone(t)
	e := &env{addr: srv.Addr, c: dial(t, srv.Addr), shas: map[algo.Kind]string{}}
	for _, kind := range kinds {
		src, ok := lua.Source(kind.String())
		if !ok {
			t.Fatalf("no script for %v", kind)
		}
		sha, ok := e.c.do("SCRIPT", "LOAD", src).(string)
		if !ok || len(sha) != 40 {
			t.Fatalf("SCRIPT LOAD %v: %v", kind, sha)
		}
		e.shas[kind] = sha
	}
	return e
}

// op is the scripts' ARGV[1]: one vocabulary with algo's ops, whose
// algo.Apply is the scripts' specification. A take of several costs is
// the scripts' batch: an OpTakeLease that leases nothing.
type op = algo.OpKind

const (
	take      = algo.OpTake
	peek      = algo.OpPeek
	lease     = algo.OpLease
	refund    = algo.OpRefund
	takelease = algo.OpTakeLease
	reset     = algo.OpReset
	grant     = algo.OpGrant
	release   = algo.OpRelease
	charge    = algo.OpCharge
	acquire   = algo.OpAcquire
)

// step is one call of a timeline, at start+at µs: a take of the batch
// costs, a peek of costs[0], a lease of want costs[0], a refund of
// costs[0] units taken at start+takenAt, or a takelease of want costs[0]
// after the batch costs[1:].
type step struct {
	at      int64
	op      op
	costs   []int64
	takenAt int64
	slot    uint64   // a release's slot id (0: none)
	slots   []uint64 // an acquire's slot ids
	want    []int64  // if set: the reply without now_us
}

func tk(at int64, costs ...int64) step { return step{at: at, op: take, costs: costs} }
func pk(at, cost int64) step           { return step{at: at, op: peek, costs: []int64{cost}} }
func ls(at, want int64) step           { return step{at: at, op: lease, costs: []int64{want}} }
func rf(at, cost, takenAt int64) step {
	return step{at: at, op: refund, costs: []int64{cost}, takenAt: takenAt}
}
func rs(at int64) step    { return step{at: at, op: reset, costs: []int64{1}} }
func gr(at, n int64) step { return step{at: at, op: grant, costs: []int64{n}} }

// ch is a charge of n units.
func ch(at, n int64) step { return step{at: at, op: charge, costs: []int64{n}} }

// rl is a release of cost slots of the admission at start+takenAt.
func rl(at, cost, takenAt int64) step {
	return step{at: at, op: release, costs: []int64{cost}, takenAt: takenAt}
}

// rls is a release of the slot id of the admission at start+takenAt.
func rls(at, takenAt int64, id uint64) step {
	return step{at: at, op: release, costs: []int64{1}, takenAt: takenAt, slot: id}
}

// aq is an acquire of one slot per id.
func aq(at int64, ids ...uint64) step { return step{at: at, op: acquire, slots: ids} }

func tl(at, want int64, costs ...int64) step {
	return step{at: at, op: takelease, costs: append([]int64{want}, costs...)}
}
func (s step) is(admitted, remaining int64, reset, retry time.Duration) step {
	s.want = []int64{admitted, remaining, reset.Microseconds(), retryMicros(retry)}
	return s
}

// leased completes the expected reply of a takelease step: n units
// leased, none parked with other holders.
func (s step) leased(n int64) step {
	s.want = append(s.want, n, 0)
	return s
}

// retryMicros is a RetryAfter as the scripts reply it.
func retryMicros(d time.Duration) int64 {
	if d == algo.Never {
		return -1
	}
	return d.Microseconds()
}

// runner feeds one key's timeline to package algo and to the script, and
// demands the same replies, the same state and the TTL rule.
type runner struct {
	t   *testing.T
	e   *env
	p   algo.Params
	key string
	s   algo.State

	// With lkey set, every call carries the lease accounting (KEYS[2]
	// = lkey) with holder (maybe ""), spent and life, which the
	// timeline sets before each call.
	lkey    string
	holder  string
	spent   int64
	spentAt int64
	life    time.Duration
	// pick, when set, chooses holder, spent and life before each call.
	pick func()
}

func (e *env) runner(t *testing.T, p algo.Params, key string) *runner {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	e.c.do("DEL", key, key+":out")
	return &runner{t: t, e: e, p: p, key: key}
}

// apply runs one call at now in Go and in Redis and returns the reply.
func (r *runner) apply(o op, now int64, costs []int64, takenAt int64) []int64 {
	r.t.Helper()
	return r.applySlots(o, now, costs, takenAt, 0, nil)
}

// applySlots is apply with a release's slot id, or an acquire's ids.
func (r *runner) applySlots(o op, now int64, costs []int64, takenAt int64, slot uint64, slots []uint64) []int64 {
	t, p := r.t, r.p
	t.Helper()
	if r.pick != nil {
		r.pick()
	}
	before := clone(r.s)
	// The Go side: algo.Apply, the specification of every op.
	ao := algo.Op{Kind: o, Params: p, TakenAt: takenAt, Slot: slot, Slots: slots}
	if r.lkey != "" {
		ao.Holder, ao.Spent, ao.SpentAt, ao.LeaseLife = r.holder, r.spent, r.spentAt, r.life
	}
	switch o {
	case take:
		ao.Kind, ao.Costs = algo.OpTakeLease, costs // a batch: takes, no lease
	case takelease:
		ao.N, ao.Costs = costs[0], costs[1:]
	case acquire:
	default:
		ao.N = costs[0]
	}
	algo.Apply(&ao, &r.s, now)
	var want []int64
	switch o {
	case take:
		want = reply(int64(ao.Admitted), ao.Result, now)
	case peek:
		want = reply(b2i(ao.Result.Allowed), ao.Result, now)
	case lease:
		want = reply(ao.Granted, ao.Result, now)
	case takelease:
		want = append(reply(int64(ao.Admitted), ao.Result, now), ao.Granted, ao.Parked)
	case refund, reset, grant:
		want = reply(0, ao.Result, now)
	case release:
		want = reply(int64(ao.Admitted), ao.Result, now)
	case acquire:
		// now_us: the slots' time, which names them.
		want = reply(int64(ao.Admitted), ao.Result, ao.Result.At)
	case charge:
		want = reply(0, ao.Result, now)
	}

	// One transaction: the key cannot expire between the script and the
	// PERSIST that keeps it for the rest of the timeline (the timeline's
	// clock is not Redis's).
	args := []string{"EVALSHA", r.e.shas[p.Kind], "1", r.key, o.String(),
		itoa(p.Limit), itoa(p.PeriodMicros()), itoa(p.Burst), itoa(now)}
	if r.lkey != "" {
		args[2] = "2"
		args = slices.Insert(args, 4, r.lkey)
		args = append(args, r.holder, itoa(r.spent), itoa(r.spentAt), itoa(r.life.Microseconds()))
	}
	for _, c := range costs {
		args = append(args, itoa(c))
	}
	if o == refund || o == release {
		args = append(args, itoa(takenAt))
	}
	if slot != 0 {
		args = append(args, fmt.Sprintf("%016x", slot))
	}
	for _, id := range slots {
		args = append(args, fmt.Sprintf("%016x", id))
	}
	c := r.e.c
	c.send("MULTI")
	c.send(args...)
	c.send("PTTL", r.key)
	c.send("PERSIST", r.key)
	c.send(dumpCommand(p.Kind, r.key)...)
	nc := 5
	if r.lkey != "" {
		c.send("PERSIST", r.lkey)
		c.send("HGETALL", r.lkey)
		nc = 7
	}
	c.send("EXEC")
	c.flush()
	for range nc {
		if err, ok := c.read().(redisError); ok {
			t.Fatalf("MULTI: %v", err)
		}
	}
	exec, ok := c.read().([]any)
	if !ok || len(exec) != nc-1 {
		t.Fatalf("EXEC replied %#v", exec)
	}
	got, err := ints(exec[0])
	if err != nil {
		t.Fatalf("%s %v at %d: %v", o, costs, now, err)
	}
	what := fmt.Sprintf("%s %v (takenAt %d) at %d on %+v", o, costs, takenAt, now, before)
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n  script %v\n  algo   %v", what, got, want)
	}
	if gs, rs := goState(p.Kind, r.s, p.PeriodMicros()), redisState(p.Kind, exec[3]); gs != rs {
		t.Errorf("%s: state in Redis %q, in Go %q", what, rs, gs)
	}
	if r.lkey != "" {
		if gs, rs := goOuts(r.s), redisState(algo.TokenBucket, exec[5]); gs != rs {
			t.Errorf("%s: out on lease in Redis %q, in Go %q", what, rs, gs)
		}
	}

	pttl, _ := exec[1].(int64)
	wrote := pttl >= 0 // PERSIST removed the TTL of every earlier write
	switch {
	case o == peek && wrote:
		t.Errorf("%s: a peek wrote (PTTL %d)", what, pttl)
	case (o == take || o == lease || o == takelease || o == acquire) && wrote != (got[0] > 0):
		t.Errorf("%s: admitted %d, yet wrote=%v (PTTL %d)", what, got[0], wrote, pttl)
	case (o == refund || o == grant || o == release || o == charge) && !equal(before, r.s) && pttl == -1:
		t.Errorf("%s: a %s changed the state but set no TTL", what, o)
	case o == reset && (pttl != -2) != (goState(p.Kind, r.s, p.PeriodMicros()) != ""):
		// A reset leaves a key only for the units out on lease.
		t.Errorf("%s: a reset left the key (PTTL %d) for state %q", what, pttl, goState(p.Kind, r.s, p.PeriodMicros()))
	case wrote:
		per := p.PeriodMicros()
		ttl := (2*max(per, idleMicros(p, r.s, now)) + 999) / 1000
		if pttl > ttl || pttl < ttl-100 { // 100ms: a loaded machine may pause Redis
			t.Errorf("%s: PTTL %dms, want 2×max(P, idle) = %dms", what, pttl, ttl)
		}
	}
	return got
}

func reply(admitted int64, r algo.Result, now int64) []int64 {
	return []int64{admitted, r.Remaining, r.Reset.Microseconds(), retryMicros(r.RetryAfter), now}
}

// idleMicros returns how long after now the state s stays not idle.
func idleMicros(p algo.Params, s algo.State, now int64) int64 {
	per := p.PeriodMicros()
	var end int64
	switch p.Kind {
	case algo.TokenBucket:
		full := p.Capacity() * per
		if s.B == 0 || s.A >= full {
			return 0
		}
		end = s.B + (full-s.A+p.Limit-1)/p.Limit
	case algo.GCRA:
		end = s.A
	case algo.FixedWindow:
		if s.B == 0 {
			return 0
		}
		end = s.A + per
	case algo.SlidingCounter:
		switch {
		case s.B > 0:
			end = s.A + 2*per
		case s.C > 0:
			end = s.A + per
		default:
			return 0
		}
	case algo.SlidingLog, algo.Concurrency:
		if len(s.Log) == 0 {
			return 0
		}
		end = s.Log[len(s.Log)-1].At + per
	}
	return max(end-now, 0)
}

// dumpCommand reads a key's whole state.
func dumpCommand(kind algo.Kind, key string) []string {
	switch kind {
	case algo.GCRA:
		return []string{"GET", key}
	case algo.SlidingLog, algo.Concurrency:
		return []string{"ZRANGE", key, "0", "-1", "WITHSCORES"}
	}
	return []string{"HGETALL", key}
}

// goState renders s as redisState renders the key that holds it, "" for
// a missing key.
func goState(kind algo.Kind, s algo.State, per int64) string {
	var score int64 // a concurrency slot is scored by its expiry
	switch kind {
	case algo.Concurrency:
		score = per
	case algo.TokenBucket:
		if s.B == 0 {
			return ""
		}
		return fmt.Sprintf("at=%d level=%d", s.B, s.A)
	case algo.GCRA:
		if s.A == 0 {
			return ""
		}
		return itoa(s.A)
	case algo.FixedWindow:
		if s.A == 0 && s.B == 0 {
			return ""
		}
		return fmt.Sprintf("count=%d start=%d", s.B, s.A)
	case algo.SlidingCounter:
		if s.A == 0 && s.B == 0 && s.C == 0 {
			return ""
		}
		return fmt.Sprintf("cur=%d prev=%d start=%d", s.B, s.C, s.A)
	}
	var b strings.Builder
	for i, en := range s.Log {
		if i > 0 {
			b.WriteByte(' ')
		}
		if kind == algo.Concurrency {
			fmt.Fprintf(&b, "%d:%016x:%d@%d", en.At, en.Slot, en.Cost, en.At+score)
			continue
		}
		fmt.Fprintf(&b, "%d:%d@%d", en.At, en.Cost, en.At+score)
	}
	return b.String()
}

// goOuts renders s.Out as redisState renders the hash of units out on
// lease (both drop the entries that lapsed when an op with a holder, or
// a reset, reads them).
func goOuts(s algo.State) string {
	var parts []string
	for _, o := range s.Out {
		parts = append(parts, fmt.Sprintf("%s=%d:%d", o.Holder, o.Units, o.Until))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

func redisState(kind algo.Kind, v any) string {
	switch kind {
	case algo.GCRA:
		s, _ := v.(string)
		return s
	case algo.SlidingLog, algo.Concurrency:
		vs, _ := v.([]any)
		var parts []string
		for i := 0; i+1 < len(vs); i += 2 {
			parts = append(parts, fmt.Sprintf("%s@%s", vs[i], vs[i+1]))
		}
		return strings.Join(parts, " ")
	}
	vs, _ := v.([]any)
	var parts []string
	for i := 0; i+1 < len(vs); i += 2 {
		parts = append(parts, fmt.Sprintf("%s=%s", vs[i], vs[i+1]))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

func (r *runner) run(start int64, steps []step) {
	r.t.Helper()
	for i, st := range steps {
		got := r.applySlots(st.op, start+st.at, st.costs, start+st.takenAt, st.slot, st.slots)
		noNow := append(got[:4:4], got[5:]...)
		if st.want != nil && !slices.Equal(noNow, st.want) {
			r.t.Errorf("step %d (%s %v at +%dµs): reply %v, want %v", i, st.op, st.costs, st.at, noNow, st.want)
		}
		if r.t.Failed() {
			r.t.FailNow()
		}
	}
}

// TestTimelines feeds hand-written timelines to Go and to the scripts;
// the expected replies of some steps are spelled out as well.
func TestTimelines(t *testing.T) {
	e := newEnv(t)
	const (
		sec = int64(1_000_000)
		m1  = int64(1_000)
	)
	tests := []struct {
		name  string
		p     algo.Params
		steps []step
	}{{
		name: "token bucket: burst, refill, cost above capacity, batch",
		p:    algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: s1},
		steps: []step{
			tk(0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1).is(10, 0, s1, 100*ms),
			tk(0, 1).is(0, 0, s1, 100*ms),
			tk(50*m1, 1).is(0, 0, 950*ms, 50*ms),
			pk(100*m1, 1).is(1, 0, s1, 0),
			tk(100*m1, 1, 11).is(1, 0, s1, algo.Never),
			tk(100*m1, 11).is(0, 0, s1, algo.Never),
			ls(650*m1, 9).is(5, 0, 950*ms, 0),
			ls(650*m1, 9).is(0, 0, 950*ms, 50*ms),
			rf(650*m1, 2, 650*m1).is(0, 1, 850*ms, 0),
			tk(2*sec, 3).is(1, 7, 300*ms, 0),
		},
	}, {
		name: "token bucket: capacity above the rate, refunds",
		p:    algo.Params{Kind: algo.TokenBucket, Limit: 1, Period: s1, Burst: 5},
		steps: []step{
			tk(0, 5).is(1, 0, 5*s1, 0),
			tk(sec, 2).is(0, 1, 4*s1, s1),
			tk(2*sec, 2).is(1, 0, 5*s1, 0),
			rf(2*sec, 1, 2*sec).is(0, 0, 5*s1, 0),
			rf(2*sec, 9, 2*sec),
			tk(2*sec, 6).is(0, 5, 0, algo.Never),
			tk(2*sec, 5, 1).is(1, 0, 5*s1, s1),
		},
	}, {
		name: "gcra: emission interval rounds up",
		p:    algo.Params{Kind: algo.GCRA, Limit: 3, Period: s1},
		steps: []step{
			tk(0, 3).is(1, 0, 1000002*time.Microsecond, 0),
			tk(0, 1).is(0, 0, 1000002*time.Microsecond, 333334*time.Microsecond),
			tk(333333, 1).is(0, 0, 666669*time.Microsecond, time.Microsecond),
			pk(333334, 1).is(1, 0, 1000002*time.Microsecond, 0),
			ls(333334, 3).is(1, 0, 1000002*time.Microsecond, 0),
			rf(333334, 2, 333334).is(0, 1, 666668*time.Microsecond, 0),
			tk(5*sec, 4).is(0, 3, 0, algo.Never),
		},
	}, {
		name: "fixed window: 2×limit across a boundary",
		p:    algo.Params{Kind: algo.FixedWindow, Limit: 3, Period: s1},
		steps: []step{
			tk(999*m1, 1, 1, 1, 1).is(3, 0, ms, ms),
			tk(sec, 3).is(1, 0, s1, 0),                    // 6 units within 1ms
			rf(sec+500*m1, 1, 999*m1).is(0, 0, 500*ms, 0), // that window is gone
			rf(sec+500*m1, 2, sec).is(0, 1, 500*ms, 0),
			ls(sec+500*m1, 5).is(2, 0, 500*ms, 0),
			ls(sec+500*m1, 5).is(0, 0, 500*ms, 500*ms),
		},
	}, {
		name: "sliding counter: the previous window's weight",
		p:    algo.Params{Kind: algo.SlidingCounter, Limit: 10, Period: s1},
		steps: []step{
			tk(0, 10).is(1, 0, 2*s1, 0),
			tk(500*m1, 1).is(0, 0, 1500*ms, 600*ms),
			tk(1099*m1, 1).is(0, 0, 901*ms, ms),
			tk(1250*m1, 2, 1).is(1, 0, 1750*ms, 50*ms),
			pk(1300*m1, 1).is(1, 0, 1700*ms, 0),
			tk(1300*m1, 1).is(1, 0, 1700*ms, 0),
			tk(1900*m1, 1).is(1, 5, 1100*ms, 0),
			tk(2*sec, 7).is(0, 6, s1, 250*ms),
			rf(2*sec, 1, 900*m1), // window gone
			ls(2*sec, 100).is(6, 0, 2*s1, 0),
			rf(2500*m1, 2, 2*sec),
			tk(2500*m1, 4).is(1, 0, 1500*ms, 0),
			tk(4500*m1, 10).is(1, 0, 1500*ms, 0),
		},
	}, {
		name: "sliding log: exact",
		p:    algo.Params{Kind: algo.SlidingLog, Limit: 3, Period: s1},
		steps: []step{
			tk(0, 1).is(1, 2, s1, 0),
			tk(200*m1, 1, 1).is(2, 0, s1, 0),
			tk(500*m1, 2).is(0, 0, 700*ms, 700*ms),
			tk(999999, 1).is(0, 0, 200001*time.Microsecond, time.Microsecond),
			tk(sec, 1, 4).is(1, 0, s1, algo.Never),
			rf(1100*m1, 1, 200*m1).is(0, 0, s1, 0), // a peek of 1 would fit
			tk(1100*m1, 1).is(1, 0, s1, 0),
			tk(1200*m1-1, 1).is(0, 0, 900001*time.Microsecond, time.Microsecond),
			tk(1200*m1, 1).is(1, 0, s1, 0),
			rf(1200*m1, 1, 1200*m1),
			rf(1200*m1, 1, 1100*m1),
			ls(1200*m1, 3).is(2, 0, s1, 0),
		},
	}, {
		name: "takelease: token bucket",
		p:    algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: s1},
		steps: []step{
			tl(0, 4, 2, 3).is(2, 1, 900*ms, 0).leased(4),
			tl(0, 5, 1).is(1, 0, s1, 0).leased(0), // the take empties it
			tl(0, 5, 1).is(0, 0, s1, 100*ms).leased(0),
			tl(250*m1, 0, 1).is(1, 1, 850*ms, 0).leased(0), // want 0: no lease
			tl(250*m1, 3, 1, 11).is(1, 0, 950*ms, algo.Never).leased(0),
			tl(500*m1, 9, 1).is(1, 0, s1, 0).leased(2),
			rf(500*m1, 2, 500*m1).is(0, 1, 900*ms, 0),
			tl(500*m1, 1, 0, 0).is(2, 0, s1, 0).leased(0),
		},
	}, {
		name: "takelease: gcra",
		p:    algo.Params{Kind: algo.GCRA, Limit: 3, Period: s1},
		steps: []step{
			tl(0, 5, 1).is(1, 0, 1000002*time.Microsecond, 0).leased(2),
			tl(333334, 1, 1).is(1, 0, 1000002*time.Microsecond, 0).leased(0),
			tl(333334, 1, 1).is(0, 0, 1000002*time.Microsecond, 333334*time.Microsecond).leased(0),
			tl(5*sec, 2, 1, 1).is(2, 0, 1000002*time.Microsecond, 0).leased(1),
		},
	}, {
		name: "takelease: fixed window",
		p:    algo.Params{Kind: algo.FixedWindow, Limit: 3, Period: s1},
		steps: []step{
			tl(999*m1, 5, 1).is(1, 0, ms, 0).leased(2),
			tl(sec, 1, 1, 1).is(2, 0, s1, 0).leased(1),
			rf(sec+500*m1, 1, sec).is(0, 0, 500*ms, 0),
			tl(sec+500*m1, 4, 1).is(1, 0, 500*ms, 0).leased(0),
			tl(sec+500*m1, 4, 1).is(0, 0, 500*ms, 500*ms).leased(0),
		},
	}, {
		name: "takelease: sliding counter",
		p:    algo.Params{Kind: algo.SlidingCounter, Limit: 10, Period: s1},
		steps: []step{
			tl(0, 3, 4).is(1, 3, 2*s1, 0).leased(3),
			tl(500*m1, 100, 3, 1).is(1, 0, 1500*ms, 600*ms).leased(0),
			tl(1500*m1, 100, 1).is(1, 0, 1500*ms, 0).leased(4),
		},
	}, {
		name: "takelease: sliding log",
		p:    algo.Params{Kind: algo.SlidingLog, Limit: 3, Period: s1},
		steps: []step{
			tl(0, 5, 1).is(1, 0, s1, 0).leased(2),
			tl(500*m1, 1, 1).is(0, 0, 500*ms, 500*ms).leased(0),
			rf(500*m1, 1, 0),
			tl(500*m1, 1, 1).is(1, 0, s1, 0).leased(0),
			tl(sec, 5, 1).is(1, 0, s1, 0).leased(1),
		},
	}, {
		name: "clock steps back",
		p:    algo.Params{Kind: algo.SlidingLog, Limit: 4, Period: s1},
		steps: []step{
			tk(500*m1, 1),
			tk(400*m1, 1).is(1, 2, 1100*ms, 0), // joins the entry at 500ms
			tk(1450*m1, 3).is(0, 2, 50*ms, 50*ms),
			tk(1450*m1, 2).is(1, 0, s1, 0),
			rf(1450*m1, 2, 500*m1),
		},
	}, {
		// Two slots, a timeout of one second: acquires hold slots until
		// released or expired; a release names the admission's time.
		name: "concurrency: acquire, release, expiry",
		p:    algo.Params{Kind: algo.Concurrency, Limit: 2, Period: s1},
		steps: []step{
			tk(0, 1).is(1, 1, s1, 0),
			tk(100*m1, 1).is(1, 0, s1, 0),
			tk(200*m1, 1).is(0, 0, 900*ms, 800*ms),   // full: the oldest expires at 1s
			rl(300*m1, 1, 50*m1).is(0, 0, 800*ms, 0), // unknown lease id: nothing changes
			rl(300*m1, 1, 0).is(1, 1, 800*ms, 0),     // the slot of 0 comes back: 1 free, 100's until 1.1s
			rl(300*m1, 1, 0).is(0, 1, 800*ms, 0),     // released twice: unknown
			tk(300*m1, 1).is(1, 0, s1, 0),
			tk(1100*m1, 1).is(1, 0, s1, 0),             // the slot of 100ms expired
			rl(1300*m1, 1, 300*m1).is(0, 1, 800*ms, 0), // expired at 1.3s: unknown
			rl(1300*m1, 1, 1100*m1).is(1, 2, 0, 0),     // none held: nothing to reset
			tk(1300*m1, 3).is(0, 2, 0, -1),
		},
	}, {
		// Slots acquired with ids: two in one call share a time, and
		// each release frees its own slot, once.
		name: "concurrency: slots of one call, released twice",
		p:    algo.Params{Kind: algo.Concurrency, Limit: 3, Period: s1},
		steps: []step{
			aq(0, 0xa, 0xb).is(2, 1, s1, 0),
			rls(100*m1, 0, 0xa).is(1, 2, 900*ms, 0),
			rls(200*m1, 0, 0xa).is(0, 2, 800*ms, 0), // A again: B stays held
			rl(200*m1, 1, 0).is(0, 2, 800*ms, 0),    // by time alone: no slot
			aq(300*m1, 0xc, 0xd, 0xe).is(2, 0, s1, 700*ms),
			tk(300*m1, 1).is(0, 0, s1, 700*ms),
			rls(400*m1, 0, 0xb).is(1, 1, 900*ms, 0),
			tk(400*m1, 1).is(1, 0, s1, 0),
			aq(350*m1, 0xf).is(0, 0, 1050*ms, 950*ms), // the clock stepped back
			ch(400*m1, 1),
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.runner(t, tt.p, "{tl}"+tt.name).run(t0, tt.steps)
		})
	}
}

// TestTimelinesEveryAlgorithm feeds one timeline, scaled to the period and
// capacity, to every algorithm under several parameters, aligned to a
// window and not.
func TestTimelinesEveryAlgorithm(t *testing.T) {
	e := newEnv(t)
	params := []algo.Params{
		{Limit: 10, Period: s1},
		{Limit: 3, Period: s1},
		{Limit: 1, Period: s1, Burst: 5},
		{Limit: 100, Period: time.Minute, Burst: 150},
		{Limit: 7, Period: ms},
		{Limit: 1000, Period: time.Hour},
		{Limit: 3, Period: 24 * time.Hour, Burst: 1},
	}
	for _, kind := range kinds {
		for i, p := range params {
			p.Kind = kind
			for _, offset := range []int64{0, p.PeriodMicros()/3 + 7} {
				name := fmt.Sprintf("%v/%d/+%d", kind, i, offset)
				t.Run(name, func(t *testing.T) {
					e.runner(t, p, "{all}"+name).run(t0+offset, scaledTimeline(p))
				})
			}
		}
	}
}

func scaledTimeline(p algo.Params) []step {
	P, C := p.PeriodMicros(), p.Capacity()
	fill := max(C-1, 1)
	return []step{
		tl(0, 1, 1),
		pk(0, C),
		tl(0, 0, 1),
		tk(0, fill, 1, 1),
		tk(0, 1),
		tk(0, C+1),
		pk(P/10, 1),
		tk(P/10, 1, 1),
		ls(P/4, C),
		tl(P/4, C, 1),
		ls(P/4, 1),
		rf(P/4, 1, P/4),
		rf(P/4, 2, 0),
		pk(P/4, 2),
		tk(P-1, 1),
		tk(P, 2),
		tk(P, C),
		tk(P+1, 1, 1, C+1),
		tl(P+1, C, 1, C+1),
		ls(3*P/2, 2),
		tl(3*P/2, 1, 1, 1),
		rf(3*P/2, 5, P),
		tk(3*P/2, 2, 2, 2),
		tk(2*P-1, 1),
		tk(2*P, C),
		pk(2*P, 1),
		tk(2*P-P/3, 1), // the clock steps back
		rf(2*P-P/3, 1, 2*P),
		tl(5*P, C, C),
		tk(5*P, C),
		tl(5*P+P/7, 2, 1),
		ls(5*P+P/7, C),
		rf(5*P+P/7, C, 5*P+P/7),
		rf(5*P+P/7, 1, 5*P),
		tl(20*P, C, 1),
		rf(20*P, C, 20*P),
		tl(21*P, C+5, 1, 1),
		gr(21*P, 1),
		gr(21*P, C+3),
		tk(21*P, C),
		gr(21*P+1, 2),
		tk(21*P+2, 1, 1, 1),
		rs(21*P + 2),
		pk(21*P+2, C),
		tk(21*P+2, C),
		rs(21*P + 3),
		rs(21*P + 3),
		gr(21*P+3, 1),
		tk(22*P-1, fill),
		tk(22*P+P/2, 1),
		gr(22*P+P/2, C),
		ch(23*P, 1),
		ch(23*P, C),
		tk(23*P, 1),
		ch(23*P+P/3, C),
		ch(23*P+P/3, C),
		pk(23*P+P/3, 1),
		tk(24*P+P/2, 1),
		ch(26*P, C+5),
		rs(26*P + 1),
	}
}

// TestRandomDifferential runs seeded random timelines: random parameters
// (some with L×P or C×P near 2^53), time steps (some backwards), batches,
// peeks, leases, batches with a lease (takelease), refunds, resets and
// grants.
func TestRandomDifferential(t *testing.T) {
	e := newEnv(t)
	seeds, ops := 20, 100
	if testing.Short() {
		seeds = 5
	}
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			for seed := range seeds {
				rng := rand.New(rand.NewPCG(uint64(seed), 100+uint64(kind)))
				p := randomParams(rng, kind)
				r := e.runner(t, p, fmt.Sprintf("{rand}%v:%d", kind, seed))
				randomTimeline(r, rng, ops)
				if t.Failed() {
					t.Fatalf("seed %d, params %+v", seed, p)
				}
			}
		})
	}
}

func randomParams(rng *rand.Rand, kind algo.Kind) algo.Params {
	p := algo.Params{Kind: kind}
	switch rng.IntN(5) {
	case 0, 1, 2:
		p.Limit = 1 + rng.Int64N(20)
		p.Period = time.Duration(1000+rng.Int64N(3_000_000)) * time.Microsecond
		if rng.IntN(2) == 0 {
			p.Burst = 1 + rng.Int64N(30)
		}
	case 3:
		p.Limit = 1 + rng.Int64N(1000)
		p.Period = time.Duration(1+rng.Int64N(3600)) * time.Second
	default:
		// L×P and C×P near 2^53 (2^52 for GCRA, whose TAT is a time plus
		// C×e, see docs/algorithms.md).
		bound := int64(algo.MaxScaled)
		if kind == algo.GCRA {
			bound /= 2
		}
		per := 1_000_000 + rng.Int64N(2*86_400_000_000)
		p.Period = time.Duration(per) * time.Microsecond
		p.Limit = max(bound/per-rng.Int64N(3), 1)
		if rng.IntN(2) == 0 {
			p.Burst = 1 + rng.Int64N(bound/per)
			p.Limit = 1 + rng.Int64N(bound/per)
		}
	}
	return p
}

// chargeExact reports whether a charge's debt keeps every value of p's
// algorithm exact in Lua: a debt doubles the counts (docs/algorithms.md).
func chargeExact(p algo.Params) bool {
	return max(p.Limit, p.Capacity()) <= algo.MaxScaled/4/p.PeriodMicros()
}

func randomTimeline(r *runner, rng *rand.Rand, ops int) {
	p := r.p
	per, capacity := p.PeriodMicros(), p.Capacity()
	now := t0 + rng.Int64N(per)
	cost := func() int64 {
		switch rng.IntN(20) {
		case 0:
			return capacity + 1 + rng.Int64N(3)
		case 1, 2, 3, 4, 5, 6:
			return 1 + rng.Int64N(capacity)
		}
		return 1
	}
	var takes []int64 // the times of admissions, for refunds
	type slot struct {
		at int64
		id uint64
	}
	var slots []slot // the slots acquired, some released (again)
	var nextID uint64
	for range ops {
		switch rng.IntN(14) {
		case 0, 1, 2, 3:
			// the same microsecond
		case 4, 5, 6, 7, 8:
			now += rng.Int64N(2*per/p.Limit + 1)
		case 9, 10:
			now += rng.Int64N(3 * per)
		case 11:
			now += rng.Int64N(20 * per)
		case 12:
			now += rng.Int64N(per/p.Limit + 1)
		case 13:
			now = max(now-rng.Int64N(per/2+1), 1) // the clock steps back
		}
		if p.Kind == algo.Concurrency && rng.IntN(2) == 0 {
			if len(slots) == 0 || rng.IntN(2) == 0 {
				ids := make([]uint64, 1+rng.IntN(3))
				for i := range ids {
					nextID++
					ids[i] = nextID * 0x9e3779b97f4a7c15 // unique, not in order
				}
				got := r.applySlots(acquire, now, nil, 0, 0, ids)
				for _, id := range ids[:got[0]] {
					slots = append(slots, slot{got[4], id})
				}
			} else {
				sl := slots[rng.IntN(len(slots))]
				r.applySlots(release, now, []int64{1}, sl.at, sl.id, nil)
			}
			if r.t.Failed() {
				return
			}
			continue
		}
		switch rng.IntN(15) {
		case 12:
			r.apply(reset, now, []int64{1}, 0)
		case 13, 14:
			r.apply(grant, now, []int64{cost()}, 0)
		case 10, 11:
			costs := make([]int64, 2+rng.IntN(3))
			costs[0] = rng.Int64N(capacity + 2) // want
			for i := 1; i < len(costs); i++ {
				costs[i] = cost()
			}
			if got := r.apply(takelease, now, costs, 0); got[0] > 0 {
				takes = append(takes, now)
			}
		case 0, 1, 2, 3, 4:
			costs := make([]int64, 1+rng.IntN(4))
			for i := range costs {
				costs[i] = cost()
			}
			if got := r.apply(take, now, costs, 0); got[0] > 0 {
				takes = append(takes, now)
			}
		case 5:
			r.apply(peek, now, []int64{cost()}, 0)
		case 6, 7:
			if got := r.apply(lease, now, []int64{cost()}, 0); got[0] > 0 {
				takes = append(takes, now)
			}
		default:
			takenAt := now - rng.Int64N(per+1)
			if len(takes) > 0 && rng.IntN(4) > 0 {
				takenAt = takes[rng.IntN(len(takes))]
			}
			o := refund
			switch {
			case p.Kind == algo.Concurrency && rng.IntN(2) == 0:
				o = release
			case rng.IntN(2) == 0 && chargeExact(p):
				o = charge
			}
			r.apply(o, now, []int64{cost()}, takenAt)
		}
		if r.t.Failed() {
			return
		}
	}
}

// TestLeaseAccountingDifferential runs seeded random timelines of every
// algorithm that leases with the lease accounting on: each call made by
// one of three holders or by none, reporting random spent units (some
// negative), with random lease lifetimes; Go and the script must agree
// on every reply, the state, and the units each holder has out.
func TestLeaseAccountingDifferential(t *testing.T) {
	e := newEnv(t)
	seeds, ops := 20, 150
	if testing.Short() {
		seeds = 5
	}
	for _, kind := range kinds {
		if kind == algo.SlidingLog {
			continue // strict: never leased
		}
		t.Run(kind.String(), func(t *testing.T) {
			for seed := range seeds {
				rng := rand.New(rand.NewPCG(uint64(seed), 200+uint64(kind)))
				p := randomParams(rng, kind)
				key := fmt.Sprintf("{held}%v:%d", kind, seed)
				r := e.runner(t, p, key)
				r.lkey = key + ":out"
				holders := []string{"", "a", "b", "c"}
				r.pick = func() {
					r.holder = holders[rng.IntN(len(holders))]
					r.spent = 0
					if rng.IntN(2) == 0 {
						r.spent = rng.Int64N(p.Capacity()+2) - 1
					}
					r.life = time.Duration(1+rng.Int64N(3*p.PeriodMicros())) * time.Microsecond
					// When the spent units' lease was taken: now, or up
					// to three periods before (the windows then differ).
					r.spentAt = t0 + rng.Int64N(3*p.PeriodMicros()+1)
				}
				randomTimeline(r, rng, ops)
				if t.Failed() {
					t.Fatalf("seed %d, params %+v", seed, p)
				}
			}
		})
	}
}

// TestResetLessOut: a reset leaves a fresh key less the units out on
// lease, which the holders then admit or give back; a return gives back
// no more than its holder has out, and a holder's units stop counting
// at the end of their lifetime.
func TestResetLessOut(t *testing.T) {
	e := newEnv(t)
	p := algo.Params{Kind: algo.FixedWindow, Limit: 10, Period: s1}
	r := e.runner(t, p, "{held}reset")
	r.lkey = "{held}reset:out"
	as := func(holder string, spent int64) { r.holder, r.spent, r.spentAt, r.life = holder, spent, t0, 300*ms }
	us := time.Microsecond
	as("a", 0)
	r.run(t0, []step{tl(0, 4, 1).is(1, 5, s1, 0).leased(4)})
	as("b", 0)
	r.run(t0, []step{tl(0, 3, 1).is(1, 1, s1, 0).leased(3)})
	// The reset leaves 10 − (4 + 3) units: a peek of 1 leaves 2.
	as("", 0)
	r.run(t0, []step{rs(1).is(0, 2, s1-us, 0)})
	// a admitted 2 of its 4 and gives back the rest: 2, whatever it says.
	as("a", 2)
	r.run(t0, []step{rf(2, 9, 0).is(0, 4, s1-2*us, 0)})
	// c is refused at its sixth unit while b has 3 units out.
	as("c", 0)
	st := tl(3, 0, 1, 1, 1, 1, 1, 1).is(5, 0, s1-3*us, s1-3*us)
	st.want = append(st.want, 0, 3)
	r.run(t0, []step{st})
	// b's return brings its 3 units back.
	as("b", 0)
	r.run(t0, []step{rf(5, 3, 0).is(0, 2, s1-5*us, 0)})
	// The window ends: what b would still hold has lapsed with it.
	as("b", 0)
	r.run(t0, []step{tl(int64(s1/us)-1, 1, 1).is(1, 1, us, 0).leased(1)})
	as("a", 0)
	r.run(t0, []step{rs(int64(s1/us)).is(0, 9, s1, 0)})
}

// TestTTL checks the TTL of a first write and that calls that write
// nothing create no key.
func TestTTL(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		p     algo.Params
		cost  int64
		ttlMS int64 // 2 × max(P, idle) after a take of cost at t0+250ms
	}{
		{algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: s1, Burst: 100}, 100, 20_000},
		{algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: s1}, 2, 2_000},
		{algo.Params{Kind: algo.GCRA, Limit: 10, Period: s1, Burst: 100}, 100, 20_000},
		{algo.Params{Kind: algo.SlidingLog, Limit: 10, Period: s1}, 1, 2_000},
		{algo.Params{Kind: algo.SlidingCounter, Limit: 10, Period: s1}, 1, 3_500},
		{algo.Params{Kind: algo.FixedWindow, Limit: 10, Period: 3 * s1}, 1, 6_000},
	}
	for i, tt := range tests {
		t.Run(tt.p.Kind.String(), func(t *testing.T) {
			key := fmt.Sprintf("{ttl}%d", i)
			now := itoa(t0 + 250_000)
			call := func(args ...string) []int64 {
				t.Helper()
				all := append([]string{"EVALSHA", e.shas[tt.p.Kind], "1", key, args[0],
					itoa(tt.p.Limit), itoa(tt.p.PeriodMicros()), itoa(tt.p.Burst), now}, args[1:]...)
				got, err := ints(e.c.do(all...))
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			exists := func() bool { return e.c.do("EXISTS", key) == int64(1) }
			e.c.do("DEL", key)
			call("peek", "1")
			call("take", itoa(tt.p.Capacity()+1))
			call("takelease", "5", itoa(tt.p.Capacity()+1))
			call("refund", "1", now)
			if exists() {
				t.Fatal("a peek, a denial or a refund on a missing key created it")
			}
			call("take", itoa(tt.cost))
			if pttl := e.c.do("PTTL", key).(int64); pttl > tt.ttlMS || pttl < tt.ttlMS-1000 {
				t.Errorf("PTTL %dms after a take, want %dms", pttl, tt.ttlMS)
			}
			e.c.do("PERSIST", key)
			call("peek", "1")
			if pttl := e.c.do("PTTL", key).(int64); pttl != -1 {
				t.Errorf("PTTL %d after a peek, want -1 (untouched)", pttl)
			}
		})
	}
}

// TestRedisTime checks that now_us "0" takes the time from Redis.
func TestRedisTime(t *testing.T) {
	e := newEnv(t)
	for _, kind := range kinds {
		local := time.Now().UnixMicro()
		got, err := ints(e.c.do("EVALSHA", e.shas[kind], "1", "{time}"+kind.String(),
			"take", "10", "1000000", "0", "0", "1"))
		if err != nil {
			t.Fatalf("%v: %v", kind, err)
		}
		if got[0] != 1 || got[4]-local > 2_000_000 || local-got[4] > 2_000_000 {
			t.Errorf("%v: reply %v, local clock %d", kind, got, local)
		}
	}
}

// TestOnlyKeys1 watches MONITOR while every script runs every op: each
// command a script sends names KEYS[1] (TIME, which names no key, only
// when now_us is "0").
func TestOnlyKeys1(t *testing.T) {
	e := newEnv(t)
	mon := dial(t, e.addr)
	if v := mon.do("MONITOR"); v != "OK" {
		t.Fatalf("MONITOR: %v", v)
	}
	type call struct {
		key  string
		args []string
	}
	var calls []call
	for _, kind := range kinds {
		key := "{mon}" + kind.String()
		now := itoa(t0)
		for _, args := range [][]string{
			{"take", "3", "1000000", "0", now, "1", "1"},
			{"take", "3", "1000000", "0", now, "2", "5"},
			{"peek", "3", "1000000", "0", now, "1"},
			{"lease", "3", "1000000", "0", itoa(t0 + 500_000), "5"},
			{"refund", "3", "1000000", "0", itoa(t0 + 600_000), "1", now},
			{"refund", "3", "1000000", "0", itoa(t0 + 600_000), "1", itoa(t0 + 500_000)},
			{"take", "3", "1000000", "0", "0", "1"},
			{"lease", "3", "1000000", "0", "0", "2"},
			{"takelease", "3", "1000000", "0", itoa(t0 + 5_000_000), "1", "1"},
			{"takelease", "3", "1000000", "0", "0", "2", "1"},
		} {
			calls = append(calls, call{key, args})
		}
	}
	perKind := len(calls) / len(kinds)
	for i, c := range calls {
		e.c.do("ECHO", fmt.Sprintf("rld-call-%d", i))
		all := append([]string{"EVALSHA", e.shas[kinds[i/perKind]], "1", c.key}, c.args...)
		if _, err := ints(e.c.do(all...)); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
	}
	e.c.do("ECHO", "rld-done")

	cur, seen := -1, make([]int, len(calls))
	for {
		line, ok := mon.read().(string)
		if !ok {
			t.Fatalf("MONITOR sent %v", line)
		}
		src, args := parseMonitor(t, line)
		if src != "lua" {
			if len(args) == 2 && strings.EqualFold(args[0], "echo") {
				if args[1] == "rld-done" {
					break
				}
				cur, _ = strconv.Atoi(strings.TrimPrefix(args[1], "rld-call-"))
			}
			continue
		}
		if cur < 0 {
			t.Fatalf("script command before the first call: %q", line)
		}
		c := calls[cur]
		seen[cur]++
		switch {
		case strings.EqualFold(args[0], "time"):
			if len(args) != 1 || c.args[4] != "0" {
				t.Errorf("%v: %q", c.args, line)
			}
		case len(args) < 2 || args[1] != c.key:
			t.Errorf("%v on %s: the script sent %q", c.args, c.key, line)
		}
	}
	for i, n := range seen {
		if n == 0 {
			t.Errorf("MONITOR showed no command of call %d %v", i, calls[i].args)
		}
	}
}

// parseMonitor splits a MONITOR line, `1700000000.123456 [0 lua] "HGET"
// "k" "f"`, into its source ("lua" or the client's address) and its
// command's arguments.
func parseMonitor(t *testing.T, line string) (src string, args []string) {
	t.Helper()
	open, end := strings.IndexByte(line, '['), strings.Index(line, "] ")
	if open < 0 || end < open {
		t.Fatalf("MONITOR line %q", line)
	}
	if f := strings.Fields(line[open+1 : end]); len(f) == 2 {
		src = f[1]
	}
	rest := line[end+2:]
	for rest != "" {
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			t.Fatalf("MONITOR line %q: %v", line, err)
		}
		a, _ := strconv.Unquote(q)
		args = append(args, a)
		rest = strings.TrimPrefix(rest[len(q):], " ")
	}
	return src, args
}

// TestErrors checks that bad calls get an error reply, not a decision.
func TestErrors(t *testing.T) {
	e := newEnv(t)
	sha := e.shas[algo.TokenBucket]
	for _, args := range [][]string{
		{"take", "10", "1000000", "0", "0"},
		{"take", "10", "1000000", "0", "0", "x"},
		{"take", "0", "1000000", "0", "0", "1"},
		{"take", "10", "0", "0", "0", "1"},
		{"take", "10", "1000000", "0", "-5", "1"},
		{"peek", "10", "1000000", "0", "0"},
		{"refund", "10", "1000000", "0", "0", "1"},
		{"drain", "10", "1000000", "0", "0", "1"},
		{"takelease", "10", "1000000", "0", "0", "1"},
		{"takelease", "10", "1000000", "0", "0", "-1", "1"},
		{"takelease", "10", "1000000", "0", "0", "x", "1"},
		{"takelease", "10", "1000000", "0", "0", "1", "1.5"},
	} {
		all := append([]string{"EVALSHA", sha, "1", "{err}k"}, args...)
		if v, ok := e.c.do(all...).(redisError); !ok || !strings.Contains(string(v), "rld") {
			t.Errorf("%v: reply %v, want an rld error", args, v)
		}
	}
	// release is concurrency's alone, and needs a lease id.
	for _, c := range []struct {
		kind algo.Kind
		args []string
	}{
		{algo.TokenBucket, []string{"release", "10", "1000000", "0", "0", "1", "5"}},
		{algo.Concurrency, []string{"release", "10", "1000000", "0", "0", "1"}},
		{algo.Concurrency, []string{"release", "10", "1000000", "0", "0", "1", "x"}},
		{algo.Concurrency, []string{"release", "10", "1000000", "0", "0", "1", "5", "00000000000000zz"}},
		{algo.Concurrency, []string{"release", "10", "1000000", "0", "0", "1", "5", "0000000000000000"}},
		{algo.Concurrency, []string{"release", "10", "1000000", "0", "0", "1", "5", "00000000000000A1"}},
		{algo.Concurrency, []string{"acquire", "10", "1000000", "0", "0"}},
		{algo.Concurrency, []string{"acquire", "10", "1000000", "0", "0", "00000000000000a1", "1"}},
		{algo.Concurrency, []string{"acquire", "10", "1000000", "0", "0", "0000000000000000"}},
		{algo.TokenBucket, []string{"acquire", "10", "1000000", "0", "0", "00000000000000a1"}},
	} {
		all := append([]string{"EVALSHA", e.shas[c.kind], "1", "{err}k"}, c.args...)
		if v, ok := e.c.do(all...).(redisError); !ok || !strings.Contains(string(v), "rld") {
			t.Errorf("%v %v: reply %v, want an rld error", c.kind, c.args, v)
		}
	}
	if e.c.do("EXISTS", "{err}k") != int64(0) {
		t.Error("a bad call wrote the key")
	}
}

func TestSourceNames(t *testing.T) {
	names := lua.Names()
	var want []string
	for _, kind := range []algo.Kind{algo.TokenBucket, algo.GCRA, algo.SlidingLog, algo.SlidingCounter, algo.FixedWindow, algo.Concurrency} {
		want = append(want, kind.String())
	}
	if !slices.Equal(names, want) {
		t.Fatalf("Names() = %v, want %v", names, want)
	}
	names[0] = "changed"
	if lua.Names()[0] != want[0] {
		t.Error("Names returns the package's own slice")
	}
	for _, name := range want {
		if src, ok := lua.Source(name); !ok || !strings.Contains(src, "return run(alg)") {
			t.Errorf("Source(%q) = %d bytes, %v", name, len(src), ok)
		}
	}
	if _, ok := lua.Source("leaky_bucket"); ok {
		t.Error("Source of an unknown algorithm")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func clone(s algo.State) algo.State {
	s.Log = slices.Clone(s.Log)
	return s
}

func equal(a, b algo.State) bool {
	return a.A == b.A && a.B == b.B && a.C == b.C && slices.Equal(a.Log, b.Log)
}

// TestHeartbeatScript checks the registry of live daemons; redisx tests
// the expiry in time.
func TestHeartbeatScript(t *testing.T) {
	e := newEnv(t)
	src := lua.HeartbeatSource()
	sha, ok := e.c.do("SCRIPT", "LOAD", src).(string)
	if !ok {
		t.Fatalf("SCRIPT LOAD: %v", sha)
	}
	const key = "{hb}daemons"
	call := func(args ...string) any {
		t.Helper()
		return e.c.do(append([]string{"EVALSHA", sha, "1", key}, args...)...)
	}
	// A member whose deadline has passed, as a daemon that died leaves.
	e.c.do("ZADD", key, "1", "dead")
	for i, tt := range []struct {
		args []string
		want int64
	}{
		{[]string{"beat", "a", "60000"}, 1}, // "dead" is gone
		{[]string{"beat", "b", "60000"}, 2},
		{[]string{"beat", "a", "1000"}, 2},
		{[]string{"beat", "c", "120000"}, 3},
		{[]string{"leave", "b"}, 1},
		{[]string{"leave", "b"}, 0},
		{[]string{"beat", "a", "60000"}, 2},
	} {
		if got := call(tt.args...); got != tt.want {
			t.Errorf("call %d %v: %v, want %d", i, tt.args, got, tt.want)
		}
	}
	if got := e.c.do("ZSCORE", key, "dead"); got != nil {
		t.Errorf("the stale member is still there: %v", got)
	}
	// The key lives as long as the longest ttl given (c's 120 s).
	if pttl := e.c.do("PTTL", key).(int64); pttl <= 60_000 || pttl > 120_000 {
		t.Errorf("PTTL %d, want in (60000, 120000]", pttl)
	}
	for _, args := range [][]string{
		{"beat", "", "1000"},
		{"beat", "a"},
		{"beat", "a", "0"},
		{"beat", "a", "1.5"},
		{"stop", "a", "1000"},
	} {
		if v, ok := call(args...).(redisError); !ok || !strings.Contains(string(v), "rld") {
			t.Errorf("%q: reply %v, want an rld error", args, v)
		}
	}
}
