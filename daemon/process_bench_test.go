package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// BenchmarkProcess measures the daemon's own work per frame, without the
// socket: decoding, deciding and encoding a read batch of 64 checks of one
// rule on the embedded store.
func BenchmarkProcess(b *testing.B) {
	benchProcess(b, []wire.Descriptor{{Name: []byte("api_key"), Value: []byte("k1")}})
}

// BenchmarkProcessAttributes measures the same for checks that carry a
// request's attributes, as the web clients send them: the daemon derives
// ip, method, host, endpoint and api_key from them first.
func BenchmarkProcessAttributes(b *testing.B) {
	benchProcess(b, []wire.Descriptor{
		{Name: []byte(":peer"), Value: []byte("203.0.113.7")},
		{Name: []byte(":method"), Value: []byte("GET")},
		{Name: []byte(":host"), Value: []byte("api.example.com")},
		{Name: []byte(":target"), Value: []byte("/v1/search?q=rate+limits")},
		{Name: []byte(":h:x-api-key"), Value: []byte("k1")},
	})
}

func benchProcess(b *testing.B, descs []wire.Descriptor) {
	dir := b.TempDir()
	cfg := filepath.Join(dir, "rld.toml")
	if err := os.WriteFile(cfg, []byte("[server]\nhttp = \"\"\n[request.descriptors]\napi_key = \"header:x-api-key\"\n[[rule]]\nname = \"bench\"\nby = [\"api_key\"]\nlimit = 1000000000\nperiod = \"1s\"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	d, err := New(Options{ConfigPath: cfg, Socket: filepath.Join(dir, "s.sock"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	cn := d.newConn(nil)
	var batch []byte
	for i := range 64 {
		batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpCheck, ID: uint32(i), Cost: 1, Descs: descs})
	}
	n := copy(cn.in, batch)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 64 {
		cn.out = cn.out[:0]
		if start, lost := cn.process(ctx, time.Now(), 0, n, 1<<30); lost || start != n {
			b.Fatal("frames not processed")
		}
	}
}

// BenchmarkProcessRedisLeases measures the same with the daemon on Redis:
// a read batch of 64 checks of eight keys of a cached rule, whose leases
// answer them on the host (the first batches take the leases, outside
// the timing). Such frames are answered inline: no goroutine, no
// allocation.
func BenchmarkProcessRedisLeases(b *testing.B) {
	srv := redistest.Standalone(b)
	dir := b.TempDir()
	cfg := filepath.Join(dir, "rld.toml")
	toml := fmt.Sprintf("[server]\nhttp = \"\"\n[store]\nredis = [%q]\n[[rule]]\nname = \"bench\"\nby = [\"api_key\"]\nlimit = 1000000000\nperiod = \"1s\"\n", srv.Addr)
	if err := os.WriteFile(cfg, []byte(toml), 0o600); err != nil {
		b.Fatal(err)
	}
	d, err := New(Options{ConfigPath: cfg, Socket: filepath.Join(dir, "s.sock"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.fleet.close(d.log) })
	cn := d.newConn(drainedConn(b)) // the first batches' frames go to workers, which write
	defer cn.finish()
	var batch []byte
	for i := range 64 {
		batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpCheck, ID: uint32(i), Cost: 1,
			Descs: []wire.Descriptor{{Name: []byte("api_key"), Value: fmt.Appendf(nil, "k%d", i%8)}}})
	}
	n := copy(cn.in, batch)
	ctx := context.Background()
	run := func() {
		cn.out = cn.out[:0]
		if start, lost := cn.process(ctx, time.Now(), 0, n, 1<<30); lost || start != n {
			b.Fatal("frames not processed")
		}
		cn.waitAnswered() // those that went to Redis, as a client waits for its answers
	}
	for range 20 { // the leases grow to cover a batch
		run()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 64 {
		run()
	}
}

// drainedConn returns one end of a Unix socket pair whose other end is
// read and discarded until b ends.
func drainedConn(b *testing.B) *net.UnixConn {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		b.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
	}
	go func() { _, _ = io.Copy(io.Discard, conns[1]) }()
	b.Cleanup(func() {
		conns[0].Close()
		conns[1].Close()
	})
	return conns[0]
}

// BenchmarkProcessRedisStrict measures read batches of checks of eight
// keys of a strict rule, decided in Redis: batch=64 hands every one to
// the connection's workers; batch=1, a client with one request at a
// time, decides it on the read loop. Per frame, the allocations are the
// Redis call's and the coalescing's, none the hand-off's.
func BenchmarkProcessRedisStrict(b *testing.B) {
	srv := redistest.Standalone(b)
	dir := b.TempDir()
	cfg := filepath.Join(dir, "rld.toml")
	toml := fmt.Sprintf("[server]\nhttp = \"\"\n[store]\nredis = [%q]\n[[rule]]\nname = \"bench\"\nby = [\"api_key\"]\nlimit = 1000000000\nperiod = \"1s\"\nmode = \"strict\"\n", srv.Addr)
	if err := os.WriteFile(cfg, []byte(toml), 0o600); err != nil {
		b.Fatal(err)
	}
	d, err := New(Options{ConfigPath: cfg, Socket: filepath.Join(dir, "s.sock"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.fleet.close(d.log) })
	for _, size := range []int{64, 1} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			cn := d.newConn(drainedConn(b))
			defer cn.finish()
			var batch []byte
			for i := range size {
				batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpCheck, ID: uint32(i), Cost: 1,
					Descs: []wire.Descriptor{{Name: []byte("api_key"), Value: fmt.Appendf(nil, "k%d", i%8)}}})
			}
			n := copy(cn.in, batch)
			ctx := context.Background()
			run := func() {
				cn.out = cn.out[:0]
				if start, lost := cn.process(ctx, time.Now(), 0, n, 1<<30); lost || start != n {
					b.Fatal("frames not processed")
				}
				cn.waitAnswered()
			}
			for range 20 { // workers and buffers grow to a batch's needs
				run()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += size {
				run()
			}
		})
	}
}
