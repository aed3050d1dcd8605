package redisx

import (
	"cmp"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/breaker"
	"github.com/rld/rld/lua"
)

// The ops Store.Do runs are algo.Ops, of every kind. Do sets Admitted
// (OpTakeLease, OpRelease, OpAcquire), Granted (OpLease, OpTakeLease), Parked
// (OpTakeLease), Result and Err. An op with a Holder, and every OpReset,
// goes with the lease accounting: the counter's hash of units out on
// lease (its Redis key and ":out") is the script's KEYS[2]. N below
// 1 counts as 1 for OpTake, OpPeek, OpLease, OpGrant, OpCharge and
// OpRelease; an OpRefund of
// less than 1 is invalid (not sent, Err set), since giving back a unit
// that was never taken would over-admit, and so is an OpTakeLease with
// no Costs or an N below 0, an OpAcquire with no Slots, a Slot 0 in
// them, or of a limit other than Concurrency, and an OpRelease with a
// Slot of another limit. An OpRelease with a Slot releases the slot of
// that id (sent in 16 hex digits), one with none the admission of a
// take. Key is the counter key, as given to
// Store.Take: Do applies AppendKey with the Store's prefix and
// Params.Kind. An OpRefund's TakenAt is on Redis's clock (the Result.At
// of the lease). An op whose Err is a timeout may still have been
// applied. An op with a Once id runs its algorithm's once script
// (lua.OnceSource), its record in the key AppendKey(…) + ":once:" + the
// id in 16 hex digits, in the slot of its counter, holding OnceMark for
// OnceFor; a second op of that key and id runs nothing and its Err wraps
// algo.ErrApplied (the same mark) or algo.ErrOnceConflict (another).

// DefaultSyncTimeout bounds a Sync whose context has no deadline: a sync
// carries an op per hot key, which Redis runs at some µs each, so it
// gets longer than a check.
const DefaultSyncTimeout = 200 * time.Millisecond

// Sync runs ops as Do does, within DefaultSyncTimeout when ctx has no
// deadline. It makes the Store the hot-key cache's backend as it is.
func (s *Store) Sync(ctx context.Context, ops []algo.Op) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultSyncTimeout)
		defer cancel()
	}
	return s.Do(ctx, ops)
}

// scriptSHA is the SHA-1 (hex) of each algorithm's script, indexed by
// algo.Kind: what EVALSHA names and what SCRIPT LOAD replies.
var scriptSHA = func() (s [algo.NumKinds]string) {
	for k := range s {
		src, _ := lua.Source(algo.Kind(k).String())
		sum := sha1.Sum([]byte(src))
		s[k] = hex.EncodeToString(sum[:])
	}
	return s
}()

// onceSHA is scriptSHA for the once scripts (lua.OnceSource), which Do
// sends for the ops with a Once id.
var onceSHA = func() (s [algo.NumKinds]string) {
	for k := range s {
		src, _ := lua.OnceSource(algo.Kind(k).String())
		sum := sha1.Sum([]byte(src))
		s[k] = hex.EncodeToString(sum[:])
	}
	return s
}()

// onceSuffix follows an op's Redis key in the key of its Once record, in
// the same hash slot; 16 hex digits of the id end it.
const onceSuffix = ":once:"

// appendOnceKey appends the key of the record of o's Once id to rkey,
// the Redis key of o.
func appendOnceKey(dst []byte, rkey string, once uint64) []byte {
	dst = append(dst, rkey...)
	dst = append(dst, onceSuffix...)
	const hexDigits = "0123456789abcdef"
	for i := 60; i >= 0; i -= 4 {
		dst = append(dst, hexDigits[once>>uint(i)&0xf])
	}
	return dst
}

// multiChunk bounds the commands of one rueidis DoMulti: rueidis sends a
// pipeline of ClientOption.BlockingPipeline (2000) commands or more over a
// dedicated connection, dialled when none is idle, instead of the shared
// pipelined one. Do sends larger batches as successive chunks over the
// shared connections instead: one more round trip per 1000 ops, small
// beside the ~10 ms Redis takes to run them.
const multiChunk = 1000

// maxParamCache bounds the formatted Params a multiBuf keeps.
const maxParamCache = 1024

