package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	t.Setenv("RLD_SOCKET", "/tmp/env.sock")
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.load.mode != modeOpen || c.load.rate != defaultRate || c.load.conns != defaultConnections ||
		c.load.depth != defaultDepth || c.load.duration != defaultDuration || c.load.warmup != defaultWarmup ||
		c.load.keys.dist != distZipf || c.cost != 1 || c.socket != "/tmp/env.sock" ||
		strings.Join(c.targets, ",") != "echo,rld" || c.tmpl.String() != defaultDescriptors {
		t.Errorf("defaults: %+v, load %+v", c, c.load)
	}

	c, err = parseFlags(strings.Fields("-mode closed -connections 2 -depth 64 -duration 1s -dist hot "+
		"-targets rld,redis,echo -spawn -rld /bin/true -store embedded,redis -cost 3 -json -plot x.svg"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.load.mode != modeClosed || c.load.rate != 0 || c.load.depth != 64 || c.load.duration != time.Second ||
		c.load.keys.n != 1 || strings.Join(c.targets, ",") != "rld,redis,echo" || !c.spawn ||
		strings.Join(c.stores, ",") != "embedded,redis" || c.rldBin != "/bin/true" || c.cost != 3 || !c.json || c.plot != "x.svg" {
		t.Errorf("flags: %+v, load %+v", c, c.load)
	}

	for _, args := range []string{
		"-mode half", "-rate 0", "-connections 0", "-depth 0", "-duration 0s", "-warmup -1s", "-cost 0",
		"-targets echo,echo", "-targets nginx", "-spawn -rld /bin/true -store disk", "-dist zipf -zipf 0",
		"-descriptors a", "-limit 0", "extra", "-pid -1", "-spawn -rld /bin/true -pid 5", "-redis-cluster x",
		"-redis-nodes 127.0.0.1:1,127.0.0.1:1", "-algorithm leaky", "-targets redis -algorithm gcra",
	} {
		if _, err := parseFlags(strings.Fields(args), io.Discard); err == nil {
			t.Errorf("%s: no error", args)
		}
	}
	c, err = parseFlags(strings.Fields("-redis-cluster 127.0.0.1:7000,127.0.0.1:7001 -redis-nodes 127.0.0.1:7002 -pid 42"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.cluster, ",") != "127.0.0.1:7000,127.0.0.1:7001" || strings.Join(c.statNodes, ",") != "127.0.0.1:7002" || c.pid != 42 {
		t.Errorf("redis flags: %+v", c)
	}
	c, err = parseFlags(strings.Fields("-spawn -rld /bin/true -store embedded,redis -rule-mode cached,strict"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(c.tables()); got != "[{embedded cached} {redis cached} {redis strict}]" {
		t.Errorf("tables %s", got)
	}
	c, err = parseFlags(strings.Fields("-spawn -rld /bin/true -targets rld -algorithm fixed_window -limit 100"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rule, ok := c.boundRule(targetRLD); c.algorithm != algFixedWindow || !ok || rule != (boundRule{alg: algFixedWindow, limit: 100, period: defaultPeriod}) {
		t.Errorf("-algorithm: %q, bound rule %+v", c.algorithm, rule)
	}
	c, err = parseFlags(strings.Fields("-spawn -rld /bin/true -targets rld -algorithm fixed_window -limit 6000 -period 1m"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rule, ok := c.boundRule(targetRLD); !ok || rule != (boundRule{alg: algFixedWindow, limit: 6000, period: time.Minute}) {
		t.Errorf("-period 1m: bound rule %+v", rule)
	}
	for _, bad := range []string{"0s", "1500us", "-1s"} {
		if _, err := parseFlags([]string{"-period", bad}, io.Discard); err == nil {
			t.Errorf("-period %s: no error", bad)
		}
	}
	if _, ok := c.boundRule(targetEcho); ok {
		t.Error("the echo target has a bound rule")
	}
	if _, err := parseFlags(strings.Fields("-rule-mode cached,lax"), io.Discard); err == nil {
		t.Error("-rule-mode lax: no error")
	}
	if _, err := parseFlags([]string{"-descriptors", " "}, io.Discard); err == nil {
		t.Error("no descriptors: no error")
	}
}

func TestHelp(t *testing.T) {
	var out strings.Builder
	if code := run([]string{"-h"}, io.Discard, &out); code != 0 || !strings.Contains(out.String(), "-targets") {
		t.Errorf("-h: exit %d, %q", code, out.String())
	}
	if code := run([]string{"-mode", "x"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("bad flag: exit %d, want 2", code)
	}
}

// TestMain lets the test binary serve as rld-bench's echo server: a run
// started by a test (BenchmarkCluster) starts its own executable as
// `rld-bench echo`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "echo" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
