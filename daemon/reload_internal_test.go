package daemon

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/policy"
)

// TestReloadSwapsOnePointer: a reload puts the configuration, the policy
// compiled from it, its deriver and the file's hash in force as one: a
// reader that looks while reloads alternate between two files never sees
// the rules of one with the configuration or the hash of the other, and a
// change of the overrides and blocks keeps the configuration in force.
func TestReloadSwapsOnePointer(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rld.toml")
	files := map[string]string{} // rule name → the file that has it
	for _, name := range []string{"first", "second"} {
		files[name] = "[[rule]]\nname = \"" + name + "\"\nby = [\"api_key\"]\nlimit = 10\nperiod = \"1s\"\n"
	}
	require.NoError(t, os.WriteFile(path, []byte(files["first"]), 0o644))
	d, err := New(Options{ConfigPath: path, Socket: filepath.Join(dir, "rld.sock"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer d.stopAutoBlocks()

	const reloads = 40
	var stop atomic.Bool
	var looks atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				f := d.live.Load()
				name := f.cfg.Rules[0].Name
				if !assert.Equal(t, name, f.policy.Rules()[0].Name, "the policy of the configuration in force") ||
					!assert.Equal(t, ConfigHash([]byte(files[name])), f.file.hash, "the hash of the file in force") {
					return
				}
				looks.Add(1)
			}
		}()
	}
	for i := range reloads {
		name := []string{"second", "first"}[i%2]
		require.NoError(t, os.WriteFile(path, []byte(files[name]), 0o644))
		require.NoError(t, d.Reload())
		require.Equal(t, name, d.cfg().Rules[0].Name)
	}
	stop.Store(true)
	wg.Wait()
	assert.Positive(t, looks.Load(), "the readers looked")

	before := d.live.Load()
	d.reloadMu.Lock()
	require.NoError(t, d.installChanges(&policy.Changes{}))
	d.reloadMu.Unlock()
	after := d.live.Load()
	assert.NotSame(t, before.policy, after.policy, "a change compiles a new policy")
	assert.Same(t, before.cfg, after.cfg, "over the configuration in force")
	assert.Same(t, before.deriver, after.deriver)
	assert.Same(t, before.file, after.file)
}
