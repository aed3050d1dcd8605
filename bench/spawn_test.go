package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rld/rld/config"
	"github.com/rld/rld/wire"
)

// TestRLDConfig: the configuration a spawned daemon gets is valid, and
// says what rld-bench means.
func TestRLDConfig(t *testing.T) {
	for _, redis := range []string{"", "127.0.0.1:6390", "127.0.0.1:7001,127.0.0.1:7002"} {
		rc := &rldConfig{socket: "/tmp/x/rld.sock", names: []string{"api_key", "endpoint"},
			limit: 5000, keys: 3_000_000, inflight: 8, prefix: "rld-bench-redis-cached:"}
		if redis != "" {
			rc.redis = strings.Split(redis, ",")
			rc.cluster = len(rc.redis) > 1
		}
		c, err := config.Parse([]byte(rc.toml()), "spawned.toml")
		if err != nil {
			t.Fatalf("redis %q: %v\n%s", redis, err, rc.toml())
		}
		if c.Server.Socket != rc.socket || c.Server.HTTP != "" || c.Server.MaxInflight != spawnMinInflight ||
			c.Store.MaxKeys != 6_000_000 || c.Store.UsesRedis() != (redis != "") {
			t.Errorf("redis %q: server %+v, store %+v", redis, c.Server, c.Store)
		}
		if redis != "" && (strings.Join(c.Store.Redis, ",") != redis || time.Duration(c.Store.Timeout) != 250*time.Millisecond ||
			c.Store.KeyPrefix != rc.prefix ||
			(c.Store.Mode == config.RedisCluster) != rc.cluster) {
			t.Errorf("store %+v", c.Store)
		}
		if len(c.Rules) != 1 {
			t.Fatalf("%d rules", len(c.Rules))
		}
		r := c.Rules[0]
		if r.Name != benchRule || r.Algorithm != "token_bucket" || r.Limit != 5000 || time.Duration(r.Period) != defaultPeriod ||
			strings.Join(r.By, ",") != "api_key,endpoint" || len(r.Match) != 0 {
			t.Errorf("rule %+v", r)
		}
	}
	for _, alg := range algorithms {
		rc := &rldConfig{socket: "/tmp/x/rld.sock", names: []string{"api_key"}, limit: 100, period: time.Minute, alg: alg,
			mode: ruleStrict, redis: []string{"127.0.0.1:6390"}}
		c, err := config.Parse([]byte(rc.toml()), "spawned.toml")
		if err != nil {
			t.Fatalf("%s: %v\n%s", alg, err, rc.toml())
		}
		if c.Rules[0].Algorithm != alg || time.Duration(c.Rules[0].Period) != time.Minute {
			t.Errorf("%s: rule %+v", alg, c.Rules[0])
		}
	}
}

// TestPing: ping accepts a PING answer and nothing else.
func TestPing(t *testing.T) {
	serve := func(answer *wire.Response) string {
		sock := filepath.Join(t.TempDir(), "s.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			buf := make([]byte, 64)
			n, _ := c.Read(buf)
			var req wire.Request
			if wire.DecodeRequest(buf[:n], &req) == nil {
				answer.ID = req.ID
				c.Write(wire.AppendResponse(nil, answer))
			}
		}()
		return sock
	}
	if err := ping(serve(&wire.Response{Op: wire.OpPing})); err != nil {
		t.Errorf("PING answered: %v", err)
	}
	if err := ping(serve(&wire.Response{Op: wire.OpCheck})); err == nil {
		t.Error("a CHECK answer to PING: no error")
	}
	if err := ping(filepath.Join(t.TempDir(), "none.sock")); err == nil {
		t.Error("no socket: no error")
	}
}

// TestSpawnRedis starts redis-server as -spawn does, and stops it.
func TestSpawnRedis(t *testing.T) {
	ps, err := newProcs()
	if err != nil {
		t.Fatal(err)
	}
	defer ps.close()
	addr, err := ps.startRedis(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := redisPing(addr); err != nil {
		t.Fatal(err)
	}
	ps.close()
	if err := redisPing(addr); err == nil {
		t.Error("redis-server still answers after close")
	}
}
