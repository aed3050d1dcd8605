package redisx

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/lua"
)

// The ops Store.Do runs are algo.Ops, of every kind. Do sets Admitted
// (OpTakeLease), Granted (OpLease, OpTakeLease), Result and Err. N below
// 1 counts as 1 for OpTake, OpPeek, OpLease and OpGrant; an OpRefund of
// less than 1 is invalid (not sent, Err set), since giving back a unit
// that was never taken would over-admit, and so is an OpTakeLease with
// no Costs or an N below 0. Key is the counter key, as given to
// Store.Take: Do applies AppendKey with the Store's prefix and
// Params.Kind. An OpRefund's TakenAt is on Redis's clock (the Result.At
// of the lease). An op whose Err is a timeout may still have been
// applied.

// opKindMetric maps an op kind to the op its calls are counted under in
// metrics (with the duration of the whole Do).
var opKindMetric = [algo.NumOpKinds]op{
	algo.OpTake: opTake, algo.OpPeek: opPeek, algo.OpLease: opLease, algo.OpTakeLease: opBatch,
	algo.OpRefund: opRefund, algo.OpReset: opReset, algo.OpGrant: opGrant,
}

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
var scriptSHA = func() (s [algo.FixedWindow + 1]string) {
	for k := range s {
		src, _ := lua.Source(algo.Kind(k).String())
		sum := sha1.Sum([]byte(src))
		s[k] = hex.EncodeToString(sum[:])
	}
	return s
}()

// multiChunk bounds the commands of one rueidis DoMulti: rueidis sends a
// pipeline of ClientOption.BlockingPipeline (2000) commands or more over a
// dedicated connection, dialled when none is idle, instead of the shared
// pipelined one. Do sends larger batches as successive chunks over the
// shared connections instead: one more round trip per 1000 ops, small
// beside the ~10 ms Redis takes to run them.
const multiChunk = 1000

// maxParamCache bounds the formatted Params a multiBuf keeps.
const maxParamCache = 1024

// multiBuf holds what one Do needs beyond the ops, reused across calls.
type multiBuf struct {
	keys    []string // the Redis key of each op
	pending []int    // the ops still to send
	sent    []int    // the ops the breakers let go
	grantOf []int    // by op: its index in grants (pending ops only)
	grants  []breakerGrant
	cmds    []rueidis.Completed
	res     []rueidis.RedisResult
	args    []string
	kb      []byte
	// params caches ARGV[2..4] of the Params seen, which repeat across
	// the ops of one rule.
	params map[algo.Params][3]string
}

var multiBufs = sync.Pool{New: func() any {
	return &multiBuf{params: make(map[algo.Params][3]string)}
}}

// put returns b to the pool, dropping references to the strings and
// results of the call.
func (b *multiBuf) put() {
	clear(b.keys)
	clear(b.cmds)
	clear(b.res)
	clear(b.args)
	clear(b.grants)
	b.keys, b.pending, b.cmds, b.res, b.args = b.keys[:0], b.pending[:0], b.cmds[:0], b.res[:0], b.args[:0]
	b.grants, b.grantOf, b.sent = b.grants[:0], b.grantOf[:0], b.sent[:0]
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

// Do runs every op in one pipelined round trip per Redis node: rueidis
// DoMulti, which in Cluster mode splits the commands by slot and sends
// each node its share concurrently (batches above 1000 ops go in chunks
// of 1000, one round trip each). It is what the cache's sync loop calls
// to return, renew and refresh many keys at once. Each op is atomic; the
// ops are not a transaction, but the ops of one key run in the order
// given (except that an op sent again after NOSCRIPT may run after a
// later op of its key, should another client load the script in between).
//
// Ops go as EVALSHA. Ops that Redis answers NOSCRIPT (a restart, SCRIPT
// FLUSH or failover lost the script; such an op did not run) are sent
// again after SCRIPT LOAD on every node, and as EVAL if they still meet
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
// ErrBreakerOpen (a *BreakerOpenError); the ops of each node that are
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
	for i := range ops {
		ops[i].Admitted, ops[i].Granted, ops[i].Result, ops[i].Err = 0, 0, algo.Result{}, nil
	}
	b := multiBufs.Get().(*multiBuf)
	defer b.put()
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

	// Each node's ops go only when its breaker allows them, on one ticket.
	start := time.Now()
	var refusal error
	b.grantOf = slices.Grow(b.grantOf[:0], len(ops))[:len(ops)]
	sendable := b.pending[:0] // filtered in place
	for _, i := range b.pending {
		gi := b.grant(s.c.g.breaker(b.keys[i]))
		b.grantOf[i] = gi
		if err := b.grants[gi].err; err != nil {
			ops[i].Err = fmt.Errorf("redisx: %s %q: %w", ops[i].Kind, b.keys[i], err)
			refusal = ops[i].Err
			continue
		}
		sendable = append(sendable, i)
	}
	b.pending = sendable
	b.sent = append(b.sent[:0], sendable...) // send filters pending in place
	if refusal != nil {
		s.c.g.refreshSoon()
	}

	var sendErr error
	if len(b.pending) > 0 {
		sendErr = s.send(ctx, ops, b)
	}
	// Every allowed ticket is done: failed when an op of its node met a
	// failure (see isFailure).
	for _, i := range b.sent {
		if g := &b.grants[b.grantOf[i]]; g.fail == nil && ops[i].Err != nil && isFailure(ops[i].Err) {
			g.fail = ops[i].Err
		}
	}
	for gi := range b.grants {
		if g := &b.grants[gi]; g.err == nil {
			s.c.done(g.b, g.t, g.fail)
		}
	}
	for i := range ops {
		if o := &ops[i]; !errors.Is(o.Err, errInvalidOp) && o.Kind < algo.NumOpKinds {
			opKindMetric[o.Kind].record(start, o.Err)
		}
	}
	switch {
	case sendErr != nil:
		return sendErr
	case len(b.sent) == 0 && refusal != nil:
		return fmt.Errorf("redisx: %d ops: none sent: %w", len(ops), refusal)
	}
	return nil
}

