package daemon

import (
	"context"
	"crypto/rand"
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
)

// changeStore keeps the run-time changes (overrides and blocks) where
// they outlive the process: a state file for the embedded store.
type changeStore interface {
	// load returns the changes stored.
	load(ctx context.Context) (*policy.Changes, error)
	// update applies fn to the changes stored, stores the result and
	// returns it. fn's error changes nothing.
	update(ctx context.Context, fn func(ch *policy.Changes) error) (*policy.Changes, error)
}

var (
	changesOrphaned  = metrics.NewGauge(`rld_changes_orphaned`, nil)
	changesOverrides = metrics.NewGauge(`rld_changes_overrides`, nil)
	changesBlocks    = metrics.NewGauge(`rld_changes_blocks`, nil)
)

// openChanges opens the store of run-time changes and compiles the ones
// stored into the policy in force. New calls it once the policy is built.
func (d *Daemon) openChanges(cfg *config.Config) {
	d.chStore = &fileChanges{path: cfg.Admin.ChangesFile(cfg.Server.Socket), log: d.log}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ch, err := d.chStore.load(ctx)
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
	p, err := policy.Compile(d.cfg(), ch, d.stores)
	if err != nil {
		return fmt.Errorf("cannot compile the overrides and blocks: %w", err)
	}
	d.policy.Store(p)
	d.reportChanges(p)
	return nil
}

// reportChanges logs and counts the changes of p whose rule is gone.
func (d *Daemon) reportChanges(p *policy.Policy) {
	ch := p.Changes()
	changesOverrides.Set(float64(len(ch.Overrides)))
	changesBlocks.Set(float64(len(ch.Blocks)))
	orphans := p.Orphans()
	changesOrphaned.Set(float64(len(orphans)))
	for _, o := range orphans {
		d.log.Warn("an override or block names a rule the configuration does not have (or whose by descriptors changed): it applies to nothing until the rule is back",
			slog.String("id", o.ID), slog.String("rule", o.Rule))
	}
}

// change applies fn to the stored changes, with the Policy in force to
// validate against, and swaps in the Policy of the result. Expired
// entries are dropped on the way.
func (d *Daemon) change(ctx context.Context, fn func(p *policy.Policy, ch *policy.Changes) error) error {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	p := d.policy.Load()
	ch, err := d.chStore.update(ctx, func(ch *policy.Changes) error {
		pruneExpired(ch, time.Now())
		return fn(p, ch)
	})
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

func newChangeID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
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

// SetOverride implements admin.ChangeService.
func (s adminService) SetOverride(ctx context.Context, a admin.OverrideArgs) (admin.OverrideEntry, error) {
	now := time.Now()
	exp, err := admin.Expiry(a.TTL, a.ExpiresAt, now)
	if err != nil {
		return admin.OverrideEntry{}, err
	}
	o := policy.Override{
		ID: newChangeID("o-"), Rule: a.Rule, Key: a.Key, Match: a.Match,
		Limit: a.Limit, Burst: a.Burst, Multiplier: a.Multiplier,
		Expires: exp, Reason: a.Reason, Author: author(ctx, a.Author), Created: now,
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
	err = s.d.change(ctx, func(p *policy.Policy, ch *policy.Changes) error {
		if err := p.ValidateOverride(&o, now); err != nil {
			return refusal(err)
		}
		ch.Overrides = append(ch.Overrides, o)
		return nil
	})
	if err != nil {
		return admin.OverrideEntry{}, err
	}
	return overrideEntry(&o, false), nil
}

// DeleteOverride implements admin.ChangeService.
func (s adminService) DeleteOverride(ctx context.Context, a admin.IDArgs) (admin.Deleted, error) {
	err := s.d.change(ctx, func(_ *policy.Policy, ch *policy.Changes) error {
		n := len(ch.Overrides)
		ch.Overrides = slices.DeleteFunc(ch.Overrides, func(o policy.Override) bool { return o.ID == a.ID })
		if len(ch.Overrides) == n {
			return admin.Errorf(admin.CodeNotFound, "no override %q (list shows them; an expired one is gone)", a.ID)
		}
		return nil
	})
	return admin.Deleted{ID: a.ID}, err
}

// Block implements admin.ChangeService.
func (s adminService) Block(ctx context.Context, a admin.BlockArgs) (admin.BlockEntry, error) {
	now := time.Now()
	exp, err := admin.Expiry(a.TTL, a.ExpiresAt, now)
	if err != nil {
		return admin.BlockEntry{}, err
	}
	b := policy.Block{
		ID: newChangeID("b-"), Match: a.Match, Rule: a.Rule, Key: a.Key,
		Expires: exp, Reason: a.Reason, Author: author(ctx, a.Author), Created: now,
	}
	err = s.d.change(ctx, func(p *policy.Policy, ch *policy.Changes) error {
		if err := p.ValidateBlock(&b, now); err != nil {
			return refusal(err)
		}
		ch.Blocks = append(ch.Blocks, b)
		return nil
	})
	if err != nil {
		return admin.BlockEntry{}, err
	}
	return blockEntry(&b, false), nil
}

// Unblock implements admin.ChangeService.
func (s adminService) Unblock(ctx context.Context, a admin.IDArgs) (admin.Deleted, error) {
	err := s.d.change(ctx, func(_ *policy.Policy, ch *policy.Changes) error {
		n := len(ch.Blocks)
		ch.Blocks = slices.DeleteFunc(ch.Blocks, func(b policy.Block) bool { return b.ID == a.ID })
		if len(ch.Blocks) == n {
			return admin.Errorf(admin.CodeNotFound, "no block %q (list shows them; an expired one is gone)", a.ID)
		}
		return nil
	})
	return admin.Deleted{ID: a.ID}, err
}

// List implements admin.ChangeService.
func (s adminService) List(context.Context) (admin.ListResult, error) {
	p := s.d.policy.Load()
	orphan := map[string]bool{}
	for _, o := range p.Orphans() {
		orphan[o.ID] = true
	}
	ch := p.Changes()
	pruneExpired(ch, time.Now())
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
	e := admin.OverrideEntry{
		ID: o.ID, Rule: o.Rule, Key: o.Key, Match: o.Match, Limit: o.Limit, Burst: o.Burst,
		Multiplier: o.Multiplier, Expires: o.Expires, Reason: o.Reason, Author: o.Author,
		Created: o.Created, Orphaned: orphaned,
	}
	if o.Period > 0 {
		e.Period = config.Duration(o.Period).String()
	}
	return e
}

func blockEntry(b *policy.Block, orphaned bool) admin.BlockEntry {
	return admin.BlockEntry{
		ID: b.ID, Match: b.Match, Rule: b.Rule, Key: b.Key, Expires: b.Expires,
		Reason: b.Reason, Author: b.Author, Created: b.Created, Orphaned: orphaned,
	}
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

func (f *fileChanges) load(context.Context) (*policy.Changes, error) {
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

func (f *fileChanges) update(_ context.Context, fn func(ch *policy.Changes) error) (*policy.Changes, error) {
	ch := f.cur.Clone()
	if err := fn(ch); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(stateFile{Version: 1, Changes: *ch}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("cannot encode the state file: %w", err)
	}
	if err := writeAtomic(f.path, append(b, '\n')); err != nil {
		return nil, err
	}
	f.cur = ch.Clone()
	return ch, nil
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
