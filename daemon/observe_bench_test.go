package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rld/rld/wire"
)

// BenchmarkProcessDenied is BenchmarkProcess with every check denied and
// the decision log on at its default sampling: each denial is counted in
// its rule's top-keys sketch, and sampling says no to almost all lines.
func BenchmarkProcessDenied(b *testing.B) {
	dir := b.TempDir()
	cfg := filepath.Join(dir, "rld.toml")
	if err := os.WriteFile(cfg, []byte("[server]\nhttp = \"\"\n[log]\ndecisions = \""+os.DevNull+
		"\"\n[[rule]]\nname = \"bench\"\nby = [\"api_key\"]\nlimit = 1\nperiod = \"1h\"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	d, err := New(Options{ConfigPath: cfg, Socket: filepath.Join(dir, "s.sock"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer d.ops.obs.Close()
	cn := d.newConn(nil)
	var batch []byte
	for i := range 64 {
		batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpCheck, ID: uint32(i), Cost: 1,
			Descs: []wire.Descriptor{{Name: []byte("api_key"), Value: []byte("k1")}}})
	}
	n := copy(cn.in, batch)
	ctx := context.Background()
	cn.process(ctx, time.Now(), 0, n, 1<<30) // the key's one unit is taken: every check after is denied
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 64 {
		cn.out = cn.out[:0]
		if start, lost := cn.process(ctx, time.Now(), 0, n, 1<<30); lost || start != n {
			b.Fatal("frames not processed")
		}
	}
}
