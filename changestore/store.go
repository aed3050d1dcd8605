// Package changestore keeps the run-time changes that admin operations
// make — overrides and blocks (package change) — where they outlive the
// process: File, a JSON state file, for a daemon on its embedded store;
// Redis, for a fleet, which every daemon of it watches (Redis.Watch).
package changestore

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

	"github.com/rld/rld/policy"
)

// Store keeps the run-time changes (overrides and blocks). Its caller
// serialises the calls that write (the daemon holds its reload lock).
type Store interface {
	// Load returns the changes stored, not expired.
	Load(ctx context.Context) (*policy.Changes, error)
	// AddOverride stores o; when ttl > 0 its expiry is ttl from the
	// store's now, and o.Expires is set to it.
	AddOverride(ctx context.Context, o *policy.Override, ttl time.Duration) error
	// AddBlock stores b as AddOverride stores an override.
	AddBlock(ctx context.Context, b *policy.Block, ttl time.Duration) error
	// Remove removes the override (or the block) called id and reports
	// whether there was one.
	Remove(ctx context.Context, override bool, id string) (bool, error)
	// Skew is the store's clock minus the local clock (0: the same).
	Skew() time.Duration
}

// NewFile returns the store of the changes in the state file at path;
// log gets what its first load found.
func NewFile(path string, log *slog.Logger) *File {
	return &File{path: path, log: log}
}

// PruneExpired drops the entries of ch expired at now.
func PruneExpired(ch *policy.Changes, now time.Time) {
	ch.Overrides = slices.DeleteFunc(ch.Overrides, func(o policy.Override) bool { return !o.Expires.After(now) })
	ch.Blocks = slices.DeleteFunc(ch.Blocks, func(b policy.Block) bool { return !b.Expires.After(now) })
}

// NewID returns a new id: prefix, then the creation time (Unix
// nanoseconds, 16 hex digits) and 4 random hex digits, so that list's
// order of id is the order of creation (on one daemon's clock) of the
// changes admin ops make (an automatic block's id names its rule and key
// instead).
func NewID(prefix string) string {
	var b [10]byte
	binary.BigEndian.PutUint64(b[:8], uint64(time.Now().UnixNano()))
	_, _ = rand.Read(b[8:])
	return prefix + hex.EncodeToString(b[:])
}

// File keeps the changes in memory and in a JSON state file,
// written whole to a temporary file that is renamed over it, so that a
// crash leaves the old file or the new, never half of one.
type File struct {
	path string
	log  *slog.Logger
	cur  *policy.Changes // the caller serialises the calls that write
}

// stateFile is the state file's content.
type stateFile struct {
	Version int `json:"version"`
	policy.Changes
}

// Skew implements Store: the file's expiries are on the local clock.
func (f *File) Skew() time.Duration { return 0 }

// Load implements Store. The first load reads the file; one that cannot
// be read is moved aside (PATH.bad-TIME) and the error says where.
func (f *File) Load(context.Context) (*policy.Changes, error) {
	if f.cur != nil {
		ch := f.cur.Clone()
		PruneExpired(ch, time.Now())
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
	PruneExpired(&st.Changes, time.Now())
	f.cur = st.Changes.Clone()
	f.log.Info("overrides and blocks loaded", slog.String("state_file", f.path),
		slog.Int("overrides", len(f.cur.Overrides)), slog.Int("blocks", len(f.cur.Blocks)))
	return f.cur.Clone(), nil
}

// AddOverride implements Store.
func (f *File) AddOverride(ctx context.Context, o *policy.Override, ttl time.Duration) error {
	if ttl > 0 {
		o.Expires = time.Now().Add(ttl)
	}
	return f.update(ctx, func(ch *policy.Changes) error {
		ch.Overrides = append(ch.Overrides, *o)
		return nil
	})
}

// AddBlock implements Store: a block with the id of one stored replaces
// it.
func (f *File) AddBlock(ctx context.Context, b *policy.Block, ttl time.Duration) error {
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

// Remove implements Store.
func (f *File) Remove(ctx context.Context, override bool, id string) (bool, error) {
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
func (f *File) update(ctx context.Context, fn func(ch *policy.Changes) error) error {
	ch, err := f.Load(ctx)
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
