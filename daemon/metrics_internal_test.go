package daemon

import (
	"strings"
	"testing"
	"time"

	"github.com/rld/rld/wire"
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

// TestFrameErrorSeries: rld_frame_errors_total has a series for every
// code the protocol names but none, and none for a code it does not name.
func TestFrameErrorSeries(t *testing.T) {
	for c := wire.CodeNone; c < wire.CodeNotFound+8; c++ {
		named := !strings.HasPrefix(c.String(), "code(")
		has := int(c) < len(frameErrors) && frameErrors[c] != nil
		if has != (named && c != wire.CodeNone) {
			t.Errorf("code %d (%s): series %v", c, c, has)
		}
	}
}
