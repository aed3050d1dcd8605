package policy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/config"
	"github.com/rld/rld/memstore"
)

const penaltyRules = `
[[rule]]
name = "api"
by = ["api_key"]
algorithm = "token_bucket"
limit = 1
period = "1s"
penalty = { after = 3, factor = 2, max = "10s" }
block_after = { refusals = 20, within = "1m", for = "1h" }
`

// penaltyPolicy is a Policy of toml on the embedded store whose automatic
// blocks are recorded, and compiled in as the daemon compiles them.
type penaltyPolicy struct {
	t     *testing.T
	cfg   *config.Config
	st    Stores
	mu    sync.Mutex
	asked []AutoBlock
	p     *Policy
}

func newPenaltyPolicy(t *testing.T, toml string) *penaltyPolicy {
	t.Helper()
	cfg, err := config.Parse([]byte(toml), t.Name()+".toml")
	require.NoError(t, err)
	pp := &penaltyPolicy{t: t, cfg: cfg}
	pp.st = Stores{Cached: memstore.New(memstore.Options{}), Penalties: NewPenalties(0, func(b AutoBlock) {
		pp.mu.Lock()
		pp.asked = append(pp.asked, b)
		pp.mu.Unlock()
	})}
	pp.compile(nil)
	return pp
}

func (pp *penaltyPolicy) compile(ch *Changes) {
	p, err := Compile(pp.cfg, ch, pp.st)
	require.NoError(pp.t, err)
	pp.p = p
}

func (pp *penaltyPolicy) blocks() []AutoBlock {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return append([]AutoBlock(nil), pp.asked...)
}

// TestPenaltyGrowsAndBlocks: a client retrying every 10 ms while refused
// gets a Retry-After that grows by the factor from the third early retry
// on, up to the maximum; checks during the cooldown are refused with
// exactly what is left of it; at the 20th early refusal an automatic
// block is asked for; compiled in, it blocks the key until it is lifted.
func TestPenaltyGrowsAndBlocks(t *testing.T) {
	pp := newPenaltyPolicy(t, penaltyRules)
	ctx := context.Background()
	var sc Scratch
	now := t0
	d := pp.p.Check(ctx, &Request{Now: now, Descs: descs("api_key=greedy"), Cost: 1}, &sc)
	require.Equal(t, StatusAllowed, d.Status)

	var ras []time.Duration
	var end time.Time
	for i := 1; i <= 21; i++ {
		now = now.Add(10 * time.Millisecond)
		d = pp.p.Check(ctx, &Request{Now: now, Descs: descs("api_key=greedy"), Cost: 1}, &sc)
		require.Equal(t, StatusLimited, d.Status, "retry %d", i)
		ra := d.Result.RetryAfter
		ras = append(ras, ra)
		assert.False(t, now.Add(ra).Before(end), "retry %d: the end answered never moves back", i)
		end = now.Add(ra)
		if i <= 20 {
			assert.Empty(t, pp.blocks(), "retry %d: below the threshold", i)
		}
	}
	// Refusals 1-3 are the limit's own (the first is not early; 2 and 3
	// are early retries 1 and 2, below after = 3).
	for i := range 3 {
		assert.LessOrEqual(t, ras[i], time.Second, "refusal %d: the limit's retry-after", i+1)
	}
	// From the third early retry on: base × 2, × 4, ... up to 10 s.
	assert.Greater(t, ras[3], time.Second+800*time.Millisecond, "the first penalty doubles the retry-after")
	for i := 4; i < len(ras); i++ {
		assert.GreaterOrEqual(t, ras[i], ras[i-1]-10*time.Millisecond, "refusal %d: the cooldown grows", i+1)
		assert.LessOrEqual(t, ras[i], 10*time.Second, "refusal %d: at most max", i+1)
	}
	t.Logf("retry-afters: %v", ras)
	assert.Greater(t, ras[5], ras[4]+time.Second, "it grows by the factor")
	assert.Equal(t, 10*time.Second, ras[len(ras)-1], "it reaches max")

	// A peek during the cooldown answers what is left, changing nothing.
	later := now.Add(time.Second)
	d = pp.p.Check(ctx, &Request{Now: later, Descs: descs("api_key=greedy"), Cost: 1, Peek: true}, &sc)
	assert.Equal(t, StatusLimited, d.Status)
	assert.Equal(t, end.Sub(later), d.Result.RetryAfter, "exact: the penalty's end")

	blocks := pp.blocks()
	require.Len(t, blocks, 1, "blocked at the 20th early refusal, once")
	b := blocks[0]
	assert.Equal(t, "api", b.Rule)
	assert.Equal(t, map[string]string{"api_key": "greedy"}, b.Key)
	assert.Equal(t, time.Hour, b.For)
	assert.Contains(t, b.Reason, "automatic: ")

	// The daemon stores it as a Block and compiles it in.
	ch := &Changes{Blocks: []Block{{ID: "b-auto", Rule: b.Rule, Key: b.Key, Expires: now.Add(b.For), Reason: b.Reason, Author: "rld"}}}
	require.NoError(t, pp.p.ValidateBlock(&ch.Blocks[0], now))
	pp.compile(ch)
	d = pp.p.Check(ctx, &Request{Now: now.Add(time.Minute), Descs: descs("api_key=greedy"), Cost: 1}, &sc)
	assert.Equal(t, StatusBlocked, d.Status)
	d = pp.p.Check(ctx, &Request{Now: now.Add(time.Minute), Descs: descs("api_key=other"), Cost: 1}, &sc)
	assert.Equal(t, StatusAllowed, d.Status, "another key is not blocked")
	// Unblock: the block is gone from the changes.
	pp.compile(&Changes{})
	d = pp.p.Check(ctx, &Request{Now: now.Add(time.Minute), Descs: descs("api_key=greedy"), Cost: 1}, &sc)
	assert.Equal(t, StatusAllowed, d.Status, "unblocked, the cooldown over")
}

