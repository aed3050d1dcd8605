package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// What a run costs beyond its latencies: the CPU time of the process
// that serves the target (from /proc/PID/stat, user + system, all its
// threads), and, for each Redis node behind it, its script calls (INFO
// commandstats: EVALSHA, EVAL and their read-only variants) and its CPU
// time (INFO cpu: used_cpu_user + used_cpu_sys). A probe reads them all
// at the start and at the end of the measurement window; divided by the
// decisions made in between, they are the per-decision costs of Result.

// clockTicks is the unit of utime and stime in /proc/PID/stat: USER_HZ,
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// statsTimeout bounds one INFO exchange with a Redis node.
const statsTimeout = 2 * time.Second

// probe names what a snapshot reads: a process's pid (0: none) and the
// addresses of Redis nodes (none: no Redis).
type probe struct {
	pid   int
	nodes []string
}

// snapshot is what a probe read at one instant.
type snapshot struct {
	cpu   time.Duration // the process's user + system time
	nodes []nodeSnapshot
}

// nodeSnapshot is one Redis node's counters.
type nodeSnapshot struct {
	scripts int64         // script calls since the node started
	cpu     time.Duration // the node's user + system time
}

// empty reports whether p reads nothing.
func (p *probe) empty() bool { return p == nil || p.pid == 0 && len(p.nodes) == 0 }

// read takes a snapshot.
func (p *probe) read() (snapshot, error) {
	var s snapshot
	if p.pid > 0 {
		cpu, err := procCPU(p.pid)
		if err != nil {
			return s, err
		}
		s.cpu = cpu
	}
	for _, addr := range p.nodes {
		n, err := readNode(addr)
		if err != nil {
			return s, err
		}
		s.nodes = append(s.nodes, n)
	}
	return s, nil
}

// procCPU returns the user + system CPU time of the process pid, all its
// threads, from /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("cannot read the CPU time of pid %d: %w", pid, err)
	}
	cpu, err := parseProcStat(b)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return cpu, nil
}

// parseProcStat returns utime + stime of a /proc/PID/stat line. The
// command name, field 2, is in parentheses and may hold spaces and
// parentheses itself: the fields are counted from the last ')'.
func parseProcStat(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("no ')' after the command name")
	}
	// Fields from 3 (state) on; utime and stime are fields 14 and 15.
	f := strings.Fields(string(b[i+1:]))
	const utime, stime = 14 - 3, 15 - 3
	if len(f) <= stime {
		return 0, fmt.Errorf("%d fields after the command name, want at least %d", len(f), stime+1)
	}
	var ticks int64
	for _, s := range f[utime : stime+1] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("bad CPU time %q", s)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// readNode reads the script calls and CPU time of the Redis node at addr.
