package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/policy"
)

// newAutoBlockDaemon returns a daemon on the embedded store, not
// running, whose rule api has a block_after.
func newAutoBlockDaemon(t *testing.T) *Daemon {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rld.toml")
	require.NoError(t, os.WriteFile(cfg, []byte(`
[[rule]]
name = "auto-api"
by = ["api_key"]
limit = 10
period = "1s"
block_after = { refusals = 3, within = "1m", for = "1h" }
`), 0o644))
	d, err := New(Options{ConfigPath: cfg, Socket: filepath.Join(dir, "rld.sock"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return d
}

func autoBlockFor(key string) policy.AutoBlock {
	return policy.AutoBlock{Rule: "auto-api", Key: map[string]string{"api_key": key}, For: time.Hour, Reason: "automatic: test"}
}

// TestAutoBlockBurstCompilesOnce: a burst of automatic blocks, from
// several checks' goroutines at once while a change holds the daemon's
// change lock, is stored with one compile of the policy for all of them,
// not one per block.
func TestAutoBlockBurstCompilesOnce(t *testing.T) {
	d := newAutoBlockDaemon(t)
	defer d.stopAutoBlocks()
	const n = 200
	before := d.compiles.Load()
	d.reloadMu.Lock() // a change in progress
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				d.autoBlock(autoBlockFor(fmt.Sprintf("abuser-%d", i)))
			}
		}()
	}
	wg.Wait()
	d.reloadMu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for len(d.pol().Changes().Blocks) < n {
		require.True(t, time.Now().Before(deadline), "the %d blocks not in force within 10s", n)
		time.Sleep(time.Millisecond) // polls a condition
	}
	assert.Equal(t, int64(1), d.compiles.Load()-before, "one compile for the burst")
	for _, b := range d.pol().Changes().Blocks {
		assert.Equal(t, autoBlockAuthor, b.Author)
	}

	// Later blocks, one at a time: one compile each.
	before = d.compiles.Load()
	for i := range 3 {
		d.autoBlock(autoBlockFor(fmt.Sprintf("late-%d", i)))
		for len(d.pol().Changes().Blocks) < n+i+1 {
			require.True(t, time.Now().Before(deadline), "a late block not in force")
			time.Sleep(time.Millisecond) // polls a condition
		}
	}
	assert.Equal(t, int64(3), d.compiles.Load()-before)
}

// TestAutoBlockStopWaits: stopping the automatic blocks stores those
// queued and returns after their goroutine has returned (no goroutine
// left behind); a block asked for after it is dropped, no goroutine
// started.
func TestAutoBlockStopWaits(t *testing.T) {
	d := newAutoBlockDaemon(t)
	base := runtime.NumGoroutine()
	d.reloadMu.Lock() // the blocks wait for it: they are queued, not stored, when stop is called
	for i := range 50 {
		d.autoBlock(autoBlockFor(fmt.Sprintf("abuser-%d", i)))
	}
	assert.Empty(t, d.pol().Changes().Blocks, "queued, not stored yet")
	stopped := make(chan struct{})
	go func() { d.stopAutoBlocks(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned before the queued blocks were stored")
	case <-time.After(50 * time.Millisecond): // a bound is the point: stop must still be waiting
	}
	d.reloadMu.Unlock()
	<-stopped
	assert.Len(t, d.pol().Changes().Blocks, 50, "the blocks queued are stored before stop returns")

	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		require.True(t, time.Now().Before(deadline), "goroutines: %d, %d before the blocks", runtime.NumGoroutine(), base)
		time.Sleep(time.Millisecond) // polls a condition
	}
	d.autoBlock(autoBlockFor("after-stop"))
	assert.Len(t, d.pol().Changes().Blocks, 50, "a block after stop is dropped")
	assert.LessOrEqual(t, runtime.NumGoroutine(), base, "no goroutine started after stop")
	d.stopAutoBlocks() // idempotent
}

// TestAutoBlockIDSeparatesFields: two keys whose names and values run
// together the same way get different ids.
func TestAutoBlockIDSeparatesFields(t *testing.T) {
	a := policy.AutoBlock{Rule: "r", Key: map[string]string{"a": "x\x00b=y", "b": "z"}}
	b := policy.AutoBlock{Rule: "r", Key: map[string]string{"a": "x", "b": "y\x00b=z"}}
	assert.NotEqual(t, autoBlockID(a), autoBlockID(b))
	assert.Equal(t, autoBlockID(a), autoBlockID(policy.AutoBlock{Rule: "r", Key: map[string]string{"b": "z", "a": "x\x00b=y"}}))
}
