package packaging

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// top is the repository's top directory, seen from this package.
const top = ".."

// needRoot skips a test that installs packages and adds users unless it
// runs as root (CI does).
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("packaging tests install a .deb and add a system user: run them as root (CI does)")
	}
}

// built is the package that `make deb` built, once per test process.
var built struct {
	once    sync.Once
	dir     string // holds the binary and the packages
	bin     string // the binary make built
	deb     string // bin/rld_<version>_<arch>.deb as make named it
	version string // its Debian version
	err     error
}

// buildDeb runs `make deb` into a temporary directory once and returns the
// package's path and version.
func buildDeb(t *testing.T) (deb, version string) {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "rld-deb")
		if built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "rld")
		cmd := exec.Command("make", "-s", "-C", top, "deb", "BIN="+built.bin, "DEB_OUT="+built.dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("make deb: %w\n%s", err, out)
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		built.deb = lines[len(lines)-1]
		m := regexp.MustCompile(`/rld_([^_]+)_[a-z0-9]+\.deb$`).FindStringSubmatch(built.deb)
		if m == nil {
			built.err = fmt.Errorf("make deb printed %q, not bin/rld_<version>_<arch>.deb", built.deb)
			return
		}
		built.version = m[1]
	})
	require.NoError(t, built.err)
	return built.deb, built.version
}

// mkdeb packages the binary `make deb` built under another version, for
// the upgrade test (gzip-compressed: xz takes seconds).
func mkdeb(t *testing.T, version string) string {
	t.Helper()
	buildDeb(t)
	cmd := exec.Command(filepath.Join(top, "packaging", "mkdeb.sh"), built.bin, version, built.dir)
	cmd.Env = append(os.Environ(), "DEB_COMPRESS=gzip")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return strings.TrimSpace(string(out))
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// sh runs a command and returns its combined output; it fails the test if
// the command fails.
func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	return string(out)
}

// exitCode runs a command and returns its exit code and combined output.
func exitCode(t *testing.T, name string, args ...string) (int, string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	require.NoError(t, err, "%s %s", name, strings.Join(args, " "))
	return 0, string(out)
}

// leftovers lists what the package, installed, adds to the machine: it
// must be empty before the install and after the purge.
func leftovers(t *testing.T) []string {
	t.Helper()
	var found []string
	for _, p := range []string{"/usr/bin/rld", "/etc/rld", "/run/rld", "/var/lib/rld", "/usr/share/doc/rld",
		"/usr/share/man/man1/rld.1.gz", "/usr/lib/systemd/system/rld.service", "/usr/lib/systemd/system/rld.socket"} {
		if _, err := os.Lstat(p); err == nil {
			found = append(found, p)
		}
	}
	for _, root := range []string{"/etc/systemd/system", "/var/lib/systemd/deb-systemd-helper-enabled", "/var/lib/systemd/deb-systemd-helper-masked"} {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(d.Name(), "rld.") {
				found = append(found, p)
			}
			return nil
		})
	}
	if _, err := user.Lookup("rld"); err == nil {
		found = append(found, "user rld")
	}
	if _, err := user.LookupGroup("rld"); err == nil {
		found = append(found, "group rld")
	}
	if out, _ := exec.Command("dpkg-statoverride", "--list").Output(); bytes.Contains(out, []byte("/etc/rld")) {
		found = append(found, "statoverride /etc/rld")
	}
	return found
}

// runSocket is where the packaged rld, and `make run` as root, serve.
const runSocket = "/run/rld/rld.sock"

