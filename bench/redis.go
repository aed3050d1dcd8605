package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/lua"
	"github.com/rld/rld/wire"
)

// redisKeyPrefix starts the keys of the redis target, apart from rld's.
const redisKeyPrefix = "rld-bench:{"

// tokenBucket is rld's token-bucket script. Exec sends EVALSHA, and EVAL
// once when Redis does not have the script yet, as rld does.
var tokenBucket = func() *rueidis.Lua {
	src, ok := lua.Source("token_bucket")
	if !ok {
		panic("BUG: rld-bench: package lua has no token_bucket script")
	}
	return rueidis.NewLuaScript(src)
}()

// redisTarget checks the load's keys by calling rld's token-bucket script
// on a Redis directly, as a service would without rld: the floor that rld
// on Redis adds its socket hop to. Each connection is one rueidis client
// on one TCP connection, with depth goroutines calling it, which rueidis
// pipelines.
type redisTarget struct {
	addrs []string // one server, or a Cluster's seed nodes
	tmpl  *template
	depth int
	// args are the script's ARGV (see package lua): take, limit, period
	// in µs, burst 0 (the limit), now 0 (Redis TIME), cost.
	args []string
}

func newRedisTarget(addrs []string, tmpl *template, depth int, limit int64, period time.Duration, cost uint32) *redisTarget {
	return &redisTarget{addrs: addrs, tmpl: tmpl, depth: depth, args: []string{
		"take", strconv.FormatInt(limit, 10), strconv.FormatInt(period.Microseconds(), 10), "0", "0",
		strconv.FormatUint(uint64(cost), 10),
	}}
}

func (t *redisTarget) dial() (conn, error) {
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       t.addrs,
		ClientName:        "rld-bench",
		Dialer:            net.Dialer{Timeout: dialTimeout},
		ForceSingleClient: len(t.addrs) == 1,
		DisableCache:      true,
		DisableRetry:      true, // as rld: an increment must never apply twice
		AlwaysPipelining:  true,
		PipelineMultiplex: -1, // one TCP connection
	})
	if err != nil {
		return nil, fmt.Errorf("cannot connect to redis %s: %w", strings.Join(t.addrs, ","), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &redisConn{
		t:       t,
		client:  client,
		ctx:     ctx,
		cancel:  cancel,
		reqs:    make(chan redisReq, t.depth),
		done:    make(chan redisDone, t.depth),
		scratch: make([]byte, 0, 256),
	}
	c.wg.Add(t.depth)
	for range t.depth {
		go c.work()
	}
	return c, nil
}

// redisConn is a conn to Redis. The rueidis calls allocate (command
// building, reply parsing), as they do in any service: this target
// measures what they cost.
type redisConn struct {
	t      *redisTarget
	client rueidis.Client
	ctx    context.Context // cancelled by close
	cancel context.CancelFunc
	reqs   chan redisReq  // queued requests, to the workers
	done   chan redisDone // answers, from the workers
	wg     sync.WaitGroup // the workers

	closeOnce sync.Once
	scratch   []byte // sender side: key building
	ans       answer // receiver side
}

type redisReq struct {
	id  uint32
	key string
}

type redisDone struct {
	id       uint32
	at       int64
	admitted bool
	err      error
}

func (c *redisConn) queue(id uint32, key int) error {
	c.scratch = append(c.scratch[:0], redisKeyPrefix...)
	c.scratch = c.t.tmpl.appendKey(c.scratch, key)
	c.scratch = append(c.scratch, "}:tb"...)
	select {
	case c.reqs <- redisReq{id: id, key: string(c.scratch)}:
		return nil
	case <-c.ctx.Done():
		return net.ErrClosed
	}
}

func (c *redisConn) flush() error { return nil }

// work makes the script calls of the requests it takes, one at a time.
func (c *redisConn) work() {
	defer c.wg.Done()
	for {
		var r redisReq
		select {
		case r = <-c.reqs:
		case <-c.ctx.Done():
			return
		}
		v, err := tokenBucket.Exec(c.ctx, c.client, []string{r.key}, c.t.args).AsIntSlice()
		d := redisDone{id: r.id, at: nanotime(), err: err}
		if err == nil && len(v) != 5 {
			d.err = fmt.Errorf("script replied %d integers, want 5", len(v))
		}
		d.admitted = d.err == nil && v[0] == 1
		select {
		case c.done <- d:
		case <-c.ctx.Done():
			return
		}
	}
}

func (c *redisConn) recv(fn func(*answer)) error {
	select {
	case d := <-c.done:
		c.deliver(d, fn)
	case <-c.ctx.Done():
		return net.ErrClosed
	}
	for {
		select {
		case d := <-c.done:
			c.deliver(d, fn)
		default:
			return nil
		}
	}
}

func (c *redisConn) deliver(d redisDone, fn func(*answer)) {
	c.ans = answer{at: d.at, id: d.id, status: wire.StatusLimited}
	switch {
	case d.err != nil:
		c.ans.status, c.ans.code, c.ans.msg = wire.StatusError, wire.CodeInternal, []byte(d.err.Error())
	case d.admitted:
		c.ans.status = wire.StatusAllowed
	}
	fn(&c.ans)
}

func (c *redisConn) close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		c.wg.Wait()
		c.client.Close()
	})
	return nil
}