func readNode(addr string) (nodeSnapshot, error) {
	c, err := net.DialTimeout("tcp", addr, statsTimeout)
	if err != nil {
		return nodeSnapshot{}, fmt.Errorf("redis %s: %w", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(statsTimeout))
	// INFO with two sections; the reply is one bulk string.
	if _, err := io.WriteString(c, "*3\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n$3\r\ncpu\r\n"); err != nil {
		return nodeSnapshot{}, fmt.Errorf("redis %s: INFO: %w", addr, err)
	}
	info, err := readBulk(bufio.NewReader(c))
	if err != nil {
		return nodeSnapshot{}, fmt.Errorf("redis %s: INFO: %w", addr, err)
	}
	n, err := parseInfo(info)
	if err != nil {
		return nodeSnapshot{}, fmt.Errorf("redis %s: INFO: %w", addr, err)
	}
	return n, nil
}

// maxInfo bounds the INFO reply read.
const maxInfo = 1 << 20

// readBulk reads one RESP bulk string (an error reply is an error).
func readBulk(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "-"):
		return nil, errors.New(line[1:])
	case !strings.HasPrefix(line, "$"):
		return nil, fmt.Errorf("reply %q is not a bulk string", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 || n > maxInfo {
		return nil, fmt.Errorf("bad bulk length %q", line)
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b[:n], nil
}

// scriptCommands are the commands INFO commandstats counts as script
// calls.
var scriptCommands = []string{"cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro", "cmdstat_fcall", "cmdstat_fcall_ro"}

// parseInfo reads the script calls and the CPU time of an INFO reply
// holding the commandstats and cpu sections.
func parseInfo(info []byte) (nodeSnapshot, error) {
	var n nodeSnapshot
	var sawCPU int
	for _, line := range strings.Split(string(info), "\n") {
		line = strings.TrimRight(line, "\r")
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case name == "used_cpu_user" || name == "used_cpu_sys":
			s, err := strconv.ParseFloat(value, 64)
			if err != nil || s < 0 || math.IsInf(s, 0) {
				return n, fmt.Errorf("bad %s %q", name, value)
			}
			n.cpu += time.Duration(math.Round(s*1e6)) * time.Microsecond
			sawCPU++
		case isScriptCommand(name):
			// calls=N,usec=…
			calls, _, _ := strings.Cut(value, ",")
			v, ok := strings.CutPrefix(calls, "calls=")
			c, err := strconv.ParseInt(v, 10, 64)
			if !ok || err != nil || c < 0 {
				return n, fmt.Errorf("bad %s %q", name, value)
			}
			n.scripts += c
		}
	}
	if sawCPU != 2 {
		return n, errors.New("no used_cpu_user and used_cpu_sys")
	}
	return n, nil
}

func isScriptCommand(name string) bool {
	for _, c := range scriptCommands {
		if name == c {
			return true
		}
	}
	return false
}

// Costs are what a target's decisions cost beyond their latency, over
// the measurement window, where they could be read; the Result of a
// target leaves out what it could not.
type Costs struct {
	// CPUPerDecisionUS is the CPU time (user + system, from
	// /proc/PID/stat) of the process serving the target, the daemon or
	// the echo server, per answer, in µs.
	CPUPerDecisionUS *float64 `json:"cpu_per_decision_us,omitempty"`
	// ScriptCallsPerDecision is the Redis script calls (EVALSHA, EVAL)
	// over every node, per answer.
	ScriptCallsPerDecision *float64 `json:"redis_script_calls_per_decision,omitempty"`
	// RedisCPUPerDecisionUS is the CPU time of the Redis nodes together
	// (INFO cpu, used_cpu_user + used_cpu_sys), per answer, in µs.
	RedisCPUPerDecisionUS *float64 `json:"redis_cpu_per_decision_us,omitempty"`
	// Nodes gives each Redis node's part, when there are several.
	Nodes []NodeCosts `json:"redis_nodes,omitempty"`
}

// NodeCosts is one Redis node's part of a run.
type NodeCosts struct {
	// Addr is the node's host:port.
	Addr string `json:"addr"`
	// ScriptCalls is the node's script calls in the window.
	ScriptCalls int64 `json:"script_calls"`
	// Share is ScriptCalls over every node's.
	Share float64 `json:"share"`
	// CPUPerDecisionUS is the node's CPU time per answer, in µs.
	CPUPerDecisionUS float64 `json:"cpu_per_decision_us"`
}

// costs returns the costs of decisions answers between the snapshots a
// and b of p.
func (p *probe) costs(a, b snapshot, decisions int64) *Costs {
	if p.empty() || decisions <= 0 {
		return nil
	}
	per := func(v float64) *float64 {
		r := math.Round(v/float64(decisions)*1e3) / 1e3
		return &r
	}
	c := &Costs{}
	if p.pid > 0 {
		c.CPUPerDecisionUS = per(float64(b.cpu-a.cpu) / 1e3)
	}
	if len(p.nodes) == 0 || len(a.nodes) != len(p.nodes) || len(b.nodes) != len(p.nodes) {
		return c
	}
	var calls int64
	var cpu time.Duration
	for i := range p.nodes {
		calls += b.nodes[i].scripts - a.nodes[i].scripts
		cpu += b.nodes[i].cpu - a.nodes[i].cpu
	}
	c.ScriptCallsPerDecision = per(float64(calls))
	c.RedisCPUPerDecisionUS = per(float64(cpu) / 1e3)
	if len(p.nodes) > 1 {
		for i, addr := range p.nodes {
			n := NodeCosts{Addr: addr, ScriptCalls: b.nodes[i].scripts - a.nodes[i].scripts}
			if calls > 0 {
				n.Share = math.Round(float64(n.ScriptCalls)/float64(calls)*1e3) / 1e3
			}
			n.CPUPerDecisionUS = *per(float64(b.nodes[i].cpu-a.nodes[i].cpu) / 1e3)
			c.Nodes = append(c.Nodes, n)
		}
	}
	return c
}
