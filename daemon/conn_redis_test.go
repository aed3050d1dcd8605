package daemon_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// connConfig is rld.toml for the tests of a connection's frames on Redis:
// an allow and a deny list, which the host decides, and a cached and a
// strict rule by api_key, selected by the descriptor mode, with limits no
// test reaches.
func connConfig(redisAddr string, maxInflight int) string {
	return fmt.Sprintf(`allow = ["api_key=internal"]
deny  = ["api_key=revoked"]

[server]
max_inflight = %d

[store]
redis = [%q]
timeout = "2s"

[[rule]]
name = "cached"
match = { mode = "cached" }
by = ["api_key"]
limit = 1000000000
period = "1s"

[[rule]]
name = "strict"
match = { mode = "strict" }
by = ["api_key"]
limit = 1000000000
period = "1s"
mode = "strict"
`, maxInflight, redisAddr)
}

// startConnDaemon starts a daemon on connConfig behind a proxy to a new
// Redis, so that a test can hold the daemon's Redis calls.
func startConnDaemon(t *testing.T, maxInflight int) (*daemontest.Server, *redistest.Proxy) {
	t.Helper()
	srv := redistest.Standalone(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	return start(t, connConfig(proxy.Addr(), maxInflight)), proxy
}

// workers counts the goroutines of connections' workers in this process.
func workers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "daemon.(*conn).work(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// readAll reads n answers and returns them by id, failing on a duplicate.
func readAll(t *testing.T, r *rawConn, n int) map[uint32]wire.Response {
	t.Helper()
	got := make(map[uint32]wire.Response, n)
	for range n {
		res := r.mustRead()
		_, dup := got[res.ID]
		require.False(t, dup, "id %d answered twice", res.ID)
		got[res.ID] = res
	}
	return got
}

// TestRedisWaitHoldsNoOtherAnswer: a check that waits on Redis does not
// hold back the answers the host decides that were pipelined after it on
// the same connection: with Redis held, they all arrive; the waiting
// check's answer arrives once Redis is back.
func TestRedisWaitHoldsNoOtherAnswer(t *testing.T) {
	s, proxy := startConnDaemon(t, 1024)
	r := dialRaw(t, s.Socket)
	// The cached key takes its lease: its next checks are the host's.
	for i := range 3 {
		r.write(checkFrame(uint32(900+i), "api_key=warm", "mode=cached"))
		require.Equal(t, wire.StatusAllowed, r.mustRead().Status)
	}
	// One request at a time, strict ones among them: decided on the
	// read loop, no worker started.
	for i := range 3 {
		r.write(checkFrame(uint32(910+i), "api_key=one", "mode=strict"))
		require.Equal(t, wire.StatusAllowed, r.mustRead().Status)
	}
	assert.Zero(t, workers(), "workers for a client with one request at a time")

	proxy.Blackhole()
	var batch []byte
	batch = append(batch, checkFrame(1, "api_key=s1", "mode=strict")...) // waits on Redis
	batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpPing, ID: 2})
	batch = append(batch, checkFrame(3, "api_key=internal", "mode=strict")...)
	batch = append(batch, checkFrame(4, "api_key=revoked", "mode=strict")...)
	for id := uint32(5); id <= 8; id++ {
		batch = append(batch, checkFrame(id, "api_key=warm", "mode=cached")...)
	}
	bad := checkFrame(9, "api_key=warm", "mode=cached")
	bad[4] = 9 // an unknown version: answered with an error
	batch = append(batch, bad...)
	r.write(batch)

	local := readAll(t, r, 8) // read while Redis is held
	for id := uint32(2); id <= 9; id++ {
		require.Contains(t, local, id, "the host's answers arrive while a check waits on Redis")
	}
	assert.Equal(t, wire.StatusAllowed, local[2].Status)
	assert.Equal(t, wire.StatusAllowed, local[3].Status)
	assert.Equal(t, wire.StatusBlocked, local[4].Status)
	for id := uint32(5); id <= 8; id++ {
		assert.Equal(t, wire.StatusAllowed, local[id].Status)
		assert.Equal(t, "cached", string(local[id].Rule))
	}
	assert.Equal(t, wire.CodeBadVersion, local[9].Code)

	proxy.Heal()
	res := r.mustRead()
	assert.Equal(t, uint32(1), res.ID, "the check that waited on Redis, after Redis is back")
	assert.True(t, res.Status.Allowed(), "status %v", res.Status)
	assert.Equal(t, "strict", string(res.Rule))
	r.ping(10)
}

