package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/header"
	"github.com/rld/rld/wire"
)

const config = `
[[rule]]
name = "search"
match = { endpoint = "/v1/search*" }
by = ["api_key"]
limit = 30
period = "1m"

[[rule]]
name = "tenant"
by = ["tenant"]
algorithm = "fixed_window"
limit = 5000
period = "1h"

[[rule]]
name = "burst"
match = { endpoint = "/v1/burst" }
by = ["api_key"]
limit = 10
burst = 50
period = "1m"

[[rule]]
name = "counter"
match = { endpoint = "/v1/counter" }
by = ["api_key"]
algorithm = "sliding_counter"
limit = 10
period = "1m"

[[rule]]
name = "exports"
match = { endpoint = "/v1/export" }
by = ["api_key"]
algorithm = "concurrency"
limit = 2
timeout = "1m"
`

func start(t *testing.T) *daemontest.Server {
	t.Helper()
	s, err := daemontest.Start(config)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func Example() {
	srv, err := daemontest.Start(config) // a daemon for this example
	if err != nil {
		panic(err)
	}
	defer srv.Close()

	c := client.New(srv.Socket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req := []client.Descriptor{{Name: "api_key", Value: "sk_123"}, {Name: "endpoint", Value: "/v1/search"}}
	res, err := c.Check(ctx, req, 1)
	if err != nil {
		fmt.Println("rld unavailable:", err)
		return
	}
	fmt.Println(res.Status, res.Rule, res.Limit, res.Remaining, res.Window)
	// Output: allowed search 30 29 1m0s
}

// TestConcurrentCallsArePipelined has many goroutines share one client:
// every call gets its own answer and the count admitted is exact.
func TestConcurrentCallsArePipelined(t *testing.T) {
	s := start(t)
	c := client.New(s.Socket)
	defer c.Close()
	const workers, each = 32, 250 // 8000 checks against a limit of 5000
	var allowed, limited atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				res, err := c.Check(context.Background(), []client.Descriptor{{Name: "tenant", Value: "acme"}}, 1)
				if !assert.NoError(t, err) {
					return
				}
				switch res.Status {
				case wire.StatusAllowed:
					allowed.Add(1)
				case wire.StatusLimited:
					limited.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(5000), allowed.Load())
	assert.Equal(t, int64(workers*each-5000), limited.Load())
}

func TestContextDeadline(t *testing.T) {
	s := start(t)
	c := client.New(s.Socket)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Check(ctx, []client.Descriptor{{Name: "tenant", Value: "x"}}, 1)
	assert.ErrorIs(t, err, context.Canceled)
	// the client still works
	require.NoError(t, c.Ping(context.Background()))
}

func TestReconnectAfterDaemonRestart(t *testing.T) {
	s := start(t)
	c := client.New(s.Socket)
	defer c.Close()
	ctx := context.Background()
	require.NoError(t, c.Ping(ctx))
	require.NoError(t, s.Restart())
	// The old connection is gone; at most the first call learns that, and
	// a later one reconnects.
	var err error
	for range 3 {
		if err = c.Ping(ctx); err == nil {
			break
		}
		assert.True(t, errors.Is(err, client.ErrConnLost), "a lost connection is reported as such: %v", err)
	}
	require.NoError(t, err, "the client reconnects to the restarted daemon")
}

func TestErrors(t *testing.T) {
	s := start(t)
	c := client.New(s.Socket)
	_, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "k"}, {Name: "endpoint", Value: "/v1/search"}}, 31)
	var rerr *client.ResponseError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, wire.CodeCostTooLarge, rerr.Code)
	c.Close()
	assert.ErrorIs(t, c.Ping(context.Background()), client.ErrClosed)

	_, err = client.Dial(context.Background(), s.Dir+"/nothing.sock")
	assert.Error(t, err)
}

