package region

import (
	"testing"
	"time"

	"github.com/rld/rld/redistest"
)

func TestRenewerElectionTakesOverWhenHolderStops(t *testing.T) {
	s := redistest.Standalone(t)
	c := client(t, s.Addr)
	interval := 50 * time.Millisecond
	a := newRegion(t, "eu", "a", c, c, interval)
	b := newRegion(t, "eu", "b", c, c, interval)
	a.Start()
	redistest.WaitFor(t, "a elected", a.Renewer)
	// b stays out while a holds the role.
	for range 5 {
		b.tick()
		if b.Renewer() {
			t.Fatal("b elected while a holds the role")
		}
	}
	b.Start()
	// Stop a without resigning: its key lapses after 3 intervals.
	a.crash()
	stopped := time.Now()
	redistest.WaitFor(t, "b elected", b.Renewer)
	// The key lapses at most 3 intervals after the crash, and b tries
	// once an interval: 4 intervals, plus scheduling on a loaded host.
	took := time.Since(stopped)
	t.Logf("b took over %s after a stopped (interval %s)", took, interval)
	if took > (renewerTTLIntervals+1)*interval+100*time.Millisecond {
		t.Fatalf("take-over took %s, want within %d intervals", took, renewerTTLIntervals+1)
	}
}

// crash stops r's loop as a killed daemon would stop: without resigning
// the renewer role.
func (r *Region) crash() {
	r.once.Do(func() {
		close(r.stop)
		<-r.done
		if r.subCancel != nil {
			r.subCancel()
			<-r.subDone
		}
		if r.renewer.held {
			renewerG.Add(-1)
		}
	})
}
