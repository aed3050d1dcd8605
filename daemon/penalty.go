package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/rld/rld/policy"
)

// autoBlockAuthor is the author of the blocks that block_after makes.
const autoBlockAuthor = "rld"

// autoBlock stores the automatic block that a rule's block_after asks
// for, through the path of an admin block: it shows in list, is lifted by
// unblock and, with Redis, applies to the whole fleet. It is called on a
// check's goroutine, so the block is stored on its own goroutine.
func (d *Daemon) autoBlock(ab policy.AutoBlock) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b := policy.Block{
			ID: newChangeID("b-"), Rule: ab.Rule, Key: ab.Key, Reason: ab.Reason,
			Author: autoBlockAuthor, Created: time.Now(), Expires: time.Now().Add(ab.For),
		}
		err := d.change(ctx, func(p *policy.Policy, now time.Time) error {
			v := b
			v.Expires = now.Add(ab.For)
			return p.ValidateBlock(&v, now)
		}, func(ctx context.Context) error { return d.chStore.addBlock(ctx, &b, ab.For) })
		if err != nil {
			d.log.Warn("cannot store an automatic block", slog.String("rule", ab.Rule),
				slog.Any("key", ab.Key), slog.Any("error", err))
			return
		}
		policy.AutoBlocks(ab.Rule).Inc()
		d.log.Warn("automatic block", slog.String("id", b.ID), slog.String("rule", ab.Rule),
			slog.Any("key", ab.Key), slog.Duration("for", ab.For), slog.String("reason", ab.Reason))
	}()
}