// TestLimitsCheckedBeforeSending: a request the daemon would refuse fails
// alone, and the calls sharing the connection go on.
func TestLimitsCheckedBeforeSending(t *testing.T) {
	s := start(t)
	c := client.New(s.Socket)
	defer c.Close()
	ctx := context.Background()
	require.NoError(t, c.Ping(ctx))
	long := string(make([]byte, 300))
	for _, descs := range [][]client.Descriptor{
		{{Name: long, Value: "v"}},
		{{Name: "", Value: "v"}},
		make([]client.Descriptor, wire.MaxDescriptors+1),
	} {
		_, err := c.Check(ctx, descs, 1)
		assert.ErrorIs(t, err, client.ErrTooLarge)
	}
	require.NoError(t, c.Ping(ctx), "the connection was not broken")
}

// TestLongValuesSentAsDigests: a value over its limit is no error: it is
// sent as its digest, so distinct long keys keep distinct buckets and a
// long key is limited like any other.
func TestLongValuesSentAsDigests(t *testing.T) {
	s := start(t)
	c := client.New(s.Socket)
	defer c.Close()
	ctx := context.Background()
	for _, n := range []int{wire.MaxValueLen + 1, 100 << 10} {
		a := strings.Repeat("a", n)
		b := strings.Repeat("a", n-1) + "b"
		key := func(k string) []client.Descriptor {
			return []client.Descriptor{{Name: "api_key", Value: k}, {Name: "endpoint", Value: "/v1/burst"}}
		}
		res, err := c.Check(ctx, key(a), 50)
		require.NoError(t, err)
		require.True(t, res.Allowed(), "key a (%d bytes) takes the burst of 50", n)
		res, err = c.Check(ctx, key(a), 1)
		require.NoError(t, err)
		assert.False(t, res.Allowed(), "key a is over its limit")
		res, err = c.Check(ctx, key(b), 1)
		require.NoError(t, err)
		assert.True(t, res.Allowed(), "key b has a bucket of its own")
	}
	for _, attrs := range [][]client.Descriptor{
		{{Name: ":target", Value: strings.Repeat("/t", 9000)}},
		{{Name: ":h:x-api-key", Value: strings.Repeat("k", 5000)}},
	} {
		_, err := c.Check(ctx, attrs, 1)
		require.NoError(t, err, "an attribute over its limit is sent as its digest")
	}
}

// TestResultRendersTheHTTPFields checks that a Result carries what the
// HTTP endpoint renders: the fields of Answer are those of the same
// daemon's HTTP answer to the same check, allowed and limited, with a
// burst (the quota is not the capacity) and a sliding counter (no t while
// allowed). Time moves between the two asks, so a pair that straddles a
// second is asked again; a wrong rendering differs every time.
func TestResultRendersTheHTTPFields(t *testing.T) {
	s := start(t)
	c := client.New(s.Socket)
	defer c.Close()
	ctx := context.Background()
	compare := func(endpoint string) client.Result {
		t.Helper()
		descs := []client.Descriptor{{Name: "api_key", Value: "k"}, {Name: "endpoint", Value: endpoint}}
		var res client.Result
		var mine, theirs map[string]string
		for range 3 {
			var err error
			res, err = c.Peek(ctx, descs, 1)
			require.NoError(t, err)
			fields, _ := header.AppendFields(nil, nil, res.Answer(), time.Now())
			mine = map[string]string{}
			for _, f := range fields {
				mine[f.Name] = string(f.Value)
			}
			resp, err := http.Get("http://" + s.HTTP + "/v1/check?peek=1&api_key=k&endpoint=" + endpoint)
			require.NoError(t, err)
			resp.Body.Close()
			theirs = map[string]string{}
			for _, name := range []string{header.XLimit, header.XRemaining, header.XReset, header.Policy, header.RateLimit, header.RetryAfter} {
				if v := resp.Header.Get(name); v != "" {
					theirs[name] = v
				}
			}
			if assert.ObjectsAreEqual(mine, theirs) {
				break
			}
		}
		require.Equal(t, theirs, mine, "%s: %+v", endpoint, res)
		return res
	}
	take := func(endpoint string, n int) {
		t.Helper()
		for range n {
			_, err := c.Check(ctx, []client.Descriptor{{Name: "api_key", Value: "k"}, {Name: "endpoint", Value: endpoint}}, 1)
			require.NoError(t, err)
		}
	}

	res := compare("/v1/burst")
	assert.Equal(t, uint64(50), res.Limit)
	assert.Equal(t, uint64(10), res.Quota)
	assert.Equal(t, time.Minute, res.QuotaWindow)
	assert.GreaterOrEqual(t, res.Next, time.Duration(0), "a bucket knows when the next unit comes back")
	take("/v1/burst", 50)
	res = compare("/v1/burst")
	assert.Equal(t, wire.StatusLimited, res.Status)
	assert.LessOrEqual(t, res.Next, res.RetryAfter)

	res = compare("/v1/counter")
	assert.Equal(t, uint64(9), res.Quota, "a sliding counter's sustained quota is one below its limit")
	assert.Negative(t, res.Next, "a sliding counter does not know when quota comes back")
	take("/v1/counter", 10)
	res = compare("/v1/counter")
	assert.Equal(t, wire.StatusLimited, res.Status)
	assert.Equal(t, res.RetryAfter, res.Next)
}

