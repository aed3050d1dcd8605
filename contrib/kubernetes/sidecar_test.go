package kubernetes

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rld/rld/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// appDrainEnv, when set, makes the test binary the app of the drain: it
// connects to the socket the variable names and pipelines checks there
// (appDrain).
const appDrainEnv = "RLD_K8S_APP_DRAIN"

// drainChecks is how many checks the app has in flight at SIGTERM.
const drainChecks = 200

func TestMain(m *testing.M) {
	if sock := os.Getenv(appDrainEnv); sock != "" {
		if err := appDrain(sock, strings.Fields(os.Getenv(appDrainEnv+"_DESCS"))); err != nil {
			fmt.Fprintln(os.Stderr, "app:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// appDrain is the app with checks in flight: after one ping (the daemon has
// accepted the connection) it writes drainChecks check frames at once,
// prints "sent", and counts the answers by status until the daemon closes
// the connection: "answered N allowed A limited L".
func appDrain(sock string, descs []string) error {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return fmt.Errorf("dial %s: %w", sock, err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if _, err := c.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpPing, ID: 0})); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if _, err := readResponse(br); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	var batch []byte
	for i := 1; i <= drainChecks; i++ {
		req := wire.Request{Op: wire.OpCheck, ID: uint32(i), Cost: 1}
		for _, d := range descs {
			n, v, _ := strings.Cut(d, "=")
			req.Descs = append(req.Descs, wire.Descriptor{Name: []byte(n), Value: []byte(v)})
		}
		batch = wire.AppendRequest(batch, &req)
	}
	if _, err := c.Write(batch); err != nil {
		return fmt.Errorf("write checks: %w", err)
	}
	fmt.Println("sent")
	counts := map[wire.Status]int{}
	n := 0
	for {
		res, err := readResponse(br)
		if err != nil {
			break // the drain closed the connection
		}
		n++
		counts[res.Status]++
	}
	fmt.Printf("answered %d allowed %d limited %d\n", n, counts[wire.StatusAllowed], counts[wire.StatusLimited])
	return nil
}

// readResponse reads and decodes one response frame.
func readResponse(br *bufio.Reader) (wire.Response, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return wire.Response{}, err
	}
	f := make([]byte, 4+binary.BigEndian.Uint32(hdr[:]))
	copy(f, hdr[:])
	if _, err := io.ReadFull(br, f[4:]); err != nil {
		return wire.Response{}, err
	}
	var res wire.Response
	if err := wire.DecodeResponse(f, &res); err != nil {
		return wire.Response{}, fmt.Errorf("decode response: %w", err)
	}
	return res, nil
}

// top is the repository's top directory, seen from this package.
const top = "../.."

// itoa formats a port or an id.
func itoa(n int32) string { return strconv.Itoa(int(n)) }

// built is the binary `make build` stamped (the one `make image` copies
// into the image), built once per test process.
var built struct {
	once sync.Once
	dir  string
	bin  string // rld
	app  string // this test binary, the app of the drain
	err  error
}

// rldBinary builds rld with the Makefile into a directory every uid may read.
func rldBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "rld-k8s-bin"); built.err != nil {
			return
		}
		if built.err = os.Chmod(built.dir, 0o755); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "rld")
		out, err := exec.Command("make", "-s", "-C", top, "build", "BIN="+built.bin).CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("make build: %w\n%s", err, out)
			return
		}
		built.app = filepath.Join(built.dir, "app")
		built.err = copyExecutable(built.app)
	})
	require.NoError(t, built.err)
	return built.bin
}

// copyExecutable copies the running test binary to path, mode 0755: the
// go tool's build directory is not open to other uids.
func copyExecutable(path string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the test binary: %w", err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		return fmt.Errorf("read the test binary: %w", err)
	}
	if err := os.WriteFile(path, b, 0o755); err != nil {
		return fmt.Errorf("copy the test binary: %w", err)
	}
	return nil
}

// TestConfigMapsValid: the rld.toml of every manifest passes `rld config check`.
func TestConfigMapsValid(t *testing.T) {
	bin := rldBinary(t)
	for _, name := range manifests {
		t.Run(name, func(t *testing.T) {
			text, _ := load(t, name).toml(t)
			f := filepath.Join(t.TempDir(), "rld.toml")
			require.NoError(t, os.WriteFile(f, []byte(text), 0o644))
			out, err := exec.Command(bin, "config", "check", f).CombinedOutput()
			assert.NoError(t, err, "rld config check: %s", out)
		})
	}
}

// pod is the sidecar pod laid out on this machine as the kubelet would:
// each volume a directory, each container's mount paths mapped onto them.
type pod struct {
	root    string
	volumes map[string]string // volume name -> directory
}

