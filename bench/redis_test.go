package main

import (
	"context"
	"testing"
	"time"

	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// TestRedisTarget runs rld's token-bucket script on a Redis of the
// test's own: under a high limit every check is allowed; under a limit
// of 10 per second on one hot key, about 10 are and the rest limited.
func TestRedisTarget(t *testing.T) {
	srv := redistest.Standalone(t)
	keys, err := newKeySpace(distHot, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := testTemplate(t)
	l := &load{mode: modeOpen, rate: 2000, conns: 2, depth: 4, warmup: 100 * time.Millisecond,
		duration: 300 * time.Millisecond, keys: keys, seed: 1}
	for _, tc := range []struct {
		limit       int64
		minAllowed  int64
		maxAllowed  int64
		wantLimited bool
	}{
		{limit: defaultLimit, minAllowed: 550, maxAllowed: 600},
		{limit: 10, minAllowed: 0, maxAllowed: 15, wantLimited: true},
	} {
		tmpl2 := *tmpl // a key of its own for each limit
		tmpl2.descs = append([]tmplDesc{{name: []byte("case"), parts: [][]byte{[]byte(group(tc.limit))}}}, tmpl.descs...)
		m, err := runLoad(context.Background(), newRedisTarget([]string{srv.Addr}, &tmpl2, l.depth, tc.limit, defaultPeriod, 1), l, nil, nil)
		if err != nil {
			t.Fatalf("limit %d: %v", tc.limit, err)
		}
		allowed, limited := m.byStatus[wire.StatusAllowed], m.byStatus[wire.StatusLimited]
		t.Logf("limit %d: %d allowed, %d limited, p50 %v", tc.limit, allowed, limited, time.Duration(m.hist.ValueAtQuantile(50)))
		if m.byStatus[wire.StatusError] != 0 || m.timeouts() != 0 {
			t.Errorf("limit %d: %d errors (%s), %d timeouts", tc.limit, m.byStatus[wire.StatusError], m.firstErr, m.timeouts())
		}
		if allowed < tc.minAllowed || allowed > tc.maxAllowed || (limited > 0) != tc.wantLimited {
			t.Errorf("limit %d: %d allowed, %d limited", tc.limit, allowed, limited)
		}
	}
}
