package daemon_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/region"
)

// TestRegionGlobalStoreTLSAndPassword: a global store that takes only
// TLS clients with a password (the regional Redis plain, as a region's
// own network allows) renews a global key's share for a daemon whose
// [global] names its CA and password file; a daemon that trusts another
// CA, or sends another password, renews nothing, logs why, and still
// answers the key's checks (on its fallback share).
func TestRegionGlobalStoreTLSAndPassword(t *testing.T) {
	t.Parallel()
	global, tlsPort := redistest.StandaloneTLS(t)
	_, err := redistest.Do(global.Addr, "CONFIG", "SET", "requirepass", "s3cret")
	require.NoError(t, err)
	dir := t.TempDir()
	pwFile, wrongFile := filepath.Join(dir, "global.password"), filepath.Join(dir, "wrong.password")
	require.NoError(t, os.WriteFile(pwFile, []byte("s3cret\n"), 0o600))
	require.NoError(t, os.WriteFile(wrongFile, []byte("guess\n"), 0o600))
	config := func(regional, caFile, pwFile string) string {
		return fmt.Sprintf(`
[store]
redis = [%q]

[global]
redis = [%q]
region = "r0"
regions = ["r0", "r1"]
interval = "100ms"
lease = "400ms"
password_file = %q
tls = true
tls_ca_file = %q

[[rule]]
name = "global"
by = ["api_key"]
limit = 1000
period = "1s"
scope = "global"
`, regional, tlsPort.Addr, pwFile, caFile)
	}
	// The test's own reads of the global store, on its plain port.
	gc, err := region.Dial(region.DialOptions{Addrs: []string{global.Addr}, Password: "s3cret"})
	require.NoError(t, err)
	t.Cleanup(gc.Close)
	ledgers := func() int {
		keys, err := gc.Do(context.Background(), gc.B().Keys().Pattern(region.LedgerPrefix+"*").Build()).AsStrSlice()
		require.NoError(t, err)
		return len(keys)
	}
	check := func(l *logged, key string) {
		c := client.New(l.d.SocketPath())
		defer c.Close()
		res, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: key}}, 1)
		require.NoError(t, err)
		require.True(t, res.Allowed(), "key %s: far under its limit", key)
	}

	trusting := startLogged(t, t.TempDir(), config(redistest.Standalone(t).Addr, tlsPort.CAFile, pwFile))
	redistest.WaitFor(t, "the key's ledger on the global store, renewed over TLS", func() bool {
		check(trusting, "a")
		return ledgers() == 1
	})

	for _, c := range []struct{ key, caFile, pwFile, log string }{
		{"b", redistest.CAFile(t), pwFile, "certificate signed by unknown authority"},
		{"c", tlsPort.CAFile, wrongFile, "WRONGPASS"},
	} {
		l := startLogged(t, t.TempDir(), config(redistest.Standalone(t).Addr, c.caFile, c.pwFile))
		redistest.WaitFor(t, "a daemon that cannot use the global store logs "+c.log, func() bool {
			check(l, c.key)
			return strings.Contains(l.logs.String(), c.log)
		})
	}
	require.Equal(t, 1, ledgers(), "no ledger for the keys of the daemons that could not use the global store")
}