// multiBuf holds what one Do, or one node's share of it, needs beyond
// the ops, reused across calls.
type multiBuf struct {
	keys    []string // the Redis key of each op
	pending []int    // the ops still to send
	nodeOf  []int    // by op: its node's index in nodes (pending ops only)
	nodes   []*breaker.Breaker
	nodeRC  []rueidis.Client // by node: its connection's client, nil when none (see guard.route)
	// redirected are the ops that a node's connection answered MOVED
	// or ASK (see send), and moved is set when one was a MOVED.
	redirected []int
	moved      bool
	errs       []error // by node: the error when its ops were not sent
	cmds       []rueidis.Completed
	res        []rueidis.RedisResult
	args       []string
	argKeys    []string // the KEYS of the command being built
	kb         []byte
	// clock is ARGV[5] of the commands: "0", Redis TIME, unless the
	// Store uses the caller's clock (tests).
	clock string
	// one holds the op of a single call (Store.one).
	one [1]algo.Op
	// params caches ARGV[2..4] of the Params seen, which repeat across
	// the ops of one rule.
	params map[algo.Params][3]string
}

var multiBufs = sync.Pool{New: func() any {
	return &multiBuf{params: make(map[algo.Params][3]string), clock: "0"}
}}

// put returns b to the pool, dropping references to the strings and
// results of the call.
func (b *multiBuf) put() {
	clear(b.keys)
	clear(b.cmds)
	clear(b.res)
	clear(b.args)
	clear(b.argKeys)
	clear(b.nodes)
	clear(b.nodeRC)
	clear(b.errs)
	b.keys, b.pending, b.cmds, b.res, b.args = b.keys[:0], b.pending[:0], b.cmds[:0], b.res[:0], b.args[:0]
	b.redirected, b.moved, b.clock, b.one[0] = b.redirected[:0], false, "0", algo.Op{}
	b.nodes, b.nodeRC, b.nodeOf, b.errs = b.nodes[:0], b.nodeRC[:0], b.nodeOf[:0], b.errs[:0]
	if len(b.params) > maxParamCache {
		clear(b.params)
	}
	multiBufs.Put(b)
}

// paramArgs returns p's limit, period (µs) and burst as script arguments.
func (b *multiBuf) paramArgs(p algo.Params) [3]string {
	a, ok := b.params[p]
	if !ok {
		a = [3]string{
			strconv.FormatInt(p.Limit, 10),
			strconv.FormatInt(p.PeriodMicros(), 10),
			strconv.FormatInt(p.Burst, 10),
		}
		b.params[p] = a
	}
	return a
}

// Do runs every op in one pipelined round trip per Redis node: the ops
// are grouped by the node of their key (the breaker the Client picks for
// it), and each node's share is one call through the Client's one call
// path (breaker, rueidis DoMulti, result; see Client), the nodes' calls
// concurrent (batches above 1000 ops go in chunks of 1000, one round
// trip each). It is what the cache's sync loop calls
// to return, renew and refresh many keys at once. Each op is atomic; the
// ops are not a transaction, but the ops of one key run in the order
// given (except that an op sent again after NOSCRIPT may run after a
// later op of its key, should another client load the script in between).
//
// Ops go as EVALSHA. Ops that Redis answers NOSCRIPT (a restart, SCRIPT
// FLUSH or failover lost the script; such an op did not run) are sent
// again after SCRIPT LOAD on their node, and as EVAL if they still meet
// NOSCRIPT: two or three more round trips, only after the loss.
//
// Do lasts until ctx's deadline when ctx has one, else at most the
// Client's Timeout, for all its round trips together; the cancellation of
// ctx is not followed (see Store). Unlike the single calls, whose Timeout
// protects a check's latency, a Do may be given a longer deadline than
// Timeout: Redis runs each op's script in about 10 µs (measured with
// Redis 7.0 on a 2-core machine: 200 ops in 3 ms, 1000 in 12 ms), so a
// batch of thousands needs more than the 5 ms default. Per-op
// outcomes go to each Op's Granted, Result and Err. The ops of a node
// whose circuit breaker is open are not sent: their Err wraps
// breaker.ErrOpen (a *breaker.OpenError); the ops of each node that are
// sent count as one call for its breaker, a failed one when any of them
// fails. The returned error is set only when nothing could be sent (no
// connection to Redis, a closed Client, every breaker concerned open);
// every Op's Err is then set too. Ops are never retried after a timeout:
// a timed-out op may have been applied.
//
// Do may be called concurrently, with distinct ops slices; it does not
// keep ops or their Keys after it returns.
func (s *Store) Do(ctx context.Context, ops []algo.Op) error {
	if len(ops) == 0 {
		return nil
	}
	b := multiBufs.Get().(*multiBuf)
	defer b.put()
	return s.run(ctx, ops, b, true)
}

