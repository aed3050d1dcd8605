package openresty_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rld/rld/clients/internal/nginxtest"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/internal/reqcorpus"
)

// TestLuaRequestCorpus replays clients/testdata/requests.tsv through
// nginx and rld.lua's access helper into a daemon configured with
// requests.toml: for every request, repeated header fields included, the
// descriptors the daemon logged are the row's, a target too long to derive
// is refused, and a request nginx refuses itself (a row marked
// may_refuse) is never served. Header fields named X-Rld-* that a client
// sends change nothing.
func TestLuaRequestCorpus(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "decisions.log")
	cfg, err := reqcorpus.Config(nginxtest.CorpusLog(logPath))
	require.NoError(t, err)
	p, err := daemontest.StartProcess(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	// Header buffers of 32 KiB: the rows with a 10 KiB API key and a
	// 17000-byte target reach rld.lua, which digests them.
	n := nginxtest.Start(t, true, `
  large_client_header_buffers 4 32k;
  server {
    listen 127.0.0.1:PORT;
    listen [::1]:PORT;
    location / {
      access_by_lua_block {
        require("rld").access{ socket = "unix:`+p.Socket+`", timeout = 1000 }
      }
      content_by_lua_block { ngx.say("ok") }
    }
  }`)
	r := nginxtest.NewReplayer(t, n, logPath, 200)
	refused := r.Corpus()
	t.Logf("refused by nginx itself: %v", refused)
	r.RldFields()
	require.NotContains(t, n.ErrorLog(), "rld: cannot check", "no check failed open")
}
