package redisx_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// TestTops: the reports daemons publish are read back with their age by
// Redis TIME; a report not published again within its ttl is dropped;
// publishing again replaces a daemon's report.
func TestTops(t *testing.T) {
	srv := redistest.Standalone(t)
	tops := redisx.NewTops(newClient(t, redisx.Options{Addrs: []string{srv.Addr}, KeyPrefix: "t:"}))
	assert.Equal(t, "{t:top}", tops.Key())
	ctx := context.Background()
	require.NoError(t, tops.Publish(ctx, "d1", `{"a":1}`, time.Hour))
	require.NoError(t, tops.Publish(ctx, "d2", `{"b":2}`, 300*time.Millisecond))
	require.NoError(t, tops.Publish(ctx, "d1", `{"a":3}`, time.Hour))
	reps, err := tops.Reports(ctx, time.Hour)
	require.NoError(t, err)
	require.Len(t, reps, 2)
	byID := map[string]redisx.Report{}
	for _, r := range reps {
		byID[r.Daemon] = r
		assert.Less(t, r.Age, time.Second)
	}
	assert.Equal(t, `{"a":3}`, byID["d1"].Value)
	assert.Equal(t, `{"b":2}`, byID["d2"].Value)

	redistest.WaitFor(t, "d2's report to age past 300ms", func() bool {
		reps, err := tops.Reports(ctx, 300*time.Millisecond)
		return err == nil && len(reps) == 0
	})
	n, err := redistest.Do(srv.Addr, "HLEN", "{t:top}")
	require.NoError(t, err)
	assert.Equal(t, "0", n, "reports older than the reader's ttl are removed")
	_, err = tops.Reports(ctx, 0)
	assert.NoError(t, err)
	assert.Error(t, tops.Publish(ctx, "", "x", time.Second), "no daemon id")
}