// layout creates the pod's volumes under a directory every uid may enter:
// an emptyDir as the kubelet makes it with an fsGroup (group fsGroup,
// rwxrwxrwx with the setgid bit), a configMap as its files (0644).
func layout(t *testing.T, m manifest) pod {
	t.Helper()
	root, err := os.MkdirTemp("", "rld-pod") // t.TempDir's parent is 0700
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	require.NoError(t, os.Chmod(root, 0o755))
	p := pod{root: root, volumes: map[string]string{}}
	for _, v := range m.pod.Volumes {
		dir := filepath.Join(p.root, v.Name)
		require.NoError(t, os.Mkdir(dir, 0o755))
		switch {
		case v.EmptyDir != nil:
			require.NotNil(t, m.pod.SecurityContext.FSGroup)
			require.NoError(t, os.Chown(dir, 0, int(*m.pod.SecurityContext.FSGroup)))
			require.NoError(t, os.Chmod(dir, 0o777|os.ModeSetgid))
		case v.HostPath != nil:
			// DirectoryOrCreate: the kubelet creates it root:root 0755.
			require.NoError(t, os.Chown(dir, 0, 0))
		case v.ConfigMap != nil:
			require.Equal(t, m.config.Name, v.ConfigMap.Name)
			for k, text := range m.config.Data {
				require.NoError(t, os.WriteFile(filepath.Join(dir, k), []byte(text), 0o644))
			}
		default:
			t.Fatalf("volume %s: only emptyDir, hostPath and configMap are laid out", v.Name)
		}
		p.volumes[v.Name] = dir
	}
	return p
}

// mapper rewrites a container's paths onto the pod's volume directories.
func (p pod) mapper(c corev1.Container) *strings.Replacer {
	var pairs []string
	for _, m := range c.VolumeMounts {
		pairs = append(pairs, m.MountPath, p.volumes[m.Name])
	}
	return strings.NewReplacer(pairs...)
}

// creds is the identity a container's process gets in the pod: its uid and
// gid, with the pod's fsGroup and supplemental groups.
func creds(t *testing.T, ps corev1.PodSpec, c corev1.Container) *syscall.Credential {
	t.Helper()
	sc := c.SecurityContext
	require.NotNil(t, sc)
	require.NotNil(t, sc.RunAsUser)
	require.NotNil(t, sc.RunAsGroup)
	cr := &syscall.Credential{Uid: uint32(*sc.RunAsUser), Gid: uint32(*sc.RunAsGroup)}
	if ps.SecurityContext.FSGroup != nil {
		cr.Groups = append(cr.Groups, uint32(*ps.SecurityContext.FSGroup))
	}
	for _, g := range ps.SecurityContext.SupplementalGroups {
		cr.Groups = append(cr.Groups, uint32(g))
	}
	return cr
}

// env is a container's environment as the kubelet sets it (literal values
// and the memory limit of a resourceFieldRef), paths mapped.
func env(t *testing.T, c corev1.Container, paths *strings.Replacer) []string {
	t.Helper()
	var out []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out = append(out, e.Name+"="+paths.Replace(e.Value))
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			out = append(out, e.Name+"="+strconv.FormatInt(c.Resources.Limits.Memory().Value(), 10))
		default:
			t.Fatalf("env %s: source not laid out", e.Name)
		}
	}
	return out
}

