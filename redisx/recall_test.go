package redisx

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/redistest"
)

func TestRecallMessageRoundTrip(t *testing.T) {
	for _, r := range []Recall{
		{Kind: algo.TokenBucket, Key: []byte("rule\x00\x03abc"), From: "host/1/ab"},
		{Kind: algo.FixedWindow, Key: []byte("a key with spaces } {"), From: ""},
		{Kind: algo.SlidingCounter, Key: []byte{0xff, 0}, From: "x"},
		{Kind: algo.GCRA, Key: []byte("k"), From: "h/2/cd", Refunded: true},
	} {
		got, err := parseRecall(string(appendRecall(nil, r)))
		require.NoError(t, err)
		assert.Equal(t, r, got)
	}
	for _, bad := range []string{"", "0", "0 from", "9 from key", "x from key", "-1 from key", "0 from ", "r from key", "rr0 from key", "r-1 from key", "R0 from key"} {
		_, err := parseRecall(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// FuzzParseRecall: any message parses or is refused, never panics, and
// what parses writes a message that parses to the same recall.
func FuzzParseRecall(f *testing.F) {
	f.Add("0 host/1/ab rule\x00\x03abc")
	f.Add("4  k")
	f.Add("3 a b c")
	f.Fuzz(func(t *testing.T, msg string) {
		r, err := parseRecall(msg)
		if err != nil {
			return
		}
		back, err := parseRecall(string(appendRecall(nil, r)))
		if err != nil || back.Kind != r.Kind || back.From != r.From || back.Refunded != r.Refunded || !bytes.Equal(back.Key, r.Key) {
			t.Fatalf("%q parsed to %+v, written back it parses to %+v (%v)", msg, r, back, err)
		}
	})
}

// TestRecallsPubSub: a recall published by one client reaches a
// subscriber on another, with its key, kind and sender.
func TestRecallsPubSub(t *testing.T) {
	srv := redistest.Standalone(t)
	c, err := New(context.Background(), Options{Addrs: []string{srv.Addr}, KeyPrefix: "rld:"})
	require.NoError(t, err)
	defer c.Close()
	rs := NewRecalls(c)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	subscribed := make(chan struct{}, 1)
	got := make(chan Recall, 1)
	done := make(chan error, 1)
	go func() {
		done <- rs.Subscribe(ctx, func() { subscribed <- struct{}{} }, func(r Recall) { got <- r })
	}()
	select {
	case <-subscribed:
	case <-time.After(5 * time.Second):
		t.Fatal("no subscription")
	}
	want := Recall{Kind: algo.GCRA, Key: []byte("k\x00ey"), From: "d1"}
	n, err := rs.Publish(context.Background(), want)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	select {
	case r := <-got:
		assert.Equal(t, want, r)
	case <-time.After(5 * time.Second):
		t.Fatal("no recall")
	}
	refunded := Recall{Kind: algo.TokenBucket, Key: []byte("k"), From: "d2", Refunded: true}
	_, err = rs.Publish(context.Background(), refunded)
	require.NoError(t, err)
	select {
	case r := <-got:
		assert.Equal(t, refunded, r, "a refund's announcement")
	case <-time.After(5 * time.Second):
		t.Fatal("no refund's announcement")
	}
	_, err = rs.Publish(context.Background(), Recall{Key: []byte("k"), From: "a b"})
	assert.Error(t, err, "a sender id with a space")
	cancel()
	assert.NoError(t, <-done)
}
