package daemon_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

const penaltyDaemonRules = `
[[rule]]
name = "api"
by = ["api_key"]
algorithm = "token_bucket"
limit = 10
period = "1s"
penalty = { after = 3, factor = 2, max = "5s" }
block_after = { refusals = 15, within = "1m", for = "1h" }
`

// TestPenaltiesThroughDaemon: through a real daemon, a client retrying
// every 10 ms while refused gets growing Retry-After values and is
// blocked automatically at the threshold, the block listed (author rld,
// reason automatic), counted in rld_auto_blocks_total and lifted by
// unblock; a client that waits each Retry-After is never penalised nor
// blocked.
func TestPenaltiesThroughDaemon(t *testing.T) {
	t.Parallel()
	l := startLogged(t, t.TempDir(), uidConfig(penaltyDaemonRules, os.Getuid()))
	sock := l.d.SocketPath()
	blocks0 := l.metric(t, `rld_auto_blocks_total{rule="api"}`) // the metric is the process's
	c := client.New(sock)
	defer c.Close()
	ctx := context.Background()
	check := func(key string) client.Result {
		t.Helper()
		res, err := c.Check(ctx, []client.Descriptor{{Name: "api_key", Value: key}}, 1)
		require.NoError(t, err)
		return res
	}

	// The greedy client: its limit used up, it retries every 10 ms.
	first := check("greedy")
	for first.Status == wire.StatusAllowed {
		first = check("greedy")
	}
	require.Equal(t, wire.StatusLimited, first.Status)
	ras := []time.Duration{first.RetryAfter}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := check("greedy")
		if res.Status == wire.StatusBlocked {
			break
		}
		require.Equal(t, wire.StatusLimited, res.Status)
		ras = append(ras, res.RetryAfter)
		require.True(t, time.Now().Before(deadline), "not blocked within 10s; retry-afters %v", ras)
		time.Sleep(10 * time.Millisecond) // the client's behaviour under test
	}
	t.Logf("retry-afters before the block: %v", ras)
	// The block is stored as the 15th early retry is refused (the 16th
	// refusal), and compiled in at once: the next check is blocked.
	require.GreaterOrEqual(t, len(ras), 16, "blocked at the 15th early refusal, not before")
	assert.Less(t, len(ras), 60, "blocked at the threshold (storing the block takes a few checks at most)")
	assert.LessOrEqual(t, ras[0], 101*time.Millisecond, "the first refusal: the limit's own retry-after")
	assert.Greater(t, ras[len(ras)-1], time.Second, "the cooldown grew")
	assert.Greater(t, ras[4], ras[3], "it grows per early retry")

	var list admin.ListResult
	eventually(t, "the automatic block is listed", func() bool {
		list = admin.ListResult{}
		require.Nil(t, changeCall(t, sock, "list", nil, &list))
		return len(list.Blocks) == 1
	})
	b := list.Blocks[0]
	assert.Equal(t, "rld", b.Author)
	assert.True(t, strings.HasPrefix(b.Reason, "automatic: "), b.Reason)
	assert.Equal(t, "api", b.Rule)
	assert.Equal(t, map[string]string{"api_key": "greedy"}, b.Key)
	assert.WithinDuration(t, time.Now().Add(time.Hour), b.Expires, time.Minute)
	assert.Equal(t, blocks0+1, l.metric(t, `rld_auto_blocks_total{rule="api"}`))

	// The cooldown (up to 5 s) is still running: unblock lifts it with
	// the block, and the bucket, untouched while refused, admits.
	require.Nil(t, changeCall(t, sock, "unblock", admin.IDArgs{ID: b.ID}, nil))
	after := check("greedy")
	assert.Equal(t, wire.StatusAllowed, after.Status, "unblock lifts the automatic block and the cooldown: %+v", after)
	list = admin.ListResult{}
	require.Nil(t, changeCall(t, sock, "list", nil, &list))
	assert.Empty(t, list.Blocks)

	// The polite client waits each Retry-After before retrying.
	refused := 0
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		res := check("polite")
		switch res.Status {
		case wire.StatusAllowed:
		case wire.StatusLimited:
			refused++
			assert.LessOrEqual(t, res.RetryAfter, 101*time.Millisecond, "no penalty: the limit's own retry-after")
			time.Sleep(res.RetryAfter)
		default:
			t.Fatalf("the polite client got %v", res.Status)
		}
	}
	assert.Greater(t, refused, 5)
	assert.Equal(t, blocks0+1, l.metric(t, `rld_auto_blocks_total{rule="api"}`), "no block for the polite client")
}

