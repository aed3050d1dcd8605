package daemon_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/wire"
)

const benchConfig = `
[[rule]]
name = "bench"
by = ["api_key"]
limit = 1000000000
period = "1s"
`

// echoServer is the physical floor: a bare Unix-socket server that answers
// every request frame with a response frame of the size rld's answer has,
// using the same read loop as the daemon. perFrame makes it write each
// answer with its own syscall instead of once per read batch.
func echoServer(b *testing.B, path string, perFrame bool) {
	b.Helper()
	resp := wire.AppendResponse(nil, &wire.Response{Op: wire.OpCheck, Status: wire.StatusAllowed,
		Limit: 1000000000, Remaining: 999999999, ResetMs: 1, Rule: []byte("bench")})
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				in := make([]byte, 64<<10)
				var out []byte
				start, end := 0, 0
				for {
					n, err := c.Read(in[end:])
					if err != nil {
						return
					}
					end += n
					for {
						f, n, err := wire.Next(in[start:end])
						if err != nil || f == nil {
							break
						}
						start += n
						out = append(out, resp...)
						copy(out[len(out)-len(resp)+8:], f[8:12]) // echo the id
						if perFrame {
							c.Write(out)
							out = out[:0]
						}
					}
					if len(out) > 0 {
						c.Write(out)
						out = out[:0]
					}
					end = copy(in, in[start:end])
					start = 0
				}
			}()
		}
	}()
}

// roundTrips sends b.N requests on one connection, depth at a time, and
// reports the median batch round trip and frames/s.
func roundTrips(b *testing.B, path string, depth int) {
	c, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	var batch []byte
	for i := range depth {
		batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpCheck, ID: uint32(i), Cost: 1,
			Descs: []wire.Descriptor{{Name: []byte("api_key"), Value: []byte("k" + strconv.Itoa(i%8))}}})
	}
	buf := make([]byte, wire.MaxFrame)
	var res wire.Response
	lat := make([]time.Duration, 0, b.N/depth+1)
	b.ResetTimer()
	start := time.Now()
	for done := 0; done < b.N; done += depth {
		t0 := time.Now()
		if _, err := c.Write(batch); err != nil {
			b.Fatal(err)
		}
		for range depth {
			if _, err := io.ReadFull(br, buf[:4]); err != nil {
				b.Fatal(err)
			}
			n := 4 + int(binary.BigEndian.Uint32(buf))
			if _, err := io.ReadFull(br, buf[4:n]); err != nil {
				b.Fatal(err)
			}
			if err := wire.DecodeResponse(buf[:n], &res); err != nil || res.Status != wire.StatusAllowed {
				b.Fatalf("bad answer: %v %v", err, res.Status)
			}
		}
		lat = append(lat, time.Since(t0))
	}
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns/batch")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "frames/s")
}

// pipelined keeps depth requests in flight on one connection for b.N
// requests: a writer sends as many as there are free slots, in one write,
// while a reader takes the answers and frees their slots. Client and server
// work at the same time, as with a real pipelining client. It reports
// frames/s.
func pipelined(b *testing.B, path string, depth int) {
	c, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	frame := wire.AppendRequest(nil, &wire.Request{Op: wire.OpCheck, Cost: 1,
		Descs: []wire.Descriptor{{Name: []byte("api_key"), Value: []byte("k1")}}})
	credits := make(chan int, depth+1)
	readErr := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() {
		br := bufio.NewReaderSize(c, 64<<10)
		buf := make([]byte, wire.MaxFrame)
		var res wire.Response
		freed := 0
		for got := 0; got < b.N; got++ {
			if _, err := io.ReadFull(br, buf[:4]); err != nil {
				readErr <- err
				return
			}
			n := 4 + int(binary.BigEndian.Uint32(buf))
			if _, err := io.ReadFull(br, buf[4:n]); err != nil {
				readErr <- err
				return
			}
			if err := wire.DecodeResponse(buf[:n], &res); err != nil || res.Status != wire.StatusAllowed {
				readErr <- errors.New("bad answer")
				return
			}
			freed++
			if br.Buffered() < 4 { // about to wait: hand the slots back
				credits <- freed
				freed = 0
			}
		}
		readErr <- nil
	}()
	var batch []byte
	free := depth
	for sent := 0; sent < b.N; {
		if free == 0 {
			free += <-credits
		}
		for more := true; more; {
			select {
			case n := <-credits:
				free += n
			default:
				more = false
			}
		}
		n := min(free, b.N-sent)
		batch = batch[:0]
		for i := range n {
			batch = append(batch, frame...)
			binary.BigEndian.PutUint32(batch[len(batch)-len(frame)+8:], uint32(sent+i))
		}
		if _, err := c.Write(batch); err != nil {
			b.Fatal(err)
		}
		sent += n
		free -= n
	}
	if err := <-readErr; err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "frames/s")
}