// grant returns the index in b.grants of br's ticket for this Do, asking
// br (Pass: a Do is never a probe) when the Do has none yet.
func (b *multiBuf) grant(br *Breaker) int {
	for gi := range b.grants {
		if b.grants[gi].b == br {
			return gi
		}
	}
	t, err := br.Pass()
	b.grants = append(b.grants, breakerGrant{b: br, t: t, err: err})
	return len(b.grants) - 1
}

// breakerGrant is a breaker's answer to one Do: a ticket, or the refusal.
type breakerGrant struct {
	b    *Breaker
	t    BreakerTicket
	err  error // the refusal; nil when allowed
	fail error // the first failure among the ops sent on t
}

// send runs the ops b.pending of ops (which hold their Redis keys in
// b.keys), filling each op's outcome. It returns an error, also set in
// every pending op's Err, when nothing could be sent.
func (s *Store) send(ctx context.Context, ops []algo.Op, b *multiBuf) error {
	rc, err := s.c.client()
	if err != nil {
		err = fmt.Errorf("redisx: %d ops: %w", len(ops), err)
		for _, i := range b.pending {
			ops[i].Err = err
		}
		return err
	}
	cctx, cancel := s.multiCtx(ctx)
	defer cancel()
	const (
		evalsha = iota // the first pass
		reload         // after SCRIPT LOAD on every node
		eval           // the last resort: the script's text
	)
	for pass := evalsha; pass <= eval && len(b.pending) > 0; pass++ {
		if pass == reload {
			loadScripts(cctx, rc, ops, b.pending)
		}
		b.cmds = b.cmds[:0]
		for _, i := range b.pending {
			b.cmds = append(b.cmds, b.command(rc, &ops[i], b.keys[i], pass == eval))
		}
		b.res = doMulti(cctx, rc, b.cmds, b.res)
		for _, r := range b.res {
			if r.NonRedisError() != nil {
				// rueidis may still hold the commands of a call that
				// timed out, in its queue: b.cmds's array must not be
				// reused.
				b.cmds = nil
				break
			}
		}
		again := b.pending[:0] // filtered in place: again[k] is written after pending[k] is read
		for j, i := range b.pending {
			r := b.res[j]
			if pass < eval && isNoScript(r.Error()) {
				again = append(again, i)
				continue
			}
			fill(&ops[i], r, b.keys[i])
		}
		b.pending = again
	}
	return nil
}

// multiCtx returns the context of one Do: ctx's values, and ctx's deadline
// when it has one, else the Client's Timeout. The cancellation of ctx is
// not followed, as in Client.callCtx: ops that are read are answered.
func (s *Store) multiCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return s.c.callCtx(ctx)
	}
	return context.WithDeadline(context.WithoutCancel(ctx), dl)
}

// errInvalidOp marks the ops Do did not send.
var errInvalidOp = errors.New("invalid op")