// freePort returns a loopback port nobody listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// syncBuffer is an io.Writer safe to read while a process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSidecarContract runs the sidecar pod of sidecar.yaml without a
// container runtime: rld, the binary the image holds, starts with the
// manifest's args and ConfigMap as the manifest's uid; the startup probe's
// endpoint answers; the app, another uid in the pod's fsGroup, checks over
// the shared socket directory and is limited by the ConfigMap's rule; a
// uid outside the group is refused by the socket's mode; and SIGTERM
// drains rld well within the grace period: the app's checks in flight are
// all answered, an idle client does not hold the exit.
func TestSidecarContract(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the contract runs rld and the app as the manifest's uids: run it as root (CI does)")
	}
	bin := rldBinary(t)
	m := load(t, "sidecar.yaml")
	_, conf := m.toml(t)
	r := startPod(t, m, conf)
	p, socket, cmd, exited, logs := r.pod, r.socket, r.cmd, r.exited, r.logs

	// The socket is rld's, in the fsGroup (the emptyDir's setgid bit), 0660.
	fi, err := os.Stat(socket)
	require.NoError(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	assert.Equal(t, uint32(*m.rld.SecurityContext.RunAsUser), st.Uid)
	assert.Equal(t, uint32(*m.pod.SecurityContext.FSGroup), st.Gid)
	assert.Equal(t, conf.Server.SocketMode, fmt.Sprintf("%04o", fi.Mode().Perm()))

	// The app checks as its own uid: allowed up to the rule's limit, then limited.
	app := m.pod.Containers[0]
	appEnv := env(t, app, p.mapper(app))
	rule := conf.Rules[0]
	descs := []string{"endpoint=" + strings.TrimSuffix(rule.Match["endpoint"], "*"), rule.By[0] + "=sk_test"}
	for i := 0; i < rule.Limit; i++ {
		code, out := check(t, bin, appEnv, creds(t, m.pod, app), descs)
		require.Equal(t, 0, code, "check %d of %d: %s", i+1, rule.Limit, out)
	}
	code, out := check(t, bin, appEnv, creds(t, m.pod, app), descs)
	assert.Equal(t, 1, code, "over the limit: %s", out)

	// A uid outside the fsGroup cannot connect.
	code, out = check(t, bin, appEnv, &syscall.Credential{Uid: 3000, Gid: 3000}, descs)
	assert.Equal(t, 2, code)
	assert.Contains(t, out, "permission denied")

	// SIGTERM while the app has checks in flight on a new key and another
	// client sits idle: every check is answered (the rule's limit allowed,
	// the rest limited), and rld exits 0 well within the grace period,
	// removing its socket.
	idle, err := net.Dial("unix", socket)
	require.NoError(t, err)
	defer idle.Close()
	drainDescs := []string{descs[0], rule.By[0] + "=sk_drain"}
	helper := exec.Command(built.app)
	helper.Env = append(appEnv, appDrainEnv+"="+socket, appDrainEnv+"_DESCS="+strings.Join(drainDescs, " "))
	helper.Dir = "/"
	helper.SysProcAttr = &syscall.SysProcAttr{Credential: creds(t, m.pod, app)}
	var helperErr syncBuffer
	helper.Stderr = &helperErr
	helperOut, err := helper.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, helper.Start())
	lines := bufio.NewScanner(helperOut)
	require.True(t, lines.Scan(), "the app ran: %s", helperErr.String())
	require.Equal(t, "sent", lines.Text())

	grace := time.Duration(*m.pod.TerminationGracePeriodSeconds) * time.Second
	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "rld exits 0 after a drain")
	case <-time.After(grace):
		t.Fatalf("rld still runs %v after SIGTERM: the kubelet would SIGKILL it", grace)
	}
	took := time.Since(start)
	require.True(t, lines.Scan(), "the app reports: %s", helperErr.String())
	require.NoError(t, helper.Wait(), helperErr.String())
	assert.Equal(t, fmt.Sprintf("answered %d allowed %d limited %d", drainChecks, rule.Limit, drainChecks-rule.Limit), lines.Text(),
		"every check in flight at SIGTERM is answered")
	drain, err := time.ParseDuration(conf.Server.DrainTimeout)
	require.NoError(t, err)
	t.Logf("SIGTERM to exit: %v (drain_timeout %v, grace period %v)", took, drain, grace)
	assert.Less(t, took, grace)
	assert.Contains(t, logs.String(), `"msg":"draining"`)
	assert.Contains(t, logs.String(), `"msg":"stopped"`)
	_, err = os.Stat(socket)
	assert.True(t, errors.Is(err, os.ErrNotExist), "the socket is removed: %v", err)
}

// running is a pod laid out with rld started in it as the manifest says.
type running struct {
	pod    pod
	socket string // the socket's path on this machine
	cmd    *exec.Cmd
	exited <-chan error // Wait's result
	logs   *syncBuffer
}