// TestLiftPenalty: LiftPenalty ends a running cooldown of one key — its
// next check is judged by the limit alone — and its early refusals
// toward block_after count from zero again; other keys keep theirs; an
// unknown rule or a key that is not the rule's lifts nothing.
func TestLiftPenalty(t *testing.T) {
	pp := newPenaltyPolicy(t, penaltyRules)
	ctx := context.Background()
	var sc Scratch
	now := t0
	for _, k := range []string{"api_key=a", "api_key=b"} {
		for i := range 8 { // into a cooldown of several seconds
			pp.p.Check(ctx, &Request{Now: now.Add(time.Duration(i) * 10 * time.Millisecond), Descs: descs(k), Cost: 1}, &sc)
		}
	}
	now = now.Add(2 * time.Second) // the limit (1/s) has refilled; the cooldowns run
	d := pp.p.Check(ctx, &Request{Now: now, Descs: descs("api_key=a"), Cost: 1, Peek: true}, &sc)
	require.Equal(t, StatusLimited, d.Status, "in a cooldown")
	require.Greater(t, d.Result.RetryAfter, time.Second)

	assert.False(t, pp.p.LiftPenalty("nope", map[string]string{"api_key": "a"}))
	assert.False(t, pp.p.LiftPenalty("api", map[string]string{"ip": "a"}))
	assert.True(t, pp.p.LiftPenalty("api", map[string]string{"api_key": "a"}))
	assert.False(t, pp.p.LiftPenalty("api", map[string]string{"api_key": "a"}), "nothing left to lift")
	d = pp.p.Check(ctx, &Request{Now: now, Descs: descs("api_key=a"), Cost: 1}, &sc)
	assert.Equal(t, StatusAllowed, d.Status, "the cooldown is over: the limit alone decides")
	d = pp.p.Check(ctx, &Request{Now: now, Descs: descs("api_key=b"), Cost: 1, Peek: true}, &sc)
	assert.Equal(t, StatusLimited, d.Status, "another key keeps its cooldown")

	// block_after counts from zero again: 19 early refusals after the
	// lift ask for no block (20 would).
	for i := 1; i <= 19; i++ {
		pp.p.Check(ctx, &Request{Now: now.Add(time.Duration(i) * 10 * time.Millisecond), Descs: descs("api_key=a"), Cost: 1}, &sc)
	}
	assert.Empty(t, pp.blocks())
}

