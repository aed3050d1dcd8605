package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/changestore"
	"github.com/rld/rld/config"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redisx"
)

var (
	changesOrphaned  = metrics.NewGauge(`rld_changes_orphaned`, nil)
	changesOverrides = metrics.NewGauge(`rld_changes_overrides`, nil)
	changesBlocks    = metrics.NewGauge(`rld_changes_blocks`, nil)
	changesCompiles  = metrics.NewCounter(`rld_changes_compiles_total`)
)

// openChanges opens the store of run-time changes and compiles the ones
// stored into the policy in force. New calls it once the policy is built.
func (d *Daemon) openChanges(cfg *config.Config) {
	if d.redis != nil {
		d.chStore = changestore.NewRedis(d.redis, d.log)
	} else {
		d.chStore = changestore.NewFile(cfg.Admin.ChangesFile(cfg.Server.Socket), d.log)
	}
	wait := 5 * time.Second
	if d.redisSilent {
		// Redis did not answer at all: waiting would only delay serving
		// the fail modes. One try; the poll of the version loads the set
		// once Redis answers.
		wait = changestore.LoadRetry
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// On Redis a load is a few calls of store.timeout each: at a start,
	// with the scripts still loading and other daemons starting too, one
	// may time out. It is tried again within the 5 s before the daemon
	// starts without the changes (the announcements and the poll bring
	// them). A state file's error is final: it was moved aside.
	ch, err := d.chStore.Load(ctx)
	for err != nil && d.redis != nil && ctx.Err() == nil && !redisx.IsReply(err) {
		d.log.Debug("cannot load the overrides and blocks yet; trying again", slog.Any("error", err))
		select {
		case <-ctx.Done():
		case <-time.After(changestore.LoadRetry):
			ch, err = d.chStore.Load(ctx)
		}
	}
	if err != nil {
		d.log.Error("cannot load the overrides and blocks; starting without them", slog.Any("error", err))
		return
	}
	if err := d.installChanges(ch); err != nil {
		d.log.Error("cannot apply the overrides and blocks stored; starting without them", slog.Any("error", err))
	}
}

// installChanges compiles ch with the configuration in force and swaps
// the new Policy in. The caller holds reloadMu, or is New.
func (d *Daemon) installChanges(ch *policy.Changes) error {
	old := d.pol()
	p, err := policy.Compile(d.cfg(), ch, d.stores)
	if err != nil {
		return fmt.Errorf("cannot compile the overrides and blocks: %w", err)
	}
	d.swapLocked(func(f *inForce) { f.policy = p })
	d.compiles.Add(1)
	changesCompiles.Inc()
	d.reportChanges(p)
	if old != nil {
		liftCooldowns(old.Changes(), p)
	}
	return nil
}

// liftCooldowns ends the penalty cooldown of the key of each key block
// of was that p no longer has though it had not expired: a block lifted
// by unblock, here or on another daemon of the fleet, lifts the key's
// cooldown with it.
func liftCooldowns(was *policy.Changes, p *policy.Policy) {
	in := p.Changes()
	kept := make(map[string]bool, len(in.Blocks))
	for _, b := range in.Blocks {
		kept[b.ID] = true
	}
	at := time.Now().Add(in.Skew) // by the expiries' clock
	for _, b := range was.Blocks {
		if b.Rule != "" && !kept[b.ID] && b.Expires.After(at) {
			p.LiftPenalty(b.Rule, b.Key)
		}
	}
}

// reportChanges logs and counts the changes of p whose rule is gone.
func (d *Daemon) reportChanges(p *policy.Policy) {
	ch := p.Changes()
	changesOverrides.Set(float64(len(ch.Overrides)))
	changesBlocks.Set(float64(len(ch.Blocks)))
	orphans := p.Orphans()
	changesOrphaned.Set(float64(len(orphans)))
	for _, o := range orphans {
		d.log.Warn("an override or block names a rule the configuration does not have, or one whose by descriptors or algorithm it no longer fits: it applies to nothing until the rule is back",
			slog.String("id", o.ID), slog.String("rule", o.Rule))
	}
}

// changeTimeout bounds an admin change: its store (with the retries of
// a change to Redis, changestore.Redis) and the load that applies it. It
// holds reloadMu meanwhile, so it stays well below the systemd watchdog's
// 10 s, which the loop that runs reloads keeps.
const changeTimeout = 3 * time.Second

// change validates and stores a change with store under reloadMu, then
// loads the changes stored and swaps in their Policy, all within
// changeTimeout. validate gets the Policy in force and now by the store's
// clock.
func (d *Daemon) change(ctx context.Context, validate func(p *policy.Policy, now time.Time) error,
	store func(ctx context.Context) error) error {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	// From the lock on: what the bound protects is the time it is held.
	ctx, cancel := context.WithTimeout(ctx, changeTimeout)
	defer cancel()
	if validate != nil {
		if err := validate(d.pol(), time.Now().Add(d.chStore.Skew())); err != nil {
			return err
		}
	}
	if err := store(ctx); err != nil {
		return err
	}
	if err := d.reloadChangesLocked(ctx); err != nil {
		// Stored: the announcement or the next poll applies it here
		// as on the other daemons.
		d.log.Warn("changes: stored, but not applied here yet", slog.Any("error", err))
	}
	return nil
}

// reloadChangesLocked loads the changes stored and swaps in their
// Policy; the caller holds reloadMu.
func (d *Daemon) reloadChangesLocked(ctx context.Context) error {
	ch, err := d.chStore.Load(ctx)
	if err != nil {
		return err
	}
	return d.installChanges(ch)
}

// author is who a change is by: the one the request names, else its
// caller.
func author(ctx context.Context, given string) string {
	if given != "" {
		return given
	}
	if c, ok := admin.CallerOf(ctx); ok {
		return c.String()
	}
	return "unknown"
}

// refusal turns a policy validation error into an admin error.
func refusal(err error) error {
	if errors.Is(err, policy.ErrUnknownRule) {
		return admin.Errorf(admin.CodeNotFound, "%v", err)
	}
	return admin.Errorf(admin.CodeBadRequest, "%v", err)
}

// ttlOrExpiry reads a change's ttl or expires_at: one of the two is
// returned, the other zero.
func ttlOrExpiry(ttl string, at *time.Time) (time.Duration, time.Time, error) {
	exp, err := admin.Expiry(ttl, at, time.Time{})
	if err != nil {
		return 0, time.Time{}, err
	}
	if at != nil {
		return 0, exp, nil
	}
	return exp.Sub(time.Time{}), time.Time{}, nil
}

// SetOverride implements admin.ChangeService.
func (s adminService) SetOverride(ctx context.Context, a admin.OverrideArgs) (admin.OverrideEntry, error) {
	ttl, exp, err := ttlOrExpiry(a.TTL, a.ExpiresAt)
	if err != nil {
		return admin.OverrideEntry{}, err
	}
	o, err := a.Override()
	if err != nil {
		return admin.OverrideEntry{}, err
	}
	o.ID, o.Expires, o.Author, o.Created = changestore.NewID("o-"), exp, author(ctx, a.Author), time.Now()
	err = s.d.change(ctx, func(p *policy.Policy, now time.Time) error {
		v := o
		if ttl > 0 {
			v.Expires = now.Add(ttl)
		}
		if err := p.ValidateOverride(&v, now); err != nil {
			return refusal(err)
		}
		return nil
	}, func(ctx context.Context) error { return s.d.chStore.AddOverride(ctx, &o, ttl) })
	if err != nil {
		return admin.OverrideEntry{}, err
	}
	return overrideEntry(&o, false), nil
}

// DeleteOverride implements admin.ChangeService.
func (s adminService) DeleteOverride(ctx context.Context, a admin.IDArgs) (admin.Deleted, error) {
	return admin.Deleted{ID: a.ID}, s.d.change(ctx, nil, func(ctx context.Context) error {
		ok, err := s.d.chStore.Remove(ctx, true, a.ID)
		if err == nil && !ok {
			err = admin.Errorf(admin.CodeNotFound, "no override %q (list shows them; an expired one is gone)", a.ID)
		}
		return err
	})
}

// Block implements admin.ChangeService.
func (s adminService) Block(ctx context.Context, a admin.BlockArgs) (admin.BlockEntry, error) {
	ttl, exp, err := ttlOrExpiry(a.TTL, a.ExpiresAt)
	if err != nil {
		return admin.BlockEntry{}, err
	}
	b := a.Block()
	b.ID, b.Expires, b.Author, b.Created = changestore.NewID("b-"), exp, author(ctx, a.Author), time.Now()
	err = s.d.change(ctx, func(p *policy.Policy, now time.Time) error {
		v := b
		if ttl > 0 {
			v.Expires = now.Add(ttl)
		}
		if err := p.ValidateBlock(&v, now); err != nil {
			return refusal(err)
		}
		return nil
	}, func(ctx context.Context) error { return s.d.chStore.AddBlock(ctx, &b, ttl) })
	if err != nil {
		return admin.BlockEntry{}, err
	}
	return blockEntry(&b, false), nil
}

// Unblock implements admin.ChangeService.
func (s adminService) Unblock(ctx context.Context, a admin.IDArgs) (admin.Deleted, error) {
	return admin.Deleted{ID: a.ID}, s.d.change(ctx, nil, func(ctx context.Context) error {
		ok, err := s.d.chStore.Remove(ctx, false, a.ID)
		if err == nil && !ok {
			err = admin.Errorf(admin.CodeNotFound, "no block %q (list shows them; an expired one is gone)", a.ID)
		}
		return err
	})
}

// List implements admin.ChangeService.
func (s adminService) List(context.Context) (admin.ListResult, error) {
	p := s.d.pol()
	orphan := map[string]bool{}
	for _, o := range p.Orphans() {
		orphan[o.ID] = true
	}
	ch := p.Changes()
	changestore.PruneExpired(ch, time.Now().Add(ch.Skew))
	res := admin.ListResult{Overrides: []admin.OverrideEntry{}, Blocks: []admin.BlockEntry{}}
	for i := range ch.Overrides {
		res.Overrides = append(res.Overrides, overrideEntry(&ch.Overrides[i], orphan[ch.Overrides[i].ID]))
	}
	for i := range ch.Blocks {
		res.Blocks = append(res.Blocks, blockEntry(&ch.Blocks[i], orphan[ch.Blocks[i].ID]))
	}
	return res, nil
}

func overrideEntry(o *policy.Override, orphaned bool) admin.OverrideEntry {
	e := admin.OverrideEntry{Override: *o, Orphaned: orphaned}
	if o.Period > 0 {
		e.Period = config.Duration(o.Period).String()
	}
	return e
}

func blockEntry(b *policy.Block, orphaned bool) admin.BlockEntry {
	return admin.BlockEntry{Block: *b, Orphaned: orphaned}
}

// watchChanges applies the fleet's changes as they change in Redis until
// ctx is done (changestore.Redis.Watch). Without Redis it does nothing.
func (d *Daemon) watchChanges(ctx context.Context, interval time.Duration) {
	rs, ok := d.chStore.(*changestore.Redis)
	if !ok {
		return
	}
	rs.Watch(ctx, interval, func(ctx context.Context) error {
		d.reloadMu.Lock()
		defer d.reloadMu.Unlock()
		return d.reloadChangesLocked(ctx)
	})
}