// startPod lays the manifest's pod out, runs its init containers other
// than rld (as root, paths mapped), starts rld with the manifest's args,
// environment and identity, and waits for its startup probe to pass,
// which must report the stamped version.
func startPod(t *testing.T, m manifest, conf rldConfig) running {
	t.Helper()
	bin := rldBinary(t)
	pd := layout(t, m)
	for _, c := range m.pod.InitContainers {
		if c.Name == m.rld.Name {
			continue
		}
		paths := pd.mapper(c)
		argv := append(append([]string{}, c.Command...), c.Args...)
		for i := range argv {
			argv[i] = paths.Replace(argv[i])
		}
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		require.NoError(t, err, "init container %s: %s", c.Name, out)
	}
	rldPaths := pd.mapper(m.rld)
	port := freePort(t)

	// The kubelet probes the pod's IP on the container port; here rld's
	// 0.0.0.0:9464 becomes a free loopback port.
	cfgFile := filepath.Join(pd.volumes["rld-config"], "rld.toml")
	text, err := os.ReadFile(cfgFile)
	require.NoError(t, err)
	mapped := rldPaths.Replace(strings.Replace(string(text), `"`+conf.Server.HTTP+`"`, `"127.0.0.1:`+port+`"`, 1))
	require.NotEqual(t, string(text), mapped)
	require.NoError(t, os.WriteFile(cfgFile, []byte(mapped), 0o644))
	socket := rldPaths.Replace(conf.Server.Socket)

	args := make([]string, len(m.rld.Args))
	for i, a := range m.rld.Args {
		args[i] = rldPaths.Replace(a)
	}
	logs := &syncBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Env = env(t, m.rld, rldPaths)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: creds(t, m.pod, m.rld)}
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		t.Logf("rld's log:\n%s", logs.String())
	})

	// The startup probe passes within its budget, and says which build runs.
	sp := m.rld.StartupProbe
	health := probe(t, "http://127.0.0.1:"+port+sp.HTTPGet.Path,
		time.Duration(sp.PeriodSeconds*sp.FailureThreshold)*time.Second, exited)
	assert.Equal(t, "ok", health["status"])
	version, err := exec.Command(filepath.Join(top, "scripts", "version.sh"), "version").Output()
	require.NoError(t, err)
	assert.Equal(t, strings.TrimSpace(string(version)), health["version"])

	return running{pod: pd, socket: socket, cmd: cmd, exited: exited, logs: logs}
}

// probe polls url as the kubelet's startup probe would until it answers 200,
// and returns the JSON body; it fails when rld exits or the budget is spent.
func probe(t *testing.T, url string, budget time.Duration, exited <-chan error) map[string]any {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(budget)
	for {
		select {
		case err := <-exited:
			t.Fatalf("rld exited before its startup probe passed: %v", err)
		default:
		}
		resp, err := client.Get(url)
		if err == nil {
			var body map[string]any
			derr := json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				require.NoError(t, derr)
				return body
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the startup probe %s did not pass within %v: %v", url, budget, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// check runs `rld check` as the identity and returns its exit status and output.
func check(t *testing.T, bin string, env []string, cr *syscall.Credential, descs []string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"check"}, descs...)...)
	cmd.Env = env
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cr}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), string(out)
	}
	require.NoError(t, err, "rld check: %s", out)
	return 0, string(out)
}

// TestDaemonSetContract runs the pod of daemonset.yaml the same way: the
// kubelet's hostPath (root:root 0755), the init container's command making
// it rld's, rld started as the manifest says; a client pod's process (a
// uid with rld's group among its supplementalGroups, as docs/operations.md
// shows) checks over the directory, one without the group is refused, and
// SIGTERM stops rld with exit 0 within the grace period.
func TestDaemonSetContract(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the contract runs rld and its clients as the manifest's uids: run it as root (CI does)")
	}
	bin := rldBinary(t)
	m := load(t, "daemonset.yaml")
	_, conf := m.toml(t)
	r := startPod(t, m, conf)
	sc := m.rld.SecurityContext
	uid, gid := uint32(*sc.RunAsUser), uint32(*sc.RunAsGroup)

	for path, mode := range map[string]string{r.pod.volumes["rld-socket"]: "0750", r.socket: conf.Server.SocketMode} {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		assert.Equal(t, [2]uint32{uid, gid}, [2]uint32{st.Uid, st.Gid}, path)
		assert.Equal(t, mode, fmt.Sprintf("%04o", fi.Mode().Perm()), path)
	}

	env := []string{"RLD_SOCKET=" + r.socket}
	descs := []string{"endpoint=/v1/search", "api_key=sk_node"}
	code, out := check(t, bin, env, &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{gid}}, descs)
	assert.Equal(t, 0, code, "a client with supplementalGroups [%d]: %s", gid, out)
	code, out = check(t, bin, env, &syscall.Credential{Uid: 1000, Gid: 1000}, descs)
	assert.Equal(t, 2, code)
	assert.Contains(t, out, "permission denied", "a client without the group")

	grace := time.Duration(*m.pod.TerminationGracePeriodSeconds) * time.Second
	require.NoError(t, r.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-r.exited:
		require.NoError(t, err, "rld exits 0 after a drain")
	case <-time.After(grace):
		t.Fatalf("rld still runs %v after SIGTERM: the kubelet would SIGKILL it", grace)
	}
	_, err := os.Stat(r.socket)
	assert.True(t, errors.Is(err, os.ErrNotExist), "the socket is removed: %v", err)
}
