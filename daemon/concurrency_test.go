package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
)

const concurrencyConfig = `
[[rule]]
name = "exports"
by = ["api_key"]
algorithm = "concurrency"
limit = 2
timeout = "1m"
`

// TestHTTPAcquireRelease: /v1/acquire answers with a lease (body and
// X-RateLimit-Lease), the third concurrent acquire gets 429, and
// /v1/release gives a slot back; an unknown lease is a 404, a bad one a
// 400.
func TestHTTPAcquireRelease(t *testing.T) {
	s := start(t, concurrencyConfig)
	get := func(path string) (int, http.Header, map[string]any) {
		t.Helper()
		resp, err := http.Get("http://" + s.HTTP + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var body map[string]any
		require.NoError(t, json.Unmarshal(b, &body), string(b))
		return resp.StatusCode, resp.Header, body
	}
	code, h, body := get("/v1/acquire?api_key=k")
	require.Equal(t, http.StatusOK, code)
	lease, _ := body["lease"].(string)
	require.NotEmpty(t, lease)
	assert.Equal(t, lease, h.Get("X-RateLimit-Lease"))
	assert.Equal(t, "1", h.Get("X-RateLimit-Remaining"))
	code, _, _ = get("/v1/acquire?api_key=k")
	require.Equal(t, http.StatusOK, code)
	code, h, _ = get("/v1/acquire?api_key=k")
	assert.Equal(t, http.StatusTooManyRequests, code)
	assert.Equal(t, "60", h.Get("Retry-After"))
	code, _, _ = get("/v1/check?api_key=k")
	assert.Equal(t, http.StatusTooManyRequests, code, "a check holds nothing, and finds no slot")

	code, _, body = get("/v1/release?lease=" + url.QueryEscape(lease))
	assert.Equal(t, http.StatusOK, code, body)
	code, _, body = get("/v1/release?lease=" + url.QueryEscape(lease))
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, "UNKNOWN_LEASE", body["error"].(map[string]any)["code"])
	code, _, _ = get("/v1/release?lease=nope")
	assert.Equal(t, http.StatusBadRequest, code)
	code, _, _ = get("/v1/release")
	assert.Equal(t, http.StatusBadRequest, code)
	code, _, _ = get("/v1/acquire?api_key=k&peek=1")
	assert.Equal(t, http.StatusBadRequest, code)
	code, _, body = get("/v1/acquire?api_key=k")
	assert.Equal(t, http.StatusOK, code, "the released slot is free")
	lease, _ = body["lease"].(string)
	code, _, _ = get("/v1/settle?lease=" + url.QueryEscape(lease))
	assert.Equal(t, http.StatusBadRequest, code, "a settle needs its cost")
	code, _, _ = get("/v1/settle?cost=x&lease=" + url.QueryEscape(lease))
	assert.Equal(t, http.StatusBadRequest, code)
	code, _, body = get("/v1/settle?cost=5&lease=" + url.QueryEscape(lease))
	assert.Equal(t, http.StatusOK, code, body)
	code, _, _ = get("/v1/settle?cost=5&lease=" + url.QueryEscape(lease))
	assert.Equal(t, http.StatusNotFound, code, "settled once")
}

// TestConcurrencyFields: a concurrency limit is slots in flight, not a
// quota over a window, so no face advertises a RateLimit-Policy for it:
// the HTTP endpoint sends the slots in X-RateLimit-Limit and the free
// ones in X-RateLimit-Remaining and RateLimit's r (with t, as
// Retry-After, when none is free), and the socket's answer carries no
// quota, from which the clients render the same fields.
func TestConcurrencyFields(t *testing.T) {
	s := start(t, concurrencyConfig)
	get := func(path string) (int, http.Header) {
		t.Helper()
		resp, err := http.Get("http://" + s.HTTP + path)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	code, h := get("/v1/acquire?api_key=f")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "2", h.Get("X-RateLimit-Limit"))
	assert.Equal(t, "1", h.Get("X-RateLimit-Remaining"))
	assert.Equal(t, `"exports";r=1`, h.Get("RateLimit"))
	assert.Empty(t, h.Values("RateLimit-Policy"))

	c := client.New(s.Socket)
	defer c.Close()
	r, err := c.Acquire(context.Background(), []client.Descriptor{{Name: "api_key", Value: "f"}}, 1)
	require.NoError(t, err)
	require.True(t, r.Allowed())
	assert.Equal(t, uint64(2), r.Limit)
	assert.Equal(t, uint64(0), r.Remaining)
	assert.Zero(t, r.Quota, "no quota: the clients render no RateLimit-Policy")
	assert.Zero(t, r.QuotaWindow)

	code, h = get("/v1/acquire?api_key=f")
	require.Equal(t, http.StatusTooManyRequests, code)
	assert.Equal(t, "60", h.Get("Retry-After"))
	assert.Equal(t, `"exports";r=0;t=60`, h.Get("RateLimit"))
	assert.Empty(t, h.Values("RateLimit-Policy"))
}

// TestReleaseUnderContention: 32 callers acquire and release slots of
// one key at once on the embedded store, whose callers' times interleave:
// every release finds its slots, and none is left held.
func TestReleaseUnderContention(t *testing.T) {
	const callers, pairs, limit = 32, 100, 40
	s := start(t, fmt.Sprintf("[[rule]]\nname = \"slots\"\nby = [\"api_key\"]\nalgorithm = \"concurrency\"\nlimit = %d\ntimeout = \"1h\"\n", limit))
	descs := []client.Descriptor{{Name: "api_key", Value: "hot"}}
	var wg sync.WaitGroup
	var lost atomic.Int64
	for range callers {
		wg.Go(func() {
			c := client.New(s.Socket)
			defer c.Close()
			for range pairs {
				r, err := c.Acquire(context.Background(), descs, 1)
				if err != nil || !r.Allowed() {
					t.Errorf("acquire: %+v, %v", r, err)
					return
				}
				if _, err := c.Release(context.Background(), r.Lease); err != nil {
					lost.Add(1)
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, lost.Load(), "releases that did not find their slots")
	c := client.New(s.Socket)
	defer c.Close()
	r, err := c.Peek(context.Background(), descs, 1)
	require.NoError(t, err)
	assert.Equal(t, uint64(limit-1), r.Remaining, "every slot free: a peek looks for one")
}
