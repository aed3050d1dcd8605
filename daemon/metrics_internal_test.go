package daemon

import (
	"testing"
	"time"
)

// TestCheckDurationAllocatesNothing: timing a check, on the hot path of
// every read batch, allocates nothing.
func TestCheckDurationAllocatesNothing(t *testing.T) {
	now := time.Now()
	if n := testing.AllocsPerRun(1000, func() { checkDuration.UpdateDuration(now) }); n != 0 {
		t.Errorf("checkDuration.UpdateDuration allocates %.1f times per call, want 0", n)
	}
}

// BenchmarkCheckDuration: the cost of timing one read batch.
func BenchmarkCheckDuration(b *testing.B) {
	now := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			checkDuration.UpdateDuration(now)
		}
	})
}