// one runs op as Do runs a batch of one, but as a single call: within the
// Client's Timeout, or ctx's deadline when sooner (Store.Take and the
// other single calls). The scripts read the caller's clock at now when
// the Store uses it (tests). It returns op with its outcome, and op's
// Err.
func (s *Store) one(ctx context.Context, op algo.Op, now time.Time) (algo.Op, error) {
	b := multiBufs.Get().(*multiBuf)
	defer b.put()
	if s.callerClock && !now.IsZero() {
		b.clock = strconv.FormatInt(now.UnixMicro(), 10)
	}
	b.one[0] = op
	s.run(ctx, b.one[:], b, false)
	op = b.one[0]
	return op, op.Err
}

// run is Do with b, a multiBuf from the pool; batch is set for a batch's
// deadline (ctx's, see Do), else the calls are single (Client.call).
func (s *Store) run(ctx context.Context, ops []algo.Op, b *multiBuf, batch bool) error {
	for i := range ops {
		ops[i].Admitted, ops[i].Granted, ops[i].Parked, ops[i].Result, ops[i].Err = 0, 0, 0, algo.Result{}, nil
	}
	for i := range ops {
		o := &ops[i]
		b.kb = AppendKey(b.kb[:0], s.prefix, o.Key, o.Params.Kind)
		rkey := string(b.kb)
		b.keys = append(b.keys, rkey)
		if err := checkOp(o); err != nil {
			o.Err = fmt.Errorf("redisx: %s %q: %w", o.Kind, rkey, err)
			continue
		}
		b.pending = append(b.pending, i)
	}

	start := time.Now()
	// Each node's ops are one call through its breaker (Client.call),
	// the nodes' calls concurrent.
	b.nodeOf = slices.Grow(b.nodeOf[:0], len(ops))[:len(ops)]
	for _, i := range b.pending {
		b.nodeOf[i] = b.node(s.c.g.route(b.keys[i]))
	}
	b.errs = slices.Grow(b.errs[:0], len(b.nodes))[:len(b.nodes)]
	switch len(b.nodes) {
	case 0: // no valid op
	case 1:
		b.errs[0] = s.sendNode(ctx, ops, b.keys, b.nodes[0], b.nodeRC[0], b, batch)
	default:
		// Stable: the ops of one key, all of one node, keep their order.
		slices.SortStableFunc(b.pending, func(x, y int) int { return b.nodeOf[x] - b.nodeOf[y] })
		var wg sync.WaitGroup
		for n, rest := 0, b.pending; n < len(b.nodes); n++ {
			k := 0
			for k < len(rest) && b.nodeOf[rest[k]] == n {
				k++
			}
			share := rest[:k]
			rest = rest[k:]
			wg.Go(func() {
				nb := multiBufs.Get().(*multiBuf)
				defer nb.put()
				nb.pending, nb.clock = append(nb.pending, share...), b.clock
				b.errs[n] = s.sendNode(ctx, ops, b.keys, b.nodes[n], b.nodeRC[n], nb, batch)
			})
		}
		wg.Wait()
	}
	for i := range ops {
		if o := &ops[i]; !errors.Is(o.Err, algo.ErrInvalidOp) {
			record(o.Kind, start, o.Err)
		}
	}
	var unsent error
	for _, err := range b.errs {
		if err == nil {
			return nil // a node's ops were sent
		}
		unsent = cmp.Or(unsent, err)
	}
	if unsent != nil {
		return fmt.Errorf("redisx: %d ops: none sent: %w", len(ops), unsent)
	}
	return nil
}

