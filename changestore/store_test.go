package changestore_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/changestore"
	"github.com/rld/rld/policy"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestFileKeepsChangesAcrossOpens stores an override and a block, removes
// nothing that is not there, and finds both again in a new File on the
// same path (a restart); the removed one stays removed.
func TestFileKeepsChangesAcrossOpens(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "changes.json")
	f := changestore.NewFile(path, quiet())
	ch, err := f.Load(ctx)
	require.NoError(t, err)
	assert.Empty(t, ch.Overrides)
	assert.Empty(t, ch.Blocks)

	o := policy.Override{ID: changestore.NewID("o-"), Rule: "r", Key: map[string]string{"k": "v"}, Limit: 5}
	require.NoError(t, f.AddOverride(ctx, &o, time.Hour))
	assert.True(t, o.Expires.After(time.Now()), "a ttl sets the expiry")
	b := policy.Block{ID: changestore.NewID("b-"), Match: map[string]string{"ip": "10.*"}, Expires: time.Now().Add(time.Hour)}
	require.NoError(t, f.AddBlock(ctx, &b, 0))
	ok, err := f.Remove(ctx, true, "o-nothing")
	require.NoError(t, err)
	assert.False(t, ok, "removing an id not stored reports nothing removed")

	again := changestore.NewFile(path, quiet())
	ch, err = again.Load(ctx)
	require.NoError(t, err)
	require.Len(t, ch.Overrides, 1)
	require.Len(t, ch.Blocks, 1)
	assert.Equal(t, o.ID, ch.Overrides[0].ID)
	assert.Equal(t, b.ID, ch.Blocks[0].ID)

	ok, err = again.Remove(ctx, false, b.ID)
	require.NoError(t, err)
	assert.True(t, ok)
	ch, err = changestore.NewFile(path, quiet()).Load(ctx)
	require.NoError(t, err)
	assert.Len(t, ch.Overrides, 1)
	assert.Empty(t, ch.Blocks, "a removed block is gone from the file")
}

// TestFileSameBlockIDReplaces stores an automatic block twice under one
// id: the second replaces the first.
func TestFileSameBlockIDReplaces(t *testing.T) {
	ctx := context.Background()
	f := changestore.NewFile(filepath.Join(t.TempDir(), "changes.json"), quiet())
	b := policy.Block{ID: "b-auto-r", Rule: "r", Key: map[string]string{"k": "v"}, Reason: "first"}
	require.NoError(t, f.AddBlock(ctx, &b, time.Hour))
	b.Reason = "second"
	require.NoError(t, f.AddBlock(ctx, &b, time.Hour))
	ch, err := f.Load(ctx)
	require.NoError(t, err)
	require.Len(t, ch.Blocks, 1)
	assert.Equal(t, "second", ch.Blocks[0].Reason)
}

// TestFileUnreadableMovedAside: a state file that is not one is moved
// aside, the error names where, and the next load starts empty.
func TestFileUnreadableMovedAside(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "changes.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"version":7}`), 0o600))
	_, err := changestore.NewFile(path, quiet()).Load(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "version 7, want 1")
	assert.Contains(t, err.Error(), path+".bad-")
	_, statErr := os.Stat(path)
	assert.ErrorIs(t, statErr, os.ErrNotExist, "the bad file is moved away")
	ch, err := changestore.NewFile(path, quiet()).Load(ctx)
	require.NoError(t, err)
	assert.Empty(t, ch.Overrides)
}

// TestPruneExpired drops exactly the entries expired at now.
func TestPruneExpired(t *testing.T) {
	now := time.Now()
	ch := &policy.Changes{
		Overrides: []policy.Override{{ID: "o-old", Expires: now}, {ID: "o-new", Expires: now.Add(time.Second)}},
		Blocks:    []policy.Block{{ID: "b-old", Expires: now.Add(-time.Second)}, {ID: "b-new", Expires: now.Add(time.Hour)}},
	}
	changestore.PruneExpired(ch, now)
	require.Len(t, ch.Overrides, 1)
	require.Len(t, ch.Blocks, 1)
	assert.Equal(t, "o-new", ch.Overrides[0].ID)
	assert.Equal(t, "b-new", ch.Blocks[0].ID)
}

// TestNewIDOrdersByCreation: ids of later changes sort after earlier ones.
func TestNewIDOrdersByCreation(t *testing.T) {
	a := changestore.NewID("o-")
	var b string
	for b = changestore.NewID("o-"); b[:18] == a[:18]; b = changestore.NewID("o-") {
	}
	assert.True(t, strings.HasPrefix(a, "o-"))
	assert.Len(t, a, 2+20)
	assert.Less(t, a, b)
}