// TestAcquireRelease: two slots; the third acquire is limited until a
// release; a lease released twice is unknown.
func TestAcquireRelease(t *testing.T) {
	s := start(t)
	c := client.New(s.Socket)
	defer c.Close()
	ctx := context.Background()
	req := []client.Descriptor{{Name: "api_key", Value: "sk_cc"}, {Name: "endpoint", Value: "/v1/export"}}

	a, err := c.Acquire(ctx, req, 1)
	require.NoError(t, err)
	require.True(t, a.Allowed())
	assert.Equal(t, "exports", a.Rule)
	assert.NotEmpty(t, a.Lease)
	b, err := c.Acquire(ctx, req, 1)
	require.NoError(t, err)
	require.True(t, b.Allowed())
	assert.Equal(t, uint64(0), b.Remaining)
	full, err := c.Acquire(ctx, req, 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusLimited, full.Status)
	assert.Empty(t, full.Lease)
	assert.Greater(t, full.RetryAfter, 59*time.Second, "until the oldest slot's timeout")

	// A check holds no slot: it sees none free.
	chk, err := c.Check(ctx, req, 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusLimited, chk.Status)

	r, err := c.Release(ctx, a.Lease)
	require.NoError(t, err)
	assert.Equal(t, "exports", r.Rule)
	_, err = c.Release(ctx, a.Lease)
	var re *client.ResponseError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, wire.CodeNotFound, re.Code)
	_, err = c.Release(ctx, "not a lease")
	require.ErrorAs(t, err, &re)
	assert.Equal(t, wire.CodeMalformed, re.Code)

	again, err := c.Acquire(ctx, req, 1)
	require.NoError(t, err)
	assert.True(t, again.Allowed())

	// An acquire that no concurrency rule counts is a check whose lease
	// names its units: settling it at 4 charges 3 more.
	search := []client.Descriptor{{Name: "api_key", Value: "sk_cc"}, {Name: "endpoint", Value: "/v1/search"}}
	plain, err := c.Acquire(ctx, search, 1)
	require.NoError(t, err)
	assert.Equal(t, "search", plain.Rule)
	assert.Equal(t, uint64(29), plain.Remaining)
	require.NotEmpty(t, plain.Lease)
	st, err := c.Settle(ctx, plain.Lease, 4)
	require.NoError(t, err)
	assert.Equal(t, "search", st.Rule)
	peek, err := c.Peek(ctx, search, 1)
	require.NoError(t, err)
	assert.Equal(t, uint64(30-4-1), peek.Remaining)
	_, err = c.Settle(ctx, plain.Lease, 4)
	require.ErrorAs(t, err, &re)
	assert.Equal(t, wire.CodeNotFound, re.Code, "settled once")
	_, err = c.Settle(ctx, "", 4)
	assert.ErrorIs(t, err, client.ErrTooLarge)
}