// node returns the index in b.nodes of br, adding it with its
// connection's client rc when it is not there yet.
func (b *multiBuf) node(br *breaker.Breaker, rc rueidis.Client) int {
	if n := slices.Index(b.nodes, br); n >= 0 {
		return n
	}
	b.nodes = append(b.nodes, br)
	b.nodeRC = append(b.nodeRC, rc)
	return len(b.nodes) - 1
}

// sendNode sends the ops nb.pending of ops, whose Redis keys are in keys,
// all on the node that br guards (on node, its connection's client, when
// not nil), as one call through the call path (Client.call, as a batch
// when batch is set),
// and fills each op's outcome. It returns nil
// when the ops were sent, else the error (br's refusal, no connection),
// which each op's Err then wraps too.
//
// A share of one op is a single call (Client.single): it goes over the
// direct connection when that is free, as Client.exec's calls do. A
// cache's miss (a takelease) is such a call, and it saves the pipeline's
// two hand-offs between goroutines.
func (s *Store) sendNode(ctx context.Context, ops []algo.Op, keys []string, br *breaker.Breaker, node rueidis.Client, nb *multiBuf, batch bool) error {
	sent := false
	err := s.c.call(ctx, br, node, batch, func(ctx context.Context, rc rueidis.Client) error {
		sent = true
		// When rc is the node's connection, the ops it redirects go
		// again on the rueidis client, which follows redirections; br
		// counts what the node answered, not their outcome elsewhere.
		var cluster rueidis.Client
		if node != nil {
			cluster, _ = s.c.client()
		}
		send := func(rc rueidis.Client) (failure, connErr error) {
			failure, connErr = nb.send(ctx, rc, cluster, br.Name(), ops, keys)
			if n := len(nb.redirected); n > 0 {
				s.c.redirected(n, nb.moved)
				nb.pending = append(nb.pending[:0], nb.redirected...)
				nb.redirected = nb.redirected[:0]
				nb.send(ctx, cluster, nil, "", ops, keys)
			}
			return failure, connErr
		}
		if len(nb.pending) != 1 {
			failure, _ := send(rc)
			return failure
		}
		return s.c.single(rc, func(rc rueidis.Client) (connErr, err error) {
			failure, connErr := send(rc)
			return connErr, failure
		})
	})
	if sent {
		return nil
	}
	for _, i := range nb.pending {
		ops[i].Err = fmt.Errorf("redisx: %s %q: %w", ops[i].Kind, keys[i], err)
	}
	return err
}

// send runs the ops b.pending of ops (whose Redis keys are in keys) on
// rc within ctx, filling each op's outcome (node names the breaker they
// went through: where a lost script is loaded again, see loadScripts).
// When cluster is set (rc is then a node's connection), the ops that rc
// answers MOVED or ASK are not filled: they are left in b.redirected, for
// the caller to send on cluster, and b.moved is set when one was a MOVED.
// It returns the first error among the ops filled that counts as a
// failure for the node's breaker (see isFailure), nil when none does,
// and connErr, the first that was not a Redis reply (the connection's
// own: a timeout, a broken connection).
func (b *multiBuf) send(ctx context.Context, rc, cluster rueidis.Client, node string, ops []algo.Op, keys []string) (failure, connErr error) {
	const (
		evalsha = iota // the first pass
		reload         // after SCRIPT LOAD on every node
		eval           // the last resort: the script's text
	)
	for pass := evalsha; pass <= eval && len(b.pending) > 0; pass++ {
		if pass == reload {
			loadScripts(ctx, rc, node, ops, b.pending)
		}
		b.cmds = b.cmds[:0]
		for _, i := range b.pending {
			b.cmds = append(b.cmds, b.command(rc, &ops[i], keys[i], pass == eval))
		}
		b.res = doMulti(ctx, rc, b.cmds, b.res)
		for _, r := range b.res {
			if err := r.NonRedisError(); err != nil {
				// rueidis may still hold the commands of a call that
				// timed out, in its queue: b.cmds's array must not be
				// reused.
				b.cmds = nil
				connErr = cmp.Or(connErr, err)
				break
			}
		}
		again := b.pending[:0] // filtered in place: again[k] is written after pending[k] is read
		for j, i := range b.pending {
			r := b.res[j]
			if cluster != nil {
				if moved, ask := redirection(r.Error()); moved || ask {
					b.redirected = append(b.redirected, i)
					b.moved = b.moved || moved
					continue
				}
			}
			if pass < eval && isNoScript(r.Error()) {
				again = append(again, i)
				continue
			}
			fill(&ops[i], r, keys[i])
			if failure == nil && isFailure(ops[i].Err) {
				failure = ops[i].Err
			}
		}
		b.pending = again
	}
	return failure, connErr
}

