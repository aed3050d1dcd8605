package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
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
		{{Name: "k", Value: string(make([]byte, wire.MaxValueLen+1))}},
		make([]client.Descriptor, wire.MaxDescriptors+1),
	} {
		_, err := c.Check(ctx, descs, 1)
		assert.ErrorIs(t, err, client.ErrTooLarge)
	}
	require.NoError(t, c.Ping(ctx), "the connection was not broken")
}
