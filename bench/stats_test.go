package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rld/rld/redistest"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		line string
		want time.Duration
		bad  bool
	}{
		// utime 250, stime 130 ticks: 3.8 s.
		{line: "4242 (rld) S 1 4242 4242 0 -1 4194560 1536 0 0 0 250 130 0 0 20 0 9 0 123 1234567 890 18446744073709551615", want: 3800 * time.Millisecond},
		// A command name with spaces and parentheses.
		{line: "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5 6 7", want: 30 * time.Millisecond},
		{line: "7 rld S 1 7", bad: true},
		{line: "7 (rld) S 1 7 7 0", bad: true},
		{line: "7 (rld) S 1 7 7 0 -1 0 0 0 0 0 x 2 0", bad: true},
		{line: "7 (rld) S 1 7 7 0 -1 0 0 0 0 0 -1 2 0", bad: true},
	} {
		got, err := parseProcStat([]byte(tc.line))
		if (err != nil) != tc.bad || !tc.bad && got != tc.want {
			t.Errorf("%q: %v, %v; want %v (bad %v)", tc.line, got, err, tc.want, tc.bad)
		}
	}
}

// TestProcCPU reads this process's own CPU time, which grows with work.
func TestProcCPU(t *testing.T) {
	pid := os.Getpid()
	before, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		x := 0
		for i := range 1_000_000 {
			x += i * i
		}
		_ = x
		now, err := procCPU(pid)
		if err != nil {
			t.Fatal(err)
		}
		if now > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time still %v after 5 s of work", now)
		}
	}
	if _, err := procCPU(1 << 30); err == nil {
		t.Error("no error for a pid that does not exist")
	}
}

func TestParseInfo(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_evalsha:calls=120,usec=600,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_eval:calls=3,usec=60,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hset:calls=1000,usec=1,usec_per_call=0.00,rejected_calls=0,failed_calls=0\r\n" +
		"\r\n# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:9.000000\r\n"
	n, err := parseInfo([]byte(info))
	if err != nil || n.scripts != 123 || n.cpu != 1750*time.Millisecond {
		t.Errorf("parseInfo: %+v, %v", n, err)
	}
	for _, bad := range []string{
		"used_cpu_sys:1\r\n",
		"used_cpu_sys:x\r\nused_cpu_user:1\r\n",
		"cmdstat_evalsha:usec=3\r\nused_cpu_sys:1\r\nused_cpu_user:1\r\n",
	} {
		if _, err := parseInfo([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestReadNode reads a real Redis's script calls and CPU time.
func TestReadNode(t *testing.T) {
	srv := redistest.Standalone(t)
	before, err := readNode(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := redistest.Do(srv.Addr, "EVAL", "return 1", "0"); err != nil {
			t.Fatal(err)
		}
	}
	after, err := readNode(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if after.scripts-before.scripts != 5 || after.cpu < before.cpu {
		t.Errorf("before %+v, after %+v: want 5 script calls more", before, after)
	}
	if _, err := readNode("127.0.0.1:1"); err == nil {
		t.Error("no error for a closed port")
	}
}

func TestCosts(t *testing.T) {
	p := &probe{pid: 1, nodes: []string{"a:1", "b:2"}}
	a := snapshot{cpu: time.Second, nodes: []nodeSnapshot{{scripts: 10, cpu: time.Second}, {scripts: 0, cpu: 0}}}
	b := snapshot{cpu: 3 * time.Second, nodes: []nodeSnapshot{{scripts: 310, cpu: 2 * time.Second}, {scripts: 100, cpu: time.Second}}}
	c := p.costs(a, b, 100_000)
	if c == nil || *c.CPUPerDecisionUS != 20 || *c.ScriptCallsPerDecision != 0.004 || *c.RedisCPUPerDecisionUS != 20 {
		t.Fatalf("costs %+v", c)
	}
	if len(c.Nodes) != 2 || c.Nodes[0].ScriptCalls != 300 || c.Nodes[0].Share != 0.75 || c.Nodes[1].Share != 0.25 ||
		c.Nodes[0].CPUPerDecisionUS != 10 {
		t.Errorf("nodes %+v", c.Nodes)
	}
	if (&probe{}).costs(a, b, 100) != nil || p.costs(a, b, 0) != nil {
		t.Error("costs without a probe or decisions")
	}
	one := (&probe{pid: 1}).costs(a, b, 1000)
	if one.ScriptCallsPerDecision != nil || one.Nodes != nil || *one.CPUPerDecisionUS != 2000 {
		t.Errorf("pid only: %+v", one)
	}
}

// TestProbedRun: a run with a probe reports the echo server's CPU time
// (here this process's) and a Redis's script calls per decision.
func TestProbedRun(t *testing.T) {
	srv := redistest.Standalone(t)
	keys, err := newKeySpace(distHot, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	l := &load{mode: modeClosed, conns: 1, depth: 2, warmup: 50 * time.Millisecond,
		duration: 300 * time.Millisecond, keys: keys, seed: 1}
	tgt := newRedisTarget([]string{srv.Addr}, testTemplate(t), l.depth, defaultLimit, defaultPeriod, 1)
	m, err := runLoad(context.Background(), tgt, l, &probe{pid: os.Getpid(), nodes: []string{srv.Addr}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := m.costs
	if c == nil || c.CPUPerDecisionUS == nil || c.ScriptCallsPerDecision == nil || c.RedisCPUPerDecisionUS == nil {
		t.Fatalf("costs %+v", c)
	}
	// Every answer is one script call; the window's edges may hold a
	// call answered outside it.
	if calls := *c.ScriptCallsPerDecision; calls < 0.9 || calls > 1.1 {
		t.Errorf("%.3f script calls per decision, want 1", calls)
	}
	if *c.CPUPerDecisionUS <= 0 {
		t.Errorf("CPU per decision %v", *c.CPUPerDecisionUS)
	}
	var out strings.Builder
	tbl := Table{Results: []Result{{Target: "redis", Costs: c}}}
	if err := writeTable(&out, &tbl); err != nil || !strings.Contains(out.String(), "script calls/decision") {
		t.Errorf("table: %v\n%s", err, out.String())
	}
}

func TestParseAddrs(t *testing.T) {
	got, err := parseAddrs(" 127.0.0.1:7000, 127.0.0.1:7001 ")
	if err != nil || strings.Join(got, ",") != "127.0.0.1:7000,127.0.0.1:7001" {
		t.Errorf("parseAddrs: %v, %v", got, err)
	}
	if got, err := parseAddrs(""); err != nil || got != nil {
		t.Errorf("empty: %v, %v", got, err)
	}
	for _, bad := range []string{"x", "a:1,a:1", ":1", "a:0", "a:99999", "a:b"} {
		if _, err := parseAddrs(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