// checkOp rejects an Op that cannot be sent (its error wraps
// algo.ErrInvalidOp).
func checkOp(o *algo.Op) error {
	if err := checkParams(o.Params); err != nil {
		return fmt.Errorf("%w: %w", algo.ErrInvalidOp, err)
	}
	return o.CheckOnce()
}

// hexSlot returns a slot id as the scripts take it: 16 lowercase hex
// digits.
func hexSlot(id uint64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[id&15]
		id >>= 4
	}
	return string(b[:])
}

// command builds the script call of o on rkey: EVALSHA, or EVAL with the
// script's text when eval is set.
func (b *multiBuf) command(rc rueidis.Client, o *algo.Op, rkey string, eval bool) rueidis.Completed {
	pa := b.paramArgs(o.Params)
	b.args = append(b.args[:0], o.Kind.String(), pa[0], pa[1], pa[2], b.clock)
	held := o.Held()
	if held {
		// The lease accounting: KEYS[2] and ARGV[6..9] (lua's doc.go).
		b.args = append(b.args, o.Holder, strconv.FormatInt(o.Spent, 10), strconv.FormatInt(o.SpentAt, 10),
			strconv.FormatInt(o.LeaseLife.Microseconds(), 10))
	}
	for _, a := range o.Kind.Info().Args {
		b.args = appendArg(b.args, o, a)
	}
	k := o.Params.Kind
	keys := append(b.argKeys[:0], rkey)
	if held {
		// The lease accounting's hash is KEYS[2] (lua's doc.go).
		keys = append(keys, rkey+outSuffix)
	}
	script, sha := lua.Source, scriptSHA[k]
	if o.Once != 0 {
		// The once script: the record's key comes last, and so do its
		// mark and life (ms).
		b.args = append(b.args, strconv.FormatInt(o.OnceMark, 10), strconv.FormatInt(max((o.OnceFor+999)/1000, 1), 10))
		b.kb = appendOnceKey(b.kb[:0], rkey, o.Once)
		keys = append(keys, string(b.kb))
		script, sha = lua.OnceSource, onceSHA[k]
	}
	b.argKeys = keys
	if eval {
		src, _ := script(k.String())
		return rc.B().Eval().Script(src).Numkeys(int64(len(keys))).Key(keys...).Arg(b.args...).Build()
	}
	return rc.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(b.args...).Build()
}

// outSuffix ends the key of the hash of a counter's units out on lease:
// the counter's Redis key (AppendKey) and this suffix, in its slot.
const outSuffix = ":out"

// appendArg appends to args the script arguments a of o: see algo.Arg.
func appendArg(args []string, o *algo.Op, a algo.Arg) []string {
	switch a {
	case algo.ArgN:
		return append(args, strconv.FormatInt(max(o.N, 1), 10))
	case algo.ArgWant:
		return append(args, strconv.FormatInt(o.N, 10))
	case algo.ArgTakenAt:
		return append(args, strconv.FormatInt(o.TakenAt, 10))
	case algo.ArgSlot:
		if o.Slot != 0 {
			args = append(args, hexSlot(o.Slot))
		}
	case algo.ArgCosts:
		for _, c := range o.Costs {
			args = append(args, strconv.FormatInt(max(c, 1), 10))
		}
	case algo.ArgSlots:
		for _, id := range o.Slots {
			args = append(args, hexSlot(id))
		}
	}
	return args
}