// TestShortDeadlineSparesTheOthers: callers with deadlines too short to
// finish a write share the connection with patient callers; the patient
// ones never lose their call or the connection.
func TestShortDeadlineSparesTheOthers(t *testing.T) {
	s := start(t)
	c := client.New(s.Socket)
	defer c.Close()
	done := make(chan struct{})
	var impatient sync.WaitGroup
	for range 2 {
		impatient.Add(1)
		go func() {
			defer impatient.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Microsecond)
				_, err := c.Check(ctx, []client.Descriptor{{Name: "tenant", Value: "hurry"}}, 1)
				cancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					assert.NoError(t, err, "an impatient call fails only by its own deadline")
					return
				}
			}
		}()
	}
	var patient sync.WaitGroup
	var failed atomic.Int64
	for range 8 {
		patient.Add(1)
		go func() {
			defer patient.Done()
			for range 300 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := c.Check(ctx, []client.Descriptor{{Name: "tenant", Value: "calm"}}, 1)
				cancel()
				if err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	patient.Wait()
	close(done)
	impatient.Wait()
	assert.Zero(t, failed.Load(), "patient calls failed beside the impatient ones")
}

// TestCancelDuringBlockedWrite: against a peer that does not read, a call
// whose context is cancelled returns at once, although its write is
// blocked (the socket's buffer is full), not after the write timeout.
func TestCancelDuringBlockedWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stuck.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if nc, err := ln.Accept(); err == nil {
			accepted <- nc // held open, never read
		}
	}()
	c := client.New(path)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	big := strings.Repeat("v", 1000)
	descs := make([]client.Descriptor, 12)
	for i := range descs {
		descs[i] = client.Descriptor{Name: fmt.Sprintf("d%d", i), Value: big}
	}
	const calls = 200 // 200 × 12 KB: more than the socket buffers hold
	returned := make(chan error, calls)
	for range calls {
		go func() {
			_, err := c.Check(ctx, descs, 1)
			returned <- err
		}()
	}
	nc := <-accepted
	defer nc.Close()
	// Wait until the buffers are full: no call can have an answer, so
	// none returns before the cancel.
	require.Eventually(t, func() bool { return unread(t, nc) > 100_000 }, 5*time.Second, 5*time.Millisecond,
		"the client filled the socket")
	cancel()
	start := time.Now()
	for range calls {
		select {
		case err := <-returned:
			assert.ErrorIs(t, err, context.Canceled)
		case <-time.After(3 * time.Second):
			t.Fatalf("a call still blocked %s after its cancel (the write timeout is 5s)", time.Since(start))
		}
	}
}

// unread returns the bytes waiting in nc's receive queue (SIOCINQ).
func unread(t *testing.T, nc net.Conn) int {
	raw, err := nc.(*net.UnixConn).SyscallConn()
	require.NoError(t, err)
	var n int32
	require.NoError(t, raw.Control(func(fd uintptr) {
		_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	}))
	return int(n)
}

// TestCheckAllocations: a check with a context that never ends allocates
// at most 4 times: the wake-up of a cancelled write is set up only for a
// context that can end.
func TestCheckAllocations(t *testing.T) {
	s := start(t)
	c := client.New(s.Socket)
	defer c.Close()
	descs := []client.Descriptor{{Name: "tenant", Value: "allocs"}}
	require.NoError(t, c.Ping(context.Background()))
	background := testing.AllocsPerRun(200, func() {
		_, _ = c.Check(context.Background(), descs, 1)
	})
	assert.LessOrEqual(t, background, 4.0, "allocations per check with context.Background")
}
