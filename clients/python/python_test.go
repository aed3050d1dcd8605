// Package python holds only the test that runs the Python client's test
// suite (clients/python/tests, unittest) against a real rld, so that
// `make test` runs it.
package python

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/rld/rld/daemon/daemontest"
)

// TestPython runs `python3 -m unittest discover` on clients/python/tests
// with RLD_TEST_SOCKET set to a daemon started on tests/rld-test.toml and
// RLD_TEST_BINARY to the rld binary (for the tests that kill and restart a
// daemon of their own), and fails with Python's output when Python fails.
func TestPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is not installed (make deps installs it): %v", err)
	}
	cfg, err := os.ReadFile(filepath.Join("tests", "rld-test.toml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := daemontest.StartProcess(string(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	bin, err := daemontest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-m", "unittest", "discover", "-s", "tests", "-v")
	cmd.Env = append(os.Environ(),
		"RLD_TEST_SOCKET="+p.Socket,
		"RLD_TEST_BINARY="+bin,
		"RLD_TEST_REQUIRE=1", // a test that cannot find the daemon fails, never skips
		"PYTHONDONTWRITEBYTECODE=1",
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest: %v\n%s\nrld's log:\n%s", err, out, p.Logs())
	}
	t.Logf("%s", out)
}
