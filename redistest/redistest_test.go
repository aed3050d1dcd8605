package redistest

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
)

func TestStandaloneStartKillRestart(t *testing.T) {
	s := Standalone(t)
	if _, err := Do(s.Addr, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if v, err := Do(s.Addr, "GET", "k"); err != nil || v != "v" {
		t.Fatalf("GET k = %q, %v", v, err)
	}
	s.Kill()
	if _, err := Do(s.Addr, "PING"); err == nil {
		t.Fatal("killed server still answers")
	}
	s.Start(t)
	if v, err := Do(s.Addr, "GET", "k"); err != nil || v != "" {
		t.Fatalf("restarted server kept data: %q, %v", v, err)
	}
}

// TestStartFailureQuotesLog checks that a server that exits at start-up
// fails at once with the tail of its log, and that a taken port is told
// apart, taken by another redis-server too (spawn retries those with
// another port).
func TestStartFailureQuotesLog(t *testing.T) {
	port := FreePort(t, 0)
	s := &Server{Dir: t.TempDir(), Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port),
		args: []string{"--port", strconv.Itoa(port), "--no-such-directive", "1"}}
	t.Cleanup(s.Kill)
	err := s.start()
	if err == nil || errors.Is(err, errPortTaken) || !strings.Contains(err.Error(), "no-such-directive") {
		t.Errorf("bad directive: start() = %v; want the log quoted", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // answer nothing: close every connection at once
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port = l.Addr().(*net.TCPAddr).Port
	s.Port, s.Addr = port, l.Addr().String()
	s.args = []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", ""}
	if err := s.start(); !errors.Is(err, errPortTaken) {
		t.Errorf("taken port: start() = %v; want errPortTaken", err)
	}

	// Taken by another redis-server, which answers on the port while
	// this one fails to bind it: still a taken port, not a start.
	other := Standalone(t)
	s.Port, s.Addr = other.Port, other.Addr
	s.args = []string{"--port", strconv.Itoa(other.Port), "--bind", "127.0.0.1", "--save", ""}
	if err := s.start(); !errors.Is(err, errPortTaken) {
		t.Errorf("port of another redis-server: start() = %v; want errPortTaken", err)
	}
}

// TestScriptCallsOn checks that only the script calls naming a matching
// key since RecordCommands are counted, EVAL and EVALSHA alike.
func TestScriptCallsOn(t *testing.T) {
	s := Standalone(t)
	const script = "return redis.call('INCR', KEYS[1])"
	if _, err := Do(s.Addr, "EVAL", script, "1", "rld:{before}"); err != nil {
		t.Fatal(err)
	}
	if err := RecordCommands(s.Addr); err != nil {
		t.Fatal(err)
	}
	sha, err := Do(s.Addr, "SCRIPT", "LOAD", script)
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{
		{"EVAL", script, "1", "rld:{a}"},
		{"EVALSHA", sha, "1", "rld:{b}"},
		{"EVALSHA", sha, "1", "rld:daemons"},
		{"INCR", "rld:{c}"},
		{"EVAL", "return 1", "0", "rld:{not a key}"},
	} {
		if _, err := Do(s.Addr, cmd...); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	if n, err := ScriptCallsOn(s.Addr, "rld:{"); err != nil || n != 2 {
		t.Fatalf("ScriptCallsOn(rld:{) = %d, %v; want 2", n, err)
	}
}