// BenchmarkSocket compares rld with the bare echo server in one run: one
// request in flight (round trip), 64 kept in flight on one connection
// (pipelined), and 64 sent in lockstep batches (write 64, read 64).
func BenchmarkSocket(b *testing.B) {
	s, err := daemontest.Start(benchConfig)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	echo := filepath.Join(b.TempDir(), "echo.sock")
	echoServer(b, echo, false)
	targets := []struct{ name, path string }{{"echo", echo}, {"rld", s.Socket}}
	for _, t := range targets {
		b.Run(t.name+"/depth=1", func(b *testing.B) { roundTrips(b, t.path, 1) })
	}
	for _, t := range targets {
		b.Run(t.name+"/pipelined=64", func(b *testing.B) { pipelined(b, t.path, 64) })
	}
	for _, t := range targets {
		b.Run(t.name+"/lockstep=64", func(b *testing.B) { roundTrips(b, t.path, 64) })
	}
}

// BenchmarkWriteStrategy measures the design fact behind the daemon's write
// loop: answering once per read batch against one write per answer, with
// 64 requests pipelined.
func BenchmarkWriteStrategy(b *testing.B) {
	for _, perFrame := range []bool{false, true} {
		name := "per-batch"
		if perFrame {
			name = "per-answer"
		}
		b.Run(name, func(b *testing.B) {
			p := filepath.Join(b.TempDir(), "s.sock")
			echoServer(b, p, perFrame)
			roundTrips(b, p, 64)
		})
	}
}

// BenchmarkKeyClock measures the other design fact: reading the clock
// once per decision against once per batch of 64, for checks of keys the
// store has not seen (new), of keys it holds, spread over 100,000 so that
// most are out of the processor's caches (held), and of one key (hot).
func BenchmarkKeyClock(b *testing.B) {
	p := algo.Params{Kind: algo.TokenBucket, Limit: 100, Period: time.Minute}
	ctx := context.Background()
	const held = 100_000
	for _, keys := range []string{"new", "held", "hot"} {
		for _, perDecision := range []bool{false, true} {
			name := keys + "/now-per-batch"
			if perDecision {
				name = keys + "/now-per-decision"
			}
			b.Run(name, func(b *testing.B) {
				st := memstore.New(memstore.Options{MaxKeys: 1 << 22})
				key := make([]byte, 0, 32)
				now := time.Now()
				if keys == "held" {
					for i := range held {
						key = strconv.AppendInt(append(key[:0], "key:"...), int64(i), 10)
						if _, err := st.Take(ctx, key, p, 1, now, false); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if perDecision || i%64 == 0 {
						now = time.Now()
					}
					n := i
					switch keys {
					case "held":
						n = (i * 7919) % held // a stride through the held keys
					case "hot":
						n = 0
					}
					key = strconv.AppendInt(append(key[:0], "key:"...), int64(n), 10)
					if _, err := st.Take(ctx, key, p, 1, now, false); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
