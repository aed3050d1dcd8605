package main

import (
	"context"
	"testing"
	"time"

	"github.com/rld/rld/redistest"
)

// TestBoundRule: each algorithm's bound over a span, in unix µs.
func TestBoundRule(t *testing.T) {
	const s = int64(time.Second / time.Microsecond)
	for _, tc := range []struct {
		alg         string
		first, last int64
		want        int64
	}{
		{algTokenBucket, 0, 0, 100},          // a full bucket
		{algTokenBucket, 5, 10*s + 5, 1_100}, // full, then 10 s of refill
		{algGCRA, 0, 10 * s, 1_100},          // emission interval 10 ms
		{algFixedWindow, 0, s - 1, 100},      // one window
		{algFixedWindow, s - 1, s, 200},      // two windows touched
		{algSlidingCounter, s / 2, 3*s - 1, 300},
		{algSlidingLog, 0, s - 1, 100},
		{algSlidingLog, 0, s, 200},
	} {
		r := boundRule{alg: tc.alg, limit: 100, period: time.Second}
		if got := r.bound(tc.first, tc.last); got != tc.want {
			t.Errorf("%s over [%d, %d] µs: %d, want %d", tc.alg, tc.first, tc.last, got, tc.want)
		}
	}
}

// TestBoundCheck: a check finds no key over the bound of the redis
// target's token bucket, whose hot key is pushed far past its limit and
// admitted near the bound; and finds the echo server, which allows
// everything, over a bound it does not enforce.
func TestBoundCheck(t *testing.T) {
	srv := redistest.Standalone(t)
	keys, err := newKeySpace(distZipf, 100, 1.1)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := testTemplate(t)
	l := &load{mode: modeOpen, rate: 4000, conns: 2, depth: 8, warmup: 200 * time.Millisecond,
		duration: 800 * time.Millisecond, keys: keys, seed: 1}
	rule := boundRule{alg: algTokenBucket, limit: 50, period: time.Second}

	bc := newBoundCheck(rule, keys.n, tmpl.keyed())
	m, err := runLoad(context.Background(), newRedisTarget([]string{srv.Addr}, tmpl, l.depth, rule.limit, defaultPeriod, 1), l, nil, bc)
	if err != nil {
		t.Fatal(err)
	}
	b := m.bound
	t.Logf("redis: %+v", b)
	// Key 0 is offered about 4000/5.2 ≈ 770/s, 15× its limit: it is
	// admitted its bound (a full bucket, then the refill), less the
	// answers cut off at the end (a generous floor: a loaded machine
	// may send late).
	if b == nil || b.Over != 0 || b.Counters == 0 || 2*b.MostAllowed < b.Limit {
		t.Errorf("redis target: %+v", b)
	}

	bc = newBoundCheck(rule, keys.n, tmpl.keyed())
	m, err = runLoad(context.Background(), &socketTarget{path: startEcho(t), tmpl: tmpl, cost: 1}, l, nil, bc)
	if err != nil {
		t.Fatal(err)
	}
	if b := m.bound; b == nil || b.Over == 0 || b.MostAllowed <= b.Limit {
		t.Errorf("echo, which allows everything: %+v", b)
	}

	// Descriptors without {n}: one counter for every key number.
	one, err := parseTemplate("endpoint=/v1/search", keys.n-1)
	if err != nil {
		t.Fatal(err)
	}
	bc = newBoundCheck(rule, keys.n, one.keyed())
	for k := range keys.n {
		bc.admit(k)
	}
	if b := bc.result(); b.Counters != 1 || b.MostAllowed != int64(keys.n) {
		t.Errorf("one counter: %+v", b)
	}
}
