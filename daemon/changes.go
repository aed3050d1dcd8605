package daemon

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/config"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redisx"
)

// changeStore keeps the run-time changes (overrides and blocks) where
// they outlive the process: a state file for the embedded store, Redis
// for a fleet (changes_redis.go). The Daemon's reloadMu serialises its
// writes.
type changeStore interface {
	// load returns the changes stored, not expired.
	load(ctx context.Context) (*policy.Changes, error)
	// addOverride stores o; when ttl > 0 its expiry is ttl from the
	// store's now, and o.Expires is set to it.
	addOverride(ctx context.Context, o *policy.Override, ttl time.Duration) error
	// addBlock stores b as addOverride stores an override.
	addBlock(ctx context.Context, b *policy.Block, ttl time.Duration) error
	// remove removes the override (or the block) called id and reports
	// whether there was one.
	remove(ctx context.Context, override bool, id string) (bool, error)
	// skew is the store's clock minus the local clock (0: the same).
	skew() time.Duration
}

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
		d.chStore = newRedisChanges(d.redis, d.log)
	} else {
		d.chStore = &fileChanges{path: cfg.Admin.ChangesFile(cfg.Server.Socket), log: d.log}
	}
	wait := 5 * time.Second
	if d.redisSilent {
		// Redis did not answer at all: waiting would only delay serving
		// the fail modes. One try; the poll of the version loads the set
		// once Redis answers.
		wait = loadRetry
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// On Redis a load is a few calls of store.timeout each: at a start,
	// with the scripts still loading and other daemons starting too, one
	// may time out. It is tried again within the 5 s before the daemon
	// starts without the changes (the announcements and the poll bring
	// them). A state file's error is final: it was moved aside.
	ch, err := d.chStore.load(ctx)
	for err != nil && d.redis != nil && ctx.Err() == nil && !redisx.IsReply(err) {
		d.log.Debug("cannot load the overrides and blocks yet; trying again", slog.Any("error", err))
		select {
		case <-ctx.Done():
		case <-time.After(loadRetry):
			ch, err = d.chStore.load(ctx)
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
// a change to Redis, changes_redis.go) and the load that applies it. It
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
		if err := validate(d.pol(), time.Now().Add(d.chStore.skew())); err != nil {
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
	ch, err := d.chStore.load(ctx)
	if err != nil {
		return err
	}
	return d.installChanges(ch)
}

// pruneExpired drops the entries of ch expired at now.
func pruneExpired(ch *policy.Changes, now time.Time) {
	ch.Overrides = slices.DeleteFunc(ch.Overrides, func(o policy.Override) bool { return !o.Expires.After(now) })
	ch.Blocks = slices.DeleteFunc(ch.Blocks, func(b policy.Block) bool { return !b.Expires.After(now) })
}

// newChangeID returns a new id: prefix, then the creation time (Unix
// nanoseconds, 16 hex digits) and 4 random hex digits, so that list's
// order of id is the order of creation (on one daemon's clock) of the
// changes admin ops make (an automatic block's is autoBlockID).
func newChangeID(prefix string) string {
	var b [10]byte
	binary.BigEndian.PutUint64(b[:8], uint64(time.Now().UnixNano()))
	_, _ = rand.Read(b[8:])
	return prefix + hex.EncodeToString(b[:])
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
	o := policy.Override{
		ID: newChangeID("o-"), Rule: a.Rule, Key: a.Key, Match: a.Match,
		Limit: a.Limit, Burst: a.Burst, Multiplier: a.Multiplier,
		Expires: exp, Reason: a.Reason, Author: author(ctx, a.Author), Created: time.Now(),
	}
	if a.Period != "" {
		p, err := time.ParseDuration(a.Period)
		if err != nil || p <= 0 {
			return admin.OverrideEntry{}, admin.Errorf(admin.CodeBadRequest, "period %q: give a positive duration (\"1m\")", a.Period)
		}
		o.Period = p
	}
	if a.Limit < 0 || (a.Limit == 0 && a.Multiplier == 0) {
		return admin.OverrideEntry{}, admin.Errorf(admin.CodeBadRequest, "limit = %d: give a positive limit, or a positive multiplier", a.Limit)
	}
	err = s.d.change(ctx, func(p *policy.Policy, now time.Time) error {
		v := o
		if ttl > 0 {
			v.Expires = now.Add(ttl)
		}
		if err := p.ValidateOverride(&v, now); err != nil {
			return refusal(err)
		}
		return nil
	}, func(ctx context.Context) error { return s.d.chStore.addOverride(ctx, &o, ttl) })
	if err != nil {
		return admin.OverrideEntry{}, err
	}
	return overrideEntry(&o, false), nil
}

// DeleteOverride implements admin.ChangeService.
func (s adminService) DeleteOverride(ctx context.Context, a admin.IDArgs) (admin.Deleted, error) {
	return admin.Deleted{ID: a.ID}, s.d.change(ctx, nil, func(ctx context.Context) error {
		ok, err := s.d.chStore.remove(ctx, true, a.ID)
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
	b := policy.Block{
		ID: newChangeID("b-"), Match: a.Match, Rule: a.Rule, Key: a.Key,
		Expires: exp, Reason: a.Reason, Author: author(ctx, a.Author), Created: time.Now(),
	}
	err = s.d.change(ctx, func(p *policy.Policy, now time.Time) error {
		v := b
		if ttl > 0 {
			v.Expires = now.Add(ttl)
		}
		if err := p.ValidateBlock(&v, now); err != nil {
			return refusal(err)
		}
		return nil
	}, func(ctx context.Context) error { return s.d.chStore.addBlock(ctx, &b, ttl) })
	if err != nil {
		return admin.BlockEntry{}, err
	}
	return blockEntry(&b, false), nil
}

// Unblock implements admin.ChangeService.
func (s adminService) Unblock(ctx context.Context, a admin.IDArgs) (admin.Deleted, error) {
	return admin.Deleted{ID: a.ID}, s.d.change(ctx, nil, func(ctx context.Context) error {
		ok, err := s.d.chStore.remove(ctx, false, a.ID)
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
	pruneExpired(ch, time.Now().Add(ch.Skew))
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

// fileChanges keeps the changes in memory and in a JSON state file,
// written whole to a temporary file that is renamed over it, so that a
// crash leaves the old file or the new, never half of one.
type fileChanges struct {
	path string
	log  *slog.Logger
	cur  *policy.Changes // guarded by the Daemon's reloadMu
}

// stateFile is the state file's content.
type stateFile struct {
	Version int `json:"version"`
	policy.Changes
}

func (f *fileChanges) skew() time.Duration { return 0 }

func (f *fileChanges) load(context.Context) (*policy.Changes, error) {
	if f.cur != nil {
		ch := f.cur.Clone()
		pruneExpired(ch, time.Now())
		return ch, nil
	}
	f.cur = &policy.Changes{}
	b, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return f.cur.Clone(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read the state file: %w", err)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil || st.Version != 1 {
		bad := f.path + ".bad-" + time.Now().UTC().Format("20060102T150405")
		_ = os.Rename(f.path, bad)
		if err == nil {
			err = fmt.Errorf("version %d, want 1", st.Version)
		}
		return nil, fmt.Errorf("state file %s is unreadable (moved to %s): %w", f.path, bad, err)
	}
	pruneExpired(&st.Changes, time.Now())
	f.cur = st.Changes.Clone()
	f.log.Info("overrides and blocks loaded", slog.String("state_file", f.path),
		slog.Int("overrides", len(f.cur.Overrides)), slog.Int("blocks", len(f.cur.Blocks)))
	return f.cur.Clone(), nil
}

func (f *fileChanges) addOverride(ctx context.Context, o *policy.Override, ttl time.Duration) error {
	if ttl > 0 {
		o.Expires = time.Now().Add(ttl)
	}
	return f.update(ctx, func(ch *policy.Changes) error {
		ch.Overrides = append(ch.Overrides, *o)
		return nil
	})
}

func (f *fileChanges) addBlock(ctx context.Context, b *policy.Block, ttl time.Duration) error {
	if ttl > 0 {
		b.Expires = time.Now().Add(ttl)
	}
	return f.update(ctx, func(ch *policy.Changes) error {
		// An automatic block's ID names its rule and key: stored again,
		// it replaces the one before.
		if i := slices.IndexFunc(ch.Blocks, func(o policy.Block) bool { return o.ID == b.ID }); i >= 0 {
			ch.Blocks[i] = *b
			return nil
		}
		ch.Blocks = append(ch.Blocks, *b)
		return nil
	})
}

func (f *fileChanges) remove(ctx context.Context, override bool, id string) (bool, error) {
	found := false
	err := f.update(ctx, func(ch *policy.Changes) error {
		n := len(ch.Overrides) + len(ch.Blocks)
		if override {
			ch.Overrides = slices.DeleteFunc(ch.Overrides, func(o policy.Override) bool { return o.ID == id })
		} else {
			ch.Blocks = slices.DeleteFunc(ch.Blocks, func(b policy.Block) bool { return b.ID == id })
		}
		found = len(ch.Overrides)+len(ch.Blocks) < n
		return nil
	})
	return found, err
}

// update applies fn to the changes (expired ones dropped) and writes the
// state file.
func (f *fileChanges) update(ctx context.Context, fn func(ch *policy.Changes) error) error {
	ch, err := f.load(ctx)
	if err != nil {
		return err
	}
	if err := fn(ch); err != nil {
		return err
	}
	b, err := json.MarshalIndent(stateFile{Version: 1, Changes: *ch}, "", "  ")
	if err != nil {
		return fmt.Errorf("cannot encode the state file: %w", err)
	}
	if err := writeAtomic(f.path, append(b, '\n')); err != nil {
		return err
	}
	f.cur = ch
	return nil
}

// writeAtomic writes b to path by a temporary file in its directory,
// synced, then renamed over path.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("cannot write the state file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o600)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("cannot write the state file %s: %w", path, err)
	}
	return nil
}