// TestPenaltyHonestClient: a client that waits each Retry-After before
// retrying is never penalised and never blocked, however long it keeps
// using its whole limit.
func TestPenaltyHonestClient(t *testing.T) {
	pp := newPenaltyPolicy(t, penaltyRules)
	ctx := context.Background()
	var sc Scratch
	now := t0
	refused := 0
	for range 500 {
		d := pp.p.Check(ctx, &Request{Now: now, Descs: descs("api_key=polite"), Cost: 1}, &sc)
		switch d.Status {
		case StatusAllowed:
			now = now.Add(10 * time.Millisecond) // at once again
		case StatusLimited:
			refused++
			assert.LessOrEqual(t, d.Result.RetryAfter, time.Second, "the limit's own retry-after: no penalty")
			now = now.Add(d.Result.RetryAfter)
		default:
			t.Fatalf("status %v", d.Status)
		}
	}
	assert.Greater(t, refused, 200, "it was refused, and waited, many times")
	assert.Empty(t, pp.blocks(), "never blocked")
}

// TestRetryJitter: retry_jitter adds 0..D (or 0..fraction × the
// retry-after) to the Retry-After, never less than the limit's own.
func TestRetryJitter(t *testing.T) {
	for _, jitter := range []string{`"500ms"`, `"0.5"`} {
		t.Run(jitter, func(t *testing.T) {
			pp := newPenaltyPolicy(t, `
[[rule]]
name = "api"
by = ["api_key"]
limit = 1
period = "1s"
retry_jitter = `+jitter+"\n")
			ctx := context.Background()
			var sc Scratch
			seen := map[time.Duration]bool{}
			for i := range 200 {
				k := descs("api_key=k" + string(rune('A'+i%26)) + string(rune('a'+i/26)))
				require.Equal(t, StatusAllowed, pp.p.Check(ctx, &Request{Now: t0, Descs: k, Cost: 1}, &sc).Status)
				d := pp.p.Check(ctx, &Request{Now: t0, Descs: k, Cost: 1}, &sc)
				require.Equal(t, StatusLimited, d.Status)
				ra := d.Result.RetryAfter
				assert.GreaterOrEqual(t, ra, time.Second, "never less than the limit's retry-after")
				assert.LessOrEqual(t, ra, 1500*time.Millisecond, "at most retry + 500ms")
				seen[ra] = true
			}
			assert.Greater(t, len(seen), 10, "the retry-afters are spread")
			assert.Zero(t, pp.st.Penalties.Len(), "jitter alone keeps no state")
		})
	}
}

// TestPenaltyCheckAllocs: a rule without the new fields still checks
// allocation-free, and so does a refusal in a cooldown.
func TestPenaltyCheckAllocs(t *testing.T) {
	pp := newPenaltyPolicy(t, penaltyRules+`
[[rule]]
name = "plain"
by = ["ip"]
limit = 1000000
period = "1s"
`)
	ctx := context.Background()
	var sc Scratch
	plain := descs("ip=1")
	now := t0
	pp.p.Check(ctx, &Request{Now: now, Descs: plain, Cost: 1}, &sc)
	assert.Zero(t, testing.AllocsPerRun(100, func() { pp.p.Check(ctx, &Request{Now: now, Descs: plain, Cost: 1}, &sc) }))

	greedy := descs("api_key=g")
	for range 6 {
		now = now.Add(10 * time.Millisecond)
		pp.p.Check(ctx, &Request{Now: now, Descs: greedy, Cost: 1}, &sc)
	}
	assert.Zero(t, testing.AllocsPerRun(100, func() { pp.p.Check(ctx, &Request{Now: now, Descs: greedy, Cost: 1, Peek: true}, &sc) }), "a peek in a cooldown")
}