// runningDaemon reports whether something answers a connect to the Unix
// socket path: an rld runs there.
func runningDaemon(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// installable skips the test when an rld runs at /run/rld, and fails it
// unless the machine has no rld of its own otherwise: the tests install
// and purge the package and must leave it as they found it. An empty
// /run/rld, which an rld run by hand as root leaves behind, is put back
// after the purge (which removes /run/rld).
// dpkgMu is held by the test that installs the package, from
// installable to its purge.
var dpkgMu sync.Mutex

func installable(t *testing.T) {
	t.Helper()
	// One test at a time installs: dpkg has one database. The others
	// (lintian, the image, Prometheus) run beside it.
	dpkgMu.Lock()
	t.Cleanup(dpkgMu.Unlock)
	if runningDaemon(runSocket) {
		t.Skipf("an rld answers on %s (`make run` as root, or an installed rld): this test installs, "+
			"runs and purges the package, which would take its place and remove /run/rld; stop it to run the packaging tests", runSocket)
	}
	if out, err := exec.Command("dpkg-query", "-W", "-f=${db:Status-Status}", "rld").Output(); err == nil && len(out) > 0 && string(out) != "not-installed" {
		t.Fatalf("the rld package is %s on this machine; the tests would replace it: dpkg -P rld first", out)
	}
	if fi, err := os.Stat("/run/rld"); err == nil {
		entries, _ := os.ReadDir("/run/rld")
		if !fi.IsDir() || len(entries) > 0 {
			names := make([]string, len(entries))
			for i, e := range entries {
				names[i] = e.Name()
			}
			t.Fatalf("/run/rld holds %v: an rld runs, or ran, on this machine (`make run` as root "+
				"keeps its overrides and blocks in rld.sock.changes.json there); the tests would remove them", names)
		}
		st := fi.Sys().(*syscall.Stat_t)
		t.Cleanup(func() {
			if err := os.Mkdir("/run/rld", fi.Mode().Perm()); err == nil {
				_ = os.Chown("/run/rld", int(st.Uid), int(st.Gid))
			}
		})
	}
	var found []string
	for _, f := range leftovers(t) {
		if f != "/run/rld" {
			found = append(found, f)
		}
	}
	require.Empty(t, found, "the machine has rld's files or user already; the tests would change them")
}

// purge removes the package and everything it made; a cleanup for every
// test that installs it.
func purge(t *testing.T) {
	if out, err := exec.Command("dpkg", "-P", "rld").CombinedOutput(); err != nil {
		t.Logf("dpkg -P rld: %v\n%s", err, out)
	}
}

// mode returns a file's permission bits and its owner and group names.
func mode(t *testing.T, path string) string {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	u, err := user.LookupId(strconv.Itoa(int(st.Uid)))
	require.NoError(t, err)
	g, err := user.LookupGroupId(strconv.Itoa(int(st.Gid)))
	require.NoError(t, err)
	return fmt.Sprintf("%04o %s:%s", fi.Mode().Perm(), u.Username, g.Name)
}

// freeAddr returns a loopback address with a port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// TestLintian: lintian finds no error and no warning in the package (the
// overrides in debian/lintian-overrides say why each is not one).
func TestLintian(t *testing.T) {
	t.Parallel()
	needRoot(t)
	deb, _ := buildDeb(t)
	out := sh(t, "lintian", "--fail-on", "error,warning", "--pedantic", deb)
	for _, line := range strings.Split(out, "\n") {
		assert.NotRegexp(t, `^[EW]: `, line)
	}
	t.Logf("lintian:\n%s", out)
}

// TestInstallRunRemovePurge installs the package with dpkg, checks what it
// installed and made, runs the installed binary on the installed config
// as the rld user the way rld.service would and reaches it with rld check
// as a member of the rld group (and not without), drives the
// socket-activated path with systemd-socket-activate, verifies the units
// with systemd-analyze, then removes and purges it and finds the machine
// as it was.
func TestInstallRunRemovePurge(t *testing.T) {
	t.Parallel()
	needRoot(t)
	installable(t) // before building: skip at once when an rld runs here
	deb, version := buildDeb(t)
	t.Cleanup(func() { purge(t) })

	sh(t, "dpkg", "-i", deb)
	assert.Contains(t, sh(t, "dpkg-query", "-W", "-f=${Version} ${db:Status-Status}", "rld"), version+" installed")

	// Files, owners and modes.
	for path, want := range map[string]string{
		"/usr/bin/rld":                           "0755 root:root",
		"/etc/rld/rld.toml":                      "0640 root:rld",
		"/usr/lib/systemd/system/rld.service":    "0644 root:root",
		"/usr/lib/systemd/system/rld.socket":     "0644 root:root",
		"/usr/share/doc/rld/copyright":           "0644 root:root",
		"/usr/share/doc/rld/changelog.gz":        "0644 root:root",
		"/usr/share/doc/rld/changelog.Debian.gz": "0644 root:root",
		"/usr/share/doc/rld/README.md":           "0644 root:root",
		"/usr/share/doc/rld/operations.md":       "0644 root:root",
		"/usr/share/man/man1/rld.1.gz":           "0644 root:root",
	} {
		assert.Equal(t, want, mode(t, path), path)
	}
	assert.Contains(t, sh(t, "dpkg-query", "-W", "-f=${Conffiles}", "rld"), "/etc/rld/rld.toml")
	unit, err := os.ReadFile("/usr/lib/systemd/system/rld.service")
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`file://(\S+)`).FindAllStringSubmatch(string(unit), -1) {
		assert.FileExists(t, m[1], "the unit's Documentation= names a file that exists")
	}
	assert.Contains(t, string(unit), "ExecStart=/usr/bin/rld ")

	// The system user and group.
	u, err := user.Lookup("rld")
	require.NoError(t, err)
	g, err := user.LookupGroup("rld")
	require.NoError(t, err)
	assert.Equal(t, g.Gid, u.Gid, "rld's primary group is rld")
	uid, _ := strconv.Atoi(u.Uid)
	assert.Less(t, uid, 1000, "a system user")
	assert.Contains(t, sh(t, "getent", "passwd", "rld"), ":/usr/sbin/nologin")

	// The binary: stamped, and the config is valid, for root and for rld.
	assert.Contains(t, sh(t, "/usr/bin/rld", "version"), "rld ")
	assert.Contains(t, sh(t, "/usr/bin/rld", "config", "check", "/etc/rld/rld.toml"), "/etc/rld/rld.toml: ok")
	assert.Contains(t, sh(t, "setpriv", "--reuid=rld", "--regid=rld", "--init-groups", "/usr/bin/rld", "config", "check", "/etc/rld/rld.toml"), "ok")
	code, out := exitCode(t, "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/rld", "config", "check", "/etc/rld/rld.toml")
	assert.Equal(t, 2, code, "other users may not read the config: %s", out)
	assert.Contains(t, out, "permission denied")
	out = sh(t, "man", "-P", "cat", "rld")
	assert.Contains(t, out, "config check file", "man rld")

	t.Run("units", func(t *testing.T) { checkUnits(t) })
	t.Run("service", func(t *testing.T) { runAsUnit(t, version) })
	t.Run("socket activation", func(t *testing.T) { runActivated(t) })

	// Remove: the binary goes, the config and the user stay.
	sh(t, "dpkg", "-r", "rld")
	assert.NoFileExists(t, "/usr/bin/rld")
	assert.FileExists(t, "/etc/rld/rld.toml", "remove keeps the conffile")
	_, err = user.Lookup("rld")
	assert.NoError(t, err, "remove keeps the user")

	// Purge: nothing of rld is left, the unit's state directory neither
	// (made here as systemd makes it, if the service did not run).
	if _, err := os.Stat("/var/lib/rld"); err != nil {
		require.NoError(t, os.Mkdir("/var/lib/rld", 0o700))
		require.NoError(t, os.WriteFile("/var/lib/rld/rld.sock.changes.json", []byte("{}"), 0o600))
		sh(t, "chown", "-R", "rld:rld", "/var/lib/rld")
	}
	sh(t, "dpkg", "-P", "rld")
	assert.Empty(t, leftovers(t), "purge leaves the machine as it was")
}

