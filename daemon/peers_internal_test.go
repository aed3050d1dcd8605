package daemon

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestPeerCountHoldsAFall: the count of live daemons follows a rise at
// once; a fall (a Redis that restarted empty counts 1, then 2, …) only
// once the higher count has not been seen for heartbeatTTL.
func TestPeerCountHoldsAFall(t *testing.T) {
	var pc peerCount
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	assert.Equal(t, 1, pc.next(1, at(0)))
	assert.Equal(t, 3, pc.next(3, at(time.Second)), "a rise at once")
	// Redis restarted empty: the daemons beat again one by one.
	assert.Equal(t, 3, pc.next(1, at(2*time.Second)))
	assert.Equal(t, 3, pc.next(2, at(2500*time.Millisecond)))
	assert.Equal(t, 3, pc.next(3, at(3*time.Second)))
	// A daemon stopped: counted out once 3 has not been seen for the ttl.
	assert.Equal(t, 3, pc.next(2, at(4*time.Second)))
	assert.Equal(t, 3, pc.next(2, at(5*time.Second)))
	assert.Equal(t, 2, pc.next(2, at(3*time.Second+heartbeatTTL)))
	assert.Equal(t, 2, pc.next(2, at(7*time.Second)))
}
