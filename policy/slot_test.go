package policy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/memstore"
)

const slotRules = `
[[rule]]
name = "exports"
algorithm = "concurrency"
by = ["api_key"]
limit = 3
timeout = "1m"
`

// held counts the acquires of key that fit at now, and releases them.
func heldSlots(t *testing.T, p *Policy, now time.Time) (free int) {
	t.Helper()
	var sc Scratch
	var d Decision
	var leases []string
	for range 10 {
		l := p.AcquireTo(context.Background(), &Request{Now: now, Descs: descs("api_key=k"), Cost: 1}, &sc, &d)
		if d.Status != StatusAllowed {
			break
		}
		leases = append(leases, string(l))
	}
	for _, l := range leases {
		require.Equal(t, StatusAllowed, p.Release(context.Background(), now, []byte(l)).Status)
	}
	return len(leases)
}

// TestReleaseOnceAtOneMicrosecond: two acquires at one microsecond (as
// one store call answers a coalesced pair); A released twice frees its
// slot once: the second is unknown, B's slot stays held, and the limit
// is never exceeded.
func TestReleaseOnceAtOneMicrosecond(t *testing.T) {
	p := newPolicy(t, slotRules, memstore.New(memstore.Options{}))
	ctx := context.Background()
	var sc Scratch
	var d Decision
	a := string(p.AcquireTo(ctx, &Request{Now: t0, Descs: descs("api_key=k"), Cost: 1}, &sc, &d))
	require.Equal(t, StatusAllowed, d.Status)
	b := string(p.AcquireTo(ctx, &Request{Now: t0, Descs: descs("api_key=k"), Cost: 1}, &sc, &d))
	require.Equal(t, StatusAllowed, d.Status)
	require.NotEqual(t, a, b)

	now := t0.Add(time.Second)
	require.Equal(t, StatusAllowed, p.Release(ctx, now, []byte(a)).Status)
	r := p.Release(ctx, now, []byte(a))
	assert.Equal(t, CodeNotFound, r.Code, "A released twice")
	assert.ErrorIs(t, r.Err, ErrUnknownLease)
	assert.Equal(t, 2, heldSlots(t, p, now), "B holds one of the 3 slots")
	require.Equal(t, StatusAllowed, p.Release(ctx, now, []byte(b)).Status, "B's own release")
	assert.Equal(t, 3, heldSlots(t, p, now))
}

// TestForgedLeaseChangesNothing: a lease with a byte of its signature
// flipped, one signed with another key, and one of the format before
// slot ids (version 2, even signed with this key) free nothing; the
// genuine lease then releases its slot.
func TestForgedLeaseChangesNothing(t *testing.T) {
	p := newPolicy(t, slotRules, memstore.New(memstore.Options{}))
	ctx := context.Background()
	var sc Scratch
	var d Decision
	now := t0
	lease := string(p.AcquireTo(ctx, &Request{Now: now, Descs: descs("api_key=k"), Cost: 1}, &sc, &d))
	require.Equal(t, StatusAllowed, d.Status)
	raw, err := leaseEncoding.DecodeString(lease)
	require.NoError(t, err)

	flipped := append([]byte(nil), raw...)
	flipped[len(flipped)-1] ^= 1
	r := p.Release(ctx, now, []byte(base64.RawURLEncoding.EncodeToString(flipped)))
	assert.Equal(t, CodeNotFound, r.Code, "a flipped signature")
	assert.ErrorIs(t, r.Err, ErrUnknownLease)
	r = p.Settle(ctx, now, []byte(base64.RawURLEncoding.EncodeToString(flipped)), 1)
	assert.Equal(t, CodeNotFound, r.Code, "a flipped signature, settled")

	other := newPolicy(t, slotRules, memstore.New(memstore.Options{}))
	other.stores.LeaseKey = []byte("another fleet's lease key")
	otherLease := other.AcquireTo(ctx, &Request{Now: now, Descs: descs("api_key=x"), Cost: 1}, &sc, &d)
	require.Equal(t, StatusAllowed, d.Status)
	r = p.Release(ctx, now, otherLease)
	assert.Equal(t, CodeNotFound, r.Code, "signed with another key")

	old := append([]byte(nil), raw[:len(raw)-leaseTag]...)
	old[0] = 2
	mac := hmac.New(sha256.New, p.leaseKey())
	mac.Write(old)
	old = mac.Sum(old)[:len(old)+leaseTag]
	r = p.Release(ctx, now, []byte(base64.RawURLEncoding.EncodeToString(old)))
	assert.Equal(t, CodeMalformed, r.Code, "a lease of version 2")
	assert.ErrorIs(t, r.Err, ErrBadLease)

	assert.Equal(t, 2, heldSlots(t, p, now), "the slot is still held")
	require.Equal(t, StatusAllowed, p.Release(ctx, now, []byte(lease)).Status, "the genuine lease releases it")
	assert.Equal(t, 3, heldSlots(t, p, now))
}

// TestReleaseWithoutSharedKey: without a shared lease key (Stores.LeaseKey
// nil) a daemon signs with a key of its own process; another whose key
// differs finds the lease unknown and frees nothing.
func TestReleaseWithoutSharedKey(t *testing.T) {
	st := memstore.New(memstore.Options{})
	p := newPolicy(t, slotRules, st)
	other := newPolicy(t, slotRules, st)
	other.stores.LeaseKey = []byte("a daemon's own random key, elsewhere")
	ctx := context.Background()
	var sc Scratch
	var d Decision
	lease := p.AcquireTo(ctx, &Request{Now: t0, Descs: descs("api_key=k"), Cost: 1}, &sc, &d)
	require.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, CodeNotFound, other.Release(ctx, t0, lease).Code)
	assert.Equal(t, 2, heldSlots(t, p, t0))
	assert.Equal(t, StatusAllowed, p.Release(ctx, t0, lease).Status)
}