// fill sets o's outcome from the script's reply r (algo.Op.SetReply).
func fill(o *algo.Op, r rueidis.RedisResult, rkey string) {
	var buf [8]int64
	v, err := replyInts(r, buf[:0], o.Kind.Info().Reply)
	if o.Once != 0 {
		if done := onceDone(r.Error()); done != nil {
			o.Err = fmt.Errorf("redisx: %s %q: %w", o.Kind, rkey, done)
			return
		}
	}
	if err != nil {
		o.Err = fmt.Errorf("redisx: %s %q: %w", o.Kind, rkey, err)
		return
	}
	o.SetReply(v)
}

// replyInts appends to v the n integers of the script reply r, without
// allocating.
func replyInts(r rueidis.RedisResult, v []int64, n int) ([]int64, error) {
	arr, err := r.ToArray()
	if err != nil {
		return nil, err
	}
	if len(arr) != n {
		return nil, fmt.Errorf("script replied %d values, want %d integers", len(arr), n)
	}
	for i := range arr {
		n, err := arr[i].AsInt64()
		if err != nil {
			return nil, fmt.Errorf("script reply: %w", err)
		}
		v = append(v, n)
	}
	return v, nil
}

// doMulti sends cmds with rc.DoMulti (rc.Do for one), in chunks of at
// most multiChunk commands, one after the other so that the commands of one key run in
// order, and returns their results in res's storage.
func doMulti(ctx context.Context, rc rueidis.Client, cmds []rueidis.Completed, res []rueidis.RedisResult) []rueidis.RedisResult {
	res = res[:0]
	if len(cmds) == 1 {
		// A single call: Do spares DoMulti's slice of results.
		return append(res, rc.Do(ctx, cmds[0]))
	}
	for lo := 0; lo < len(cmds); lo += multiChunk {
		res = append(res, rc.DoMulti(ctx, cmds[lo:min(lo+multiChunk, len(cmds))]...)...)
	}
	return res
}

// loadScripts sends SCRIPT LOAD of the scripts that the pending ops use
// to node (a Cluster primary's address, as rueidis names it) when rc
// knows it, else to every node rc knows, concurrently, one pipeline per
// node: a batch's share for one primary loads its scripts there only, so
// the shares of the other primaries, sent concurrently, meet their own
// nodes as they are. Errors are ignored: an op whose node still lacks its
// script meets NOSCRIPT again and goes as EVAL.
func loadScripts(ctx context.Context, rc rueidis.Client, node string, ops []algo.Op, pending []int) {
	var need, needOnce [algo.NumKinds]bool
	for _, i := range pending {
		if ops[i].Once != 0 {
			needOnce[ops[i].Params.Kind] = true
		} else {
			need[ops[i].Params.Kind] = true
		}
	}
	nodes := rc.Nodes()
	if n, ok := nodes[node]; ok {
		nodes = map[string]rueidis.Client{node: n}
	}
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() { n.DoMulti(ctx, scriptLoads(n.B(), &need, &needOnce)...) })
	}
	wg.Wait()
}

// scriptLoads returns the SCRIPT LOAD commands of the scripts of the
// kinds need marks, and of the once variants of those needOnce marks.
func scriptLoads(b rueidis.Builder, need, needOnce *[algo.NumKinds]bool) rueidis.Commands {
	cmds := make(rueidis.Commands, 0, 2*algo.NumKinds)
	for k := range need {
		if need[k] {
			src, _ := lua.Source(algo.Kind(k).String())
			cmds = append(cmds, b.ScriptLoad().Script(src).Build())
		}
		if needOnce[k] {
			src, _ := lua.OnceSource(algo.Kind(k).String())
			cmds = append(cmds, b.ScriptLoad().Script(src).Build())
		}
	}
	return cmds
}

// onceDone returns algo.ErrApplied or algo.ErrOnceConflict when err is
// the once script's RLDAPPLIED or RLDCONFLICT reply (the op's Once id
// was applied already, and nothing ran), else nil.
func onceDone(err error) error {
	re, ok := rueidis.IsRedisErr(err)
	switch {
	case !ok:
		return nil
	case strings.HasPrefix(re.Error(), "RLDAPPLIED"):
		return algo.ErrApplied
	case strings.HasPrefix(re.Error(), "RLDCONFLICT"):
		return algo.ErrOnceConflict
	}
	return nil
}

// isNoScript reports whether err is Redis's NOSCRIPT: the script was not
// run, so the call can be sent again.
func isNoScript(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && re.IsNoScript()
}
