package policy

import (
	"context"
	"fmt"
	"time"

	"github.com/rld/rld/algo"
)

// Store holds the state of every counter key. The embedded store
// (memstore) and the Redis store implement it; implementations are safe
// for concurrent use.
type Store interface {
	// Take decides whether cost units of the limit p are available for key
	// at now, and consumes them when they are and peek is false. A denied
	// take consumes nothing. The key bytes are not retained. The Result's
	// At is the time the store decided at, on its own clock; a Refund of
	// this take passes it back.
	Take(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error)
	// Refund gives back cost units that Take admitted for key at takenAt.
	// It is how a hierarchical check undoes the takes of rules that
	// allowed when a later rule denies.
	Refund(ctx context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error
}

// SlotTaker is implemented by the stores that hold a concurrency limit's
// slots by id (memstore, the Redis store through the hot-key cache's
// Strict): an acquire's slot is then its own, and a release names it by
// its id and time, freeing that slot once and no other. A store without
// it holds an acquire's slot as a take of 1, named by its time alone,
// which acquires at one microsecond share.
type SlotTaker interface {
	// TakeSlot decides one slot of the Concurrency limit p for key at
	// now and holds it, when it fits, as the slot named slot (non-zero,
	// unique among the key's). The Result's At is the slot's time: an
	// algo.OpRelease of TakenAt At and Slot slot releases it.
	TakeSlot(ctx context.Context, key []byte, p algo.Params, slot uint64, now time.Time) (algo.Result, error)
}

// DenialPeeker is implemented by stores that can answer more cheaply the
// peeks a denied check makes of the rules after the one that denied it,
// which look only for a longer retry-after to report (see Check). Such a
// peek may be answered from what the store knew of the key, or fetched
// once and then kept for retryAfter, the denial's: the client told to
// wait that long does not come back sooner, and a stale answer can only
// make the retry-after reported shorter, never admit anything. The
// hot-key cache implements it, so that a hammered key costs the shared
// store nothing for its later rules.
type DenialPeeker interface {
	// PeekForDenial decides cost units of p for key at now without
	// taking them, as Take with peek does, for a check denied with
	// retry-after retryAfter.
	PeekForDenial(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, retryAfter time.Duration) (algo.Result, error)
}

// LocalTaker is implemented by stores that can answer some takes and
// peeks from what they hold on the host, with no wait: the hot-key
// cache (a lease, a denial in force). Policy.TryCheckTo uses it to
// answer a check inline when every rule's store can.
type LocalTaker interface {
	// TakeLocal decides as Take does when it can do so without waiting,
	// and reports whether it did; when not, nothing was taken.
	TakeLocal(key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, bool)
}

// capsOf resolves the capabilities of st, the rule's store, into r's
// fields, once, when the policy is compiled: the checks read the fields
// and assert no interface. Every store must be an Operator (it runs the
// settles of leases, the releases of slots and the operators' ops): one
// that is not is an error here, not at the first op. SlotTaker,
// DenialPeeker and LocalTaker are optional: without them a slot is a
// take of 1, a denied check's peeks are takes with peek, and no check
// is answered inline.
func (r *rule) capsOf(st Store) error {
	ops, ok := st.(Operator)
	if !ok {
		return fmt.Errorf("its store (%T) runs no ops (policy.Operator)", st)
	}
	r.ops = ops
	r.slots, _ = st.(SlotTaker)
	r.denial, _ = st.(DenialPeeker)
	r.local, _ = st.(LocalTaker)
	return nil
}
