package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/config"
)

// TestImportEnvoy: rld config import-envoy prints an rld.toml that loads,
// with the [envoy] table and one rule per limited descriptor; a file it
// cannot express is refused with its line, printing nothing.
func TestImportEnvoy(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	require.NoError(t, os.WriteFile(good, []byte(`domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`), 0o644))
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"config", "import-envoy", good}, &out, &errOut), errOut.String())
	conf := filepath.Join(dir, "rld.toml")
	require.NoError(t, os.WriteFile(conf, out.Bytes(), 0o644))
	cfg, err := config.Load(conf)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:8081", cfg.Envoy.Listen)
	require.Len(t, cfg.Rules, 2)
	assert.Equal(t, map[string]string{"domain": "mongo_cps", "envoy_keys": "database", "database": "users"}, cfg.Rules[0].Match)
	assert.Equal(t, int64(500), cfg.Rules[0].Limit)

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"), 0o644))
	out.Reset()
	errOut.Reset()
	assert.Equal(t, exitError, run([]string{"config", "import-envoy", bad}, &out, &errOut))
	assert.Empty(t, out.String())
	assert.Contains(t, errOut.String(), "bad.yaml: line 3: domain \"d\": unit \"fortnight\"")

	errOut.Reset()
	assert.Equal(t, exitError, run([]string{"config", "import-envoy"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "want one or more FILE.yaml")
}
