package buildinfo

import (
	"runtime"
	"testing"
)

func TestGetDefaultsAndStamps(t *testing.T) {
	i := Get()
	if i.Version == "" || i.Commit == "" {
		t.Fatalf("Get() = %+v: want a version and a commit even unstamped", i)
	}
	if i.GoVersion != runtime.Version() {
		t.Errorf("GoVersion = %q, want %q", i.GoVersion, runtime.Version())
	}

	oldV, oldC := Version, Commit
	t.Cleanup(func() { Version, Commit = oldV, oldC })
	Version, Commit = "v1.2.3-4-gabcdef0", "abcdef0123"
	if i := Get(); i.Version != Version || i.Commit != Commit {
		t.Errorf("stamped Get() = %+v, want version %q commit %q", i, Version, Commit)
	}
}