// checkUnits: systemd-analyze verifies the installed units, and rates the
// service's exposure at most 1.0.
func checkUnits(t *testing.T) {
	code, out := exitCode(t, "systemd-analyze", "verify", "/usr/lib/systemd/system/rld.socket", "/usr/lib/systemd/system/rld.service")
	assert.Equal(t, 0, code, "systemd-analyze verify:\n%s", out)
	for _, line := range strings.Split(out, "\n") {
		assert.NotContains(t, line, "rld", "systemd-analyze verify says nothing about rld's units")
	}
	// --threshold is in tenths: 10 is an exposure of 1.0.
	code, out = exitCode(t, "systemd-analyze", "security", "--offline=true", "--threshold=10", "/usr/lib/systemd/system/rld.service")
	assert.Equal(t, 0, code, "exposure at most 1.0:\n%s", out)
	m := regexp.MustCompile(`Overall exposure level for rld.service: ([0-9.]+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	exposure, _ := strconv.ParseFloat(m[1], 64)
	assert.LessOrEqual(t, exposure, 1.0)
	t.Logf("systemd-analyze security: exposure %.1f", exposure)
	unit, err := os.ReadFile("/usr/lib/systemd/system/rld.service")
	require.NoError(t, err)
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "✗ ") {
			continue
		}
		setting := strings.Fields(line)[1]
		key := strings.SplitN(strings.TrimSuffix(setting, "="), "=", 2)[0]
		key = strings.TrimSuffix(strings.Split(key, "/")[0], "=")
		assert.Contains(t, string(unit), "# - "+key, "the unit explains why %s is not set", setting)
	}
}

// asRLD returns the command rld.service runs, as rld.service would run
// it: as the rld user and group, no capabilities, umask 0077.
func asRLD(args ...string) *exec.Cmd {
	return exec.Command("setpriv", append([]string{"--reuid=rld", "--regid=rld", "--init-groups",
		"--no-new-privs", "--inh-caps=-all", "--", "sh", "-c", `umask 0077; exec "$@"`, "sh"}, args...)...)
}

// checkAs runs the installed rld check against socket as user nobody,
// with the rld group as a supplementary group or without.
func checkAs(t *testing.T, socket string, inGroup bool) (int, string) {
	t.Helper()
	groups := "--clear-groups"
	if inGroup {
		groups = "--groups=rld"
	}
	return exitCode(t, "setpriv", "--reuid=nobody", "--regid=nogroup", groups,
		"/usr/bin/rld", "check", "-socket", socket, "api_key=demo", "endpoint=/v1/search")
}

// logBuffer collects a process's output while the test reads it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startLogged starts cmd with its output in a logBuffer, and kills it at
// the end of the test if it still runs.
func startLogged(t *testing.T, cmd *exec.Cmd) (*logBuffer, <-chan error) {
	t.Helper()
	logs := &logBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("%s log:\n%s", cmd.Path, logs.String())
		}
	})
	return logs, exited
}

// runAsUnit runs the installed binary on the installed config as the rld
// user, the way rld.service does in the plain mode, with its
// RuntimeDirectory /run/rld made by hand as systemd would; rld check
// reaches it as a member of the rld group and not without; /healthz names
// the packaged version; SIGTERM stops it with exit 0.
func runAsUnit(t *testing.T, version string) {
	// RuntimeDirectory=rld, RuntimeDirectoryMode=0755, owned by User=/Group=.
	// (An empty /run/rld found before the install is taken over, as
	// systemd would.)
	if err := os.Mkdir("/run/rld", 0o755); err != nil {
		require.ErrorIs(t, err, fs.ErrExist)
		require.NoError(t, os.Chmod("/run/rld", 0o755))
	}
	t.Cleanup(func() { os.RemoveAll("/run/rld") })
	sh(t, "chown", "rld:rld", "/run/rld")

	httpAddr := freeAddr(t) // the config's fixed port may be taken
	cmd := asRLD("/usr/bin/rld", "serve", "-config", "/etc/rld/rld.toml", "-http", httpAddr)
	logs, exited := startLogged(t, cmd)
	const socket = "/run/rld/rld.sock"
	require.Eventually(t, func() bool { c, _ := checkAs(t, socket, true); return c == 0 },
		10*time.Second, 20*time.Millisecond, "rld check as a member of the rld group reaches the daemon")
	code, out := checkAs(t, socket, true)
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, `allowed rule="search"`)
	code, out = checkAs(t, socket, false)
	assert.Equal(t, 2, code, "without the rld group: %s", out)
	assert.Contains(t, out, "permission denied")
	assert.Equal(t, "0660 rld:rld", mode(t, socket))

	resp, err := http.Get("http://" + httpAddr + "/healthz")
	require.NoError(t, err)
	var h struct{ Status, Version, Commit string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&h))
	resp.Body.Close()
	assert.Equal(t, "ok", h.Status)
	assert.NotEqual(t, "dev", h.Version, "make build stamps the version")
	assert.Regexp(t, `^[0-9a-f]{40}$`, h.Commit, "make build stamps the commit")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "rld serving") },
		10*time.Second, 10*time.Millisecond, "rld logs that it serves")
	assert.Contains(t, logs.String(), "socket=/run/rld/rld.sock activated=false")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		assert.NoError(t, err, "exit 0 after SIGTERM")
	case <-time.After(15 * time.Second):
		t.Fatal("rld did not exit after SIGTERM")
	}
	assert.NoFileExists(t, socket, "rld removes the socket it made")
	t.Logf("ran %s as rld; log:\n%s", version, logs.String())
}

// runActivated drives the socket-activated path as rld.socket would:
// systemd-socket-activate listens, hands the socket to the installed rld
// (running as the rld user) on the first connection, and rld answers on it
// and logs the socket it was handed.
func runActivated(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "activated.sock")
	cmd := exec.Command("systemd-socket-activate", "-l", socket,
		"setpriv", "--reuid=rld", "--regid=rld", "--init-groups", "--",
		"/usr/bin/rld", "serve", "-config", "/etc/rld/rld.toml", "-http", "off")
	logs, exited := startLogged(t, cmd)
	require.Eventually(t, func() bool { _, err := os.Stat(socket); return err == nil },
		10*time.Second, 10*time.Millisecond, "systemd-socket-activate listens")
	// The activator listens as root: this connection is root's.
	var out []byte
	require.Eventually(t, func() bool {
		var err error
		out, err = exec.Command("/usr/bin/rld", "check", "-socket", socket, "api_key=demo", "endpoint=/v1/search").CombinedOutput()
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the first connection starts rld, which answers")
	assert.Contains(t, string(out), `allowed rule="search"`)
	// The answer may overtake the log lines on their way through the pipe.
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "activated=true") },
		10*time.Second, 10*time.Millisecond, "rld logs that it serves")
	log := logs.String()
	assert.Contains(t, log, "socket activation: serving the socket systemd passed")
	assert.Contains(t, log, "socket="+socket, "the log names the socket it was handed")
	assert.Contains(t, log, "configured=/run/rld/rld.sock")
	assert.NoFileExists(t, "/run/rld/rld.sock", "rld did not make the configured socket")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		assert.NoError(t, err, "exit 0 after SIGTERM")
	case <-time.After(15 * time.Second):
		t.Fatal("rld did not exit after SIGTERM")
	}
	assert.FileExists(t, socket, "the activator owns the socket file; rld leaves it")
}

// TestUpgradeKeepsConfig installs a version, changes its conffile, then
// installs the next version: dpkg keeps the changed configuration (and its
// owner and mode), and the new version is the one installed.
func TestUpgradeKeepsConfig(t *testing.T) {
	t.Parallel()
	needRoot(t)
	installable(t)
	a := mkdeb(t, "1.0.0~upgradetest1")
	b := mkdeb(t, "1.0.0~upgradetest2")
	t.Cleanup(func() { purge(t) })

	sh(t, "dpkg", "-i", a)
	f, err := os.OpenFile("/etc/rld/rld.toml", os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	const mark = "\n# changed by the operator\n"
	_, err = f.WriteString(mark)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	sh(t, "dpkg", "-i", b)
	assert.Contains(t, sh(t, "dpkg-query", "-W", "-f=${Version} ${db:Status-Status}", "rld"), "1.0.0~upgradetest2 installed")
	conf, err := os.ReadFile("/etc/rld/rld.toml")
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(conf), mark), "the upgrade kept the changed config")
	assert.Equal(t, "0640 root:rld", mode(t, "/etc/rld/rld.toml"))
	assert.NoFileExists(t, "/etc/rld/rld.toml.dpkg-dist")
	assert.Contains(t, sh(t, "/usr/bin/rld", "config", "check", "/etc/rld/rld.toml"), "ok")

	sh(t, "dpkg", "-P", "rld")
	assert.Empty(t, leftovers(t), "purge leaves the machine as it was")
}

// TestRunningDaemonSkips: the check that makes the install tests skip
// finds a daemon by connecting: a listening socket is one, a socket file
// nobody listens on or no file is none.
func TestRunningDaemonSkips(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rld.sock")
	assert.False(t, runningDaemon(path), "no file")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	assert.True(t, runningDaemon(path), "a listener")
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	assert.FileExists(t, path)
	assert.False(t, runningDaemon(path), "a stale socket file")
}
