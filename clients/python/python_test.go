// Package python holds only the test that runs the Python client's test
// suite (clients/python/tests, unittest) against a real rld, so that
// `make test` runs it.
package python

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rld/rld/daemon/daemontest"
)

// TestPython runs `python3 -m unittest discover` on clients/python/tests
// with RLD_TEST_SOCKET set to a daemon started on tests/rld-test.toml and
// RLD_TEST_BINARY to the rld binary (for the tests that kill and restart a
// daemon of their own), and fails with Python's output when Python fails.
// The middleware tests start real servers (wsgiref, and Debian's gunicorn
// and uvicorn under /usr/bin/python3) through tests/serve.py.
func TestPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is not installed (make deps installs it): %v", err)
	}
	cfg, err := testConfig()
	if err != nil {
		t.Fatal(err)
	}
	p, err := daemontest.StartProcess(cfg)
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

// testConfig returns tests/rld-test.toml with @TESTS@ replaced by the
// tests folder's absolute path.
func testConfig() (string, error) {
	b, err := os.ReadFile(filepath.Join("tests", "rld-test.toml"))
	if err != nil {
		return "", fmt.Errorf("reading the test config: %w", err)
	}
	dir, err := filepath.Abs("tests")
	if err != nil {
		return "", fmt.Errorf("locating tests: %w", err)
	}
	return strings.ReplaceAll(string(b), "@TESTS@", dir), nil
}

// TestPipInstall installs clients/python with pip, offline, into a new
// virtual environment of Debian's python3 (whose setuptools and wheel
// build it), and imports the installed module from outside the tree.
func TestPipInstall(t *testing.T) {
	const py = "/usr/bin/python3" // Debian's, with python3-setuptools and python3-wheel (make deps)
	venv := filepath.Join(t.TempDir(), "venv")
	run := func(dir string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	// pip writes build/ and *.egg-info beside pyproject.toml: build a copy.
	src := filepath.Join(t.TempDir(), "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"pyproject.toml", "README.md", "rld.py"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(".", py, "-m", "venv", "--system-site-packages", venv)
	run(".", filepath.Join(venv, "bin", "pip"), "install", "--no-build-isolation", src)
	got := run(venv, filepath.Join(venv, "bin", "python"), "-c", "import rld; print(rld.__file__)")
	if want := filepath.Join(venv, "lib"); !strings.HasPrefix(got, want) {
		t.Fatalf("rld imported from %q, want the venv's site-packages under %s", got, want)
	}
}