// TestRedisPipelinedAnswersMatchIDs: several connections pipeline
// thousands of frames each over keys of a cached and a strict rule,
// pings among them; every frame is answered once, under its own id, by
// the rule its descriptors select. When the connections close, their
// workers end.
func TestRedisPipelinedAnswersMatchIDs(t *testing.T) {
	s, _ := startConnDaemon(t, 64)
	const conns, frames, chunk, keys = 4, 3000, 100, 12
	var wg sync.WaitGroup
	for c := range conns {
		r := dialRaw(t, s.Socket)
		want := make(map[uint32]string, frames) // id → rule ("" for a ping)
		var stream []byte
		for i := range frames {
			id := uint32(c*frames + i + 1)
			switch k := (i * 7) % keys; {
			case i%25 == 0:
				stream = wire.AppendRequest(stream, &wire.Request{Op: wire.OpPing, ID: id})
				want[id] = ""
			case k%3 == 0:
				stream = append(stream, checkFrame(id, fmt.Sprintf("api_key=k%d", k), "mode=strict")...)
				want[id] = "strict"
			default:
				stream = append(stream, checkFrame(id, fmt.Sprintf("api_key=k%d", k), "mode=cached")...)
				want[id] = "cached"
			}
		}
		wg.Go(func() {
			// Written in chunks of frames while the answers are read.
			for off := 0; off < len(stream); {
				end := off
				for range chunk {
					if end == len(stream) {
						break
					}
					end += 4 + int(binary.BigEndian.Uint32(stream[end:]))
				}
				if _, err := r.c.Write(stream[off:end]); err != nil {
					t.Error(err)
					return
				}
				off = end
			}
		})
		wg.Go(func() {
			defer r.c.Close()
			seen := make(map[uint32]bool, frames)
			for range frames {
				res, err := r.read()
				if err != nil {
					t.Errorf("connection %d: %d answers of %d: %v", c, len(seen), frames, err)
					return
				}
				rule, ok := want[res.ID]
				if !ok || seen[res.ID] {
					t.Errorf("connection %d: unexpected or repeated id %d", c, res.ID)
					return
				}
				seen[res.ID] = true
				if res.Status != wire.StatusAllowed || string(res.Rule) != rule {
					t.Errorf("connection %d: id %d: %v by %q, want allowed by %q", c, res.ID, res.Status, res.Rule, rule)
				}
			}
		})
	}
	wg.Wait()
	redistest.WaitFor(t, "the closed connections' workers end", func() bool { return workers() == 0 })
}

// TestRedisFramesMidStream: malformed frames among frames that wait on
// Redis are answered with their error and the connection goes on; a frame
// that loses the framing is answered last, after the frames that waited,
// and the connection closes.
func TestRedisFramesMidStream(t *testing.T) {
	s, proxy := startConnDaemon(t, 1024)
	r := dialRaw(t, s.Socket)
	good := checkFrame(0, "api_key=m", "mode=cached")
	withID := func(f []byte, id uint32) []byte {
		f = clone(f)
		binary.BigEndian.PutUint32(f[8:], id)
		return f
	}
	var batch []byte
	batch = append(batch, checkFrame(1, "api_key=m1", "mode=strict")...)
	badVersion := withID(good, 2)
	badVersion[4] = 9
	batch = append(batch, badVersion...)
	batch = append(batch, checkFrame(3, "api_key=m3", "mode=cached")...)
	unknownOp := withID(good, 4)
	unknownOp[5] = 0x42
	batch = append(batch, unknownOp...)
	batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpPing, ID: 5})
	batch = append(batch, checkFrame(6, "api_key=m1", "mode=strict")...)
	r.write(batch)
	got := readAll(t, r, 6)
	assert.Equal(t, wire.CodeBadVersion, got[2].Code)
	assert.Equal(t, wire.CodeUnknownOp, got[4].Code)
	for _, id := range []uint32{1, 3, 5, 6} {
		assert.Equal(t, wire.StatusAllowed, got[id].Status, "id %d", id)
	}
	r.ping(7) // the connection still serves

	// Framing lost behind a check held on Redis: that check is answered
	// first, then frame_too_large, then the connection closes.
	proxy.Blackhole()
	batch = checkFrame(10, "api_key=m10", "mode=strict")
	batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpPing, ID: 11})
	tooLarge := withID(good, 77)
	binary.BigEndian.PutUint32(tooLarge, wire.MaxFrame)
	batch = append(batch, tooLarge...)
	r.write(batch)
	assert.Equal(t, uint32(11), r.mustRead().ID, "the ping, while the check waits on Redis")
	proxy.Heal()
	assert.Equal(t, uint32(10), r.mustRead().ID)
	res := r.mustRead()
	assert.Equal(t, uint32(77), res.ID)
	assert.Equal(t, wire.CodeFrameTooLarge, res.Code)
	_, err := r.read()
	assert.ErrorIs(t, err, io.EOF)
}