// TestAutoBlockFleet: two daemon processes on one Redis. The automatic
// block that one daemon makes for a client retrying every 10 ms while
// refused is stored in Redis: the other daemon blocks the key too and
// lists it, and unblock through the other daemon lifts it on both.
func TestAutoBlockFleet(t *testing.T) {
	srv := redistest.Standalone(t)
	var ps []*daemontest.Process
	for range 2 {
		p, err := daemontest.StartProcess(fmt.Sprintf(`
[admin]
socket_uids = [%d]
[store]
redis = [%q]
changes_poll = "1s"
timeout = %q
`, os.Getuid(), srv.Addr, fleetTimeout) + penaltyDaemonRules)
		require.NoError(t, err)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("daemon log:\n%s", p.Logs())
			}
			p.Close()
		})
		ps = append(ps, p)
	}
	c0, c1 := client.New(ps[0].Socket), client.New(ps[1].Socket)
	defer c0.Close()
	defer c1.Close()

	deadline := time.Now().Add(10 * time.Second)
	for checkStatus(t, c0, "greedy") != wire.StatusBlocked {
		require.True(t, time.Now().Before(deadline), "not blocked within 10s")
		time.Sleep(10 * time.Millisecond) // the client's behaviour under test
	}
	untilAll(t, 1, 2*time.Second, func(int) bool { return checkStatus(t, c1, "greedy") == wire.StatusBlocked })
	assert.True(t, checkStatus(t, c1, "other").Allowed(), "another key is not blocked")

	var list admin.ListResult
	require.Nil(t, changeCall(t, ps[1].Socket, "list", nil, &list))
	require.Len(t, list.Blocks, 1)
	assert.Equal(t, "rld", list.Blocks[0].Author)
	assert.True(t, strings.HasPrefix(list.Blocks[0].Reason, "automatic: "), list.Blocks[0].Reason)

	// Unblocked through the other daemon: on the daemon that holds the
	// key's cooldown (up to 5 s, still running), the block and the
	// cooldown end together. The bucket itself may still be empty (it
	// refills a unit per 100 ms, and the unblock can come sooner than
	// that after the last refusal): a refusal then carries the limit's
	// own Retry-After (at most a unit's refill, or a local denial's hold
	// of a sync interval per live daemon: 200 ms), not the cooldown's
	// (5 s by then), and the check after it is allowed.
	require.Nil(t, changeCall(t, ps[1].Socket, "unblock", admin.IDArgs{ID: list.Blocks[0].ID}, nil))
	var res client.Result
	untilAll(t, 1, 2*time.Second, func(int) bool {
		var err error
		res, err = c0.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "greedy"}}, 1)
		require.NoError(t, err)
		return res.Status != wire.StatusBlocked
	})
	if res.Status == wire.StatusLimited {
		assert.LessOrEqual(t, res.RetryAfter, 201*time.Millisecond, "the cooldown ends with the block: the limit's own retry-after")
		time.Sleep(res.RetryAfter) // the client waits its Retry-After
		res.Status = checkStatus(t, c0, "greedy")
	}
	assert.Equal(t, wire.StatusAllowed, res.Status, "the cooldown ends with the block")
}

// TestAutoBlockOncePerKey: the same key of the same rule blocked
// automatically twice (two daemons at once, or one after the other), on
// the embedded store and on Redis, is one block, not two.
func TestAutoBlockOncePerKey(t *testing.T) {
	srv := redistest.Standalone(t)
	for name, store := range map[string]string{
		"embedded": "",
		"redis":    fmt.Sprintf("[store]\nredis = [%q]\ntimeout = %q\n", srv.Addr, fleetTimeout),
	} {
		t.Run(name, func(t *testing.T) {
			l := startLogged(t, t.TempDir(), uidConfig(store+penaltyDaemonRules, os.Getuid()))
			sock := l.d.SocketPath()
			for _, key := range []string{"twice", "twice", "other"} {
				l.d.StoreAutoBlock(policy.AutoBlock{Rule: "api", Key: map[string]string{"api_key": key}, For: time.Hour, Reason: "automatic: test"})
			}
			var list admin.ListResult
			require.Nil(t, changeCall(t, sock, "list", nil, &list))
			keys := map[string]int{}
			for _, b := range list.Blocks {
				keys[b.Key["api_key"]]++
			}
			assert.Equal(t, map[string]int{"twice": 1, "other": 1}, keys)
		})
	}
}
