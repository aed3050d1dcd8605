package nginx_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rld/rld/clients/internal/nginxtest"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/internal/reqcorpus"
)

// TestAuthRequestCorpus replays clients/testdata/requests.tsv through
// nginx and the auth_request recipe into a daemon configured with
// requests.toml: for every request, repeated header fields included, the
// descriptors the daemon logged are the row's, a target too long to derive
// is refused, and a request nginx refuses itself (a row marked
// may_refuse) is never served. X-Rld-* fields that a client sends are
// replaced by nginx's, or dropped: they change nothing.
func TestAuthRequestCorpus(t *testing.T) {
	dir, err := os.MkdirTemp("", "rldn")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	httpSock := filepath.Join(dir, "http.sock")
	logPath := filepath.Join(dir, "decisions.log")
	cfg, err := reqcorpus.Config(nginxtest.CorpusLog(logPath) + `
[server]
http_socket = "` + httpSock + `"
trusted_proxies = ["unix"]
`)
	require.NoError(t, err)
	p, err := daemontest.StartProcess(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	recipe, err := os.ReadFile(filepath.Join(nginxtest.RepoDir(), "clients", "nginx", "auth_request.conf"))
	require.NoError(t, err)
	// An empty document root: an allowed request is answered 404. Header
	// buffers of 32 KiB: the rows with a 10 KiB API key and a 17000-byte
	// target reach rld.
	conf := strings.NewReplacer("/run/rld/http.sock", httpSock, "/var/www/html", t.TempDir(),
		"listen 127.0.0.1:8080;", "listen 127.0.0.1:PORT; listen [::1]:PORT;").Replace(string(recipe))
	n := nginxtest.Start(t, false, "large_client_header_buffers 4 32k;\n"+conf)
	r := nginxtest.NewReplayer(t, n, logPath, 404)
	refused := r.Corpus()
	t.Logf("refused by nginx itself: %v", refused)
	r.RldFields()
	require.NotContains(t, p.Logs(), "X-Rld-* attributes are accepted only", "every check came from nginx")
}