// checkOp rejects an Op that cannot be sent.
func checkOp(o *algo.Op) error {
	if o.Kind >= algo.NumOpKinds {
		return fmt.Errorf("%w: unknown %s", errInvalidOp, o.Kind)
	}
	if err := checkParams(o.Params); err != nil {
		return fmt.Errorf("%w: %w", errInvalidOp, err)
	}
	if o.Kind == algo.OpRefund && o.N < 1 {
		return fmt.Errorf("%w: return of %d units", errInvalidOp, o.N)
	}
	if o.Kind == algo.OpTakeLease && (len(o.Costs) == 0 || o.N < 0) {
		return fmt.Errorf("%w: takelease of %d costs, want %d", errInvalidOp, len(o.Costs), o.N)
	}
	return nil
}

// command builds the script call of o on rkey: EVALSHA, or EVAL with the
// script's text when eval is set.
func (b *multiBuf) command(rc rueidis.Client, o *algo.Op, rkey string, eval bool) rueidis.Completed {
	pa := b.paramArgs(o.Params)
	b.args = append(b.args[:0], o.Kind.String(), pa[0], pa[1], pa[2], "0")
	switch o.Kind {
	case algo.OpTakeLease:
		// ARGV[6] is the lease wanted, the costs follow.
		b.args = append(b.args, strconv.FormatInt(o.N, 10))
		for _, c := range o.Costs {
			b.args = append(b.args, strconv.FormatInt(max(c, 1), 10))
		}
	case algo.OpRefund:
		b.args = append(b.args, strconv.FormatInt(o.N, 10), strconv.FormatInt(o.TakenAt, 10))
	default:
		b.args = append(b.args, strconv.FormatInt(max(o.N, 1), 10))
	}
	k := o.Params.Kind
	if eval {
		src, _ := lua.Source(k.String())
		return rc.B().Eval().Script(src).Numkeys(1).Key(rkey).Arg(b.args...).Build()
	}
	return rc.B().Evalsha().Sha1(scriptSHA[k]).Numkeys(1).Key(rkey).Arg(b.args...).Build()
}

// fill sets o's outcome from the script's reply r.
func fill(o *algo.Op, r rueidis.RedisResult, rkey string) {
	var buf [6]int64
	n := 5
	if o.Kind == algo.OpTakeLease {
		n = 6 // and the units leased
	}
	v, err := replyInts(r, buf[:0], n)
	if err != nil {
		o.Err = fmt.Errorf("redisx: %s %q: %w", o.Kind, rkey, err)
		return
	}
	switch o.Kind {
	case algo.OpTake, algo.OpPeek:
		o.Result = result(o.Params, v, v[0] == 1)
	case algo.OpLease:
		o.Granted = v[0]
		o.Result = result(o.Params, v, v[0] > 0)
	case algo.OpTakeLease:
		o.Admitted, o.Granted = int(v[0]), v[5]
		o.Result = result(o.Params, v, v[5] > 0 || int(v[0]) == len(o.Costs))
	case algo.OpRefund, algo.OpReset, algo.OpGrant:
		o.Result = result(o.Params, v, false)
	}
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

// doMulti sends cmds with rc.DoMulti, in chunks of at most multiChunk
// commands, one after the other so that the commands of one key run in
// order, and returns their results in res's storage.
func doMulti(ctx context.Context, rc rueidis.Client, cmds []rueidis.Completed, res []rueidis.RedisResult) []rueidis.RedisResult {
	res = res[:0]
	for lo := 0; lo < len(cmds); lo += multiChunk {
		res = append(res, rc.DoMulti(ctx, cmds[lo:min(lo+multiChunk, len(cmds))]...)...)
	}
	return res
}

// loadScripts sends SCRIPT LOAD of the scripts that the pending ops use
// to every node rc knows, concurrently, one pipeline per node. Errors are
// ignored: an op whose node still lacks its script meets NOSCRIPT again
// and goes as EVAL.
func loadScripts(ctx context.Context, rc rueidis.Client, ops []algo.Op, pending []int) {
	var need [algo.FixedWindow + 1]bool
	for _, i := range pending {
		need[ops[i].Params.Kind] = true
	}
	var wg sync.WaitGroup
	for _, n := range rc.Nodes() {
		wg.Go(func() {
			cmds := make(rueidis.Commands, 0, len(need))
			for k, ok := range need {
				if ok {
					src, _ := lua.Source(algo.Kind(k).String())
					cmds = append(cmds, n.B().ScriptLoad().Script(src).Build())
				}
			}
			n.DoMulti(ctx, cmds...)
		})
	}
	wg.Wait()
}

// isNoScript reports whether err is Redis's NOSCRIPT: the script was not
// run, so the call can be sent again.
func isNoScript(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && re.IsNoScript()
}
