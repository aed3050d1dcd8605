package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rld/rld/policy"
)

// autoBlockAuthor is the author of the blocks that block_after makes.
const autoBlockAuthor = "rld"

// autoBlocks stores the automatic blocks that rules' block_after ask for,
// on one goroutine of its own: a check's goroutine only queues them. The
// blocks queued while the goroutine stores others are stored together,
// with one recompile of the policy for all of them, so that a burst of
// automatic blocks costs one compile, not one per block. stop waits for
// the goroutine; blocks queued after it are dropped.
type autoBlocks struct {
	mu      sync.Mutex         // guards pending, running, stopped
	pending []policy.AutoBlock // queued, not yet taken by the goroutine
	running bool               // the goroutine runs
	stopped bool
	wake    chan struct{} // cap 1: there is something pending, or stop
	done    chan struct{} // closed when the goroutine returns
}

// autoBlock queues the automatic block that a rule's block_after asks
// for, to be stored through the path of an admin block: it shows in
// list, is lifted by unblock and, with Redis, applies to the whole
// fleet. It is called on a check's goroutine and does not wait.
func (d *Daemon) autoBlock(ab policy.AutoBlock) {
	a := &d.autoBl
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		d.log.Warn("automatic block dropped: the daemon is stopping", slog.String("rule", ab.Rule), slog.Any("key", ab.Key))
		return
	}
	a.pending = append(a.pending, ab)
	if !a.running {
		a.running = true
		a.wake = make(chan struct{}, 1)
		a.done = make(chan struct{})
		go d.storeAutoBlocks()
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// stopAutoBlocks stores the automatic blocks queued, then stops their
// goroutine and returns once it has returned. Later blocks are dropped.
func (d *Daemon) stopAutoBlocks() {
	a := &d.autoBl
	a.mu.Lock()
	a.stopped = true
	running := a.running
	a.mu.Unlock()
	if !running {
		return
	}
	select {
	case a.wake <- struct{}{}:
	default:
	}
	<-a.done
}

// storeAutoBlocks is the goroutine of the automatic blocks.
func (d *Daemon) storeAutoBlocks() {
	a := &d.autoBl
	defer close(a.done)
	for range a.wake {
		// reloadMu first, then the queue: the blocks queued while a
		// change or an earlier batch held it join this batch.
		d.reloadMu.Lock()
		a.mu.Lock()
		batch, stopped := a.pending, a.stopped
		a.pending = nil
		a.mu.Unlock()
		if len(batch) > 0 {
			d.storeAutoBlocksLocked(batch)
		}
		d.reloadMu.Unlock()
		if stopped {
			return
		}
	}
}

// storeAutoBlocksLocked stores batch, then compiles the changes stored
// once; the caller holds reloadMu.
func (d *Daemon) storeAutoBlocksLocked(batch []policy.AutoBlock) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stored := 0
	for _, ab := range batch {
		b := policy.Block{
			ID: autoBlockID(ab), Rule: ab.Rule, Key: ab.Key, Reason: ab.Reason,
			Author: autoBlockAuthor, Created: time.Now(), Expires: time.Now().Add(ab.For),
		}
		now := time.Now().Add(d.chStore.Skew())
		v := b
		v.Expires = now.Add(ab.For)
		err := d.pol().ValidateBlock(&v, now)
		if err == nil {
			err = d.chStore.AddBlock(ctx, &b, ab.For)
		}
		if err != nil {
			d.log.Warn("cannot store an automatic block", slog.String("rule", ab.Rule),
				slog.Any("key", ab.Key), slog.Any("error", err))
			continue
		}
		stored++
		policy.AutoBlocks(ab.Rule).Inc()
		d.log.Warn("automatic block", slog.String("id", b.ID), slog.String("rule", ab.Rule),
			slog.Any("key", ab.Key), slog.Duration("for", ab.For), slog.String("reason", ab.Reason))
	}
	if stored == 0 {
		return
	}
	if err := d.reloadChangesLocked(ctx); err != nil {
		// Stored: the announcement or the next poll applies them.
		d.log.Warn("changes: automatic blocks stored, but not applied here yet", slog.Any("error", err))
	}
}

// autoBlockID is the ID of ab's block: the same for every daemon that
// blocks the same key of the same rule, so that a fleet whose daemons
// block it at once stores one block (the last one written), not one per
// daemon.
func autoBlockID(ab policy.AutoBlock) string {
	h := sha256.New()
	field := func(s string) { // length first: values may hold any byte
		h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(s))))
		h.Write([]byte(s))
	}
	field(ab.Rule)
	for _, name := range slices.Sorted(maps.Keys(ab.Key)) {
		field(name)
		field(ab.Key[name])
	}
	return "b-" + hex.EncodeToString(h.Sum(nil)[:10])
}
