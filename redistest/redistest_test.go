package redistest

import "testing"

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