// TestPenaltyAfterBlockExpires: when the automatic block of a key ends,
// the key starts afresh — its cooldown is over and its early refusals
// toward block_after count from none — so the first check after the
// block is judged by the limit alone, and retrying early again does not
// re-block the key until it makes block_after's refusals anew. The same
// holds on a daemon that did not ask for the block but saw it refuse the
// key (its state learns the block's end from the refusal).
func TestPenaltyAfterBlockExpires(t *testing.T) {
	const rules = `
[[rule]]
name = "api"
by = ["api_key"]
algorithm = "token_bucket"
limit = 1
period = "1s"
penalty = { after = 1, factor = 4, max = "1m" }
block_after = { refusals = 5, within = "10m", for = "5s" }
`
	for _, asker := range []bool{true, false} {
		name := map[bool]string{true: "the daemon that blocked", false: "another daemon"}[asker]
		t.Run(name, func(t *testing.T) {
			pp := newPenaltyPolicy(t, rules)
			ctx := context.Background()
			var sc Scratch
			now := t0
			k := descs("api_key=greedy")
			require.Equal(t, StatusAllowed, pp.p.Check(ctx, &Request{Now: now, Descs: k, Cost: 1}, &sc).Status)
			for i := 1; i <= 6; i++ { // the first refusal, then 5 early retries
				now = now.Add(10 * time.Millisecond)
				require.Equal(t, StatusLimited, pp.p.Check(ctx, &Request{Now: now, Descs: k, Cost: 1}, &sc).Status, "retry %d", i)
			}
			blocks := pp.blocks()
			require.Len(t, blocks, 1, "blocked at the 5th early retry")
			if !asker {
				// Another daemon: the same early retries, but its own
				// block_after is not what blocked the key (its state has
				// no block): forget that it asked.
				pp.st.Penalties.mu.Lock()
				for key, e := range pp.st.Penalties.m {
					e.blocked = 0
					pp.st.Penalties.m[key] = e
				}
				pp.st.Penalties.mu.Unlock()
			}
			d := pp.p.Check(ctx, &Request{Now: now, Descs: k, Cost: 1, Peek: true}, &sc)
			require.Equal(t, StatusLimited, d.Status)
			require.Greater(t, d.Result.RetryAfter, 30*time.Second, "a cooldown longer than the block runs")

			ch := &Changes{Blocks: []Block{{ID: "b-auto", Rule: "api", Key: blocks[0].Key, Expires: now.Add(blocks[0].For), Author: "rld"}}}
			pp.compile(ch)
			end := now.Add(blocks[0].For)
			assert.Equal(t, StatusBlocked, pp.p.Check(ctx, &Request{Now: now.Add(time.Second), Descs: k, Cost: 1}, &sc).Status, "blocked")

			// The block has ended (its entry is still compiled in, expired).
			now = end
			d = pp.p.Check(ctx, &Request{Now: now, Descs: k, Cost: 1}, &sc)
			assert.Equal(t, StatusAllowed, d.Status, "the block is over, and with it the cooldown: the limit alone decides")
			// Refused by the limit, then early retries again, counted
			// from none: 4 do not block the key again, the 5th does.
			for i := 1; i <= 6; i++ {
				now = now.Add(10 * time.Millisecond)
				d = pp.p.Check(ctx, &Request{Now: now, Descs: k, Cost: 1}, &sc)
				require.Equal(t, StatusLimited, d.Status, "refusal %d after the block", i)
				if i == 1 {
					assert.LessOrEqual(t, d.Result.RetryAfter, time.Second, "the first refusal after the block is the limit's own")
				}
				if i < 6 {
					assert.Len(t, pp.blocks(), 1, "refusal %d after the block: no new block yet", i)
				}
			}
			assert.Len(t, pp.blocks(), 2, "5 new early retries block the key again")
		})
	}
}