// TestRedisMaxInflight: a connection holds at most max_inflight frames
// waiting on Redis; at the bound it reads no more until one is answered,
// so a ping behind the bound is answered after a waiting check, and no
// more workers run than the bound.
func TestRedisMaxInflight(t *testing.T) {
	const bound = 4
	s, proxy := startConnDaemon(t, bound)
	r := dialRaw(t, s.Socket)
	r.ping(1000) // Redis is reached before it is held
	proxy.Blackhole()
	var batch []byte
	for id := uint32(1); id <= 2*bound; id++ {
		batch = append(batch, checkFrame(id, fmt.Sprintf("api_key=b%d", id), "mode=strict")...)
	}
	batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpPing, ID: 100})
	r.write(batch)
	first := r.mustRead()
	assert.LessOrEqual(t, first.ID, uint32(bound), "a check held at the bound is answered before the ping behind it")
	proxy.Heal()
	got := readAll(t, r, 2*bound)
	got[first.ID] = first
	assert.Len(t, got, 2*bound+1)
	assert.Contains(t, got, uint32(100))
	assert.LessOrEqual(t, workers(), bound, "workers")
}

// TestRedisDrainAnswersWaitingFrames: a drain that begins while frames
// wait on Redis answers them all before the connection closes, and the
// workers end.
func TestRedisDrainAnswersWaitingFrames(t *testing.T) {
	s, proxy := startConnDaemon(t, 1024)
	r := dialRaw(t, s.Socket)
	r.ping(1000)
	proxy.Blackhole()
	const n = 200
	var batch []byte
	for id := uint32(1); id <= n; id++ {
		if id%2 == 0 {
			batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpPing, ID: id})
		} else {
			batch = append(batch, checkFrame(id, fmt.Sprintf("api_key=d%d", id%16), "mode=strict")...)
		}
	}
	r.write(batch)
	got := readAll(t, r, n/2) // the pings: every frame has been read
	for id := range got {
		require.Zero(t, id%2, "only pings answered while Redis is held")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop() }()
	redistest.WaitFor(t, "the drain begins (the socket file is removed)", func() bool {
		_, err := os.Stat(s.Socket)
		return errors.Is(err, fs.ErrNotExist)
	})
	proxy.Heal()
	rest := readAll(t, r, n/2)
	for id, res := range rest {
		assert.Equal(t, uint32(1), id%2, "id %d", id)
		assert.True(t, res.Status.Allowed(), "id %d: %v", id, res.Status)
	}
	_, err := r.read()
	assert.ErrorIs(t, err, io.EOF, "closed once everything is answered")
	require.NoError(t, <-stopped)
	assert.Zero(t, workers(), "workers left after the drain")
}

// TestRedisAdminInOrder: an ADMIN frame is answered after the frames
// before it, those waiting on Redis included, and before the frames
// after it.
func TestRedisAdminInOrder(t *testing.T) {
	s, proxy := startConnDaemon(t, 1024)
	r := dialRaw(t, s.Socket)
	r.ping(1000)
	proxy.Blackhole()
	batch := checkFrame(1, "api_key=a1", "mode=strict")
	batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpAdmin, ID: 2, Body: []byte(`{"op":"config"}`)})
	batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpPing, ID: 3})
	r.write(batch)
	// The check waits on Redis in a worker; the read loop waits for it
	// before it answers the ADMIN frame.
	redistest.WaitFor(t, "the check waits on Redis", func() bool { return workers() == 1 })
	proxy.Heal()
	var ids []uint32
	for range 3 {
		f := readFrame(t, r)
		ids = append(ids, binary.BigEndian.Uint32(f[8:]))
	}
	assert.Equal(t, []uint32{1, 2, 3}, ids)
}
