// Package nginxtest runs a real nginx (with the Lua module when it is
// installed) in the foreground on a loopback port and a temporary prefix,
// for the tests of rld's web clients.
package nginxtest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Modules are the dynamic modules of Debian's libnginx-mod-http-lua.
var Modules = []string{
	"/usr/lib/nginx/modules/ndk_http_module.so",
	"/usr/lib/nginx/modules/ngx_http_lua_module.so",
}

// Nginx is a running nginx.
type Nginx struct {
	// Dir is the prefix: the config, logs and temp files.
	Dir string
	// Addr is the host:port it listens on.
	Addr string
	// URL is "http://" + Addr.
	URL string

	cmd    *exec.Cmd
	out    bytes.Buffer
	mu     sync.Mutex
	exited chan struct{}
}

// RepoDir returns the repository's root directory.
func RepoDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("nginxtest: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Start runs nginx with http (the body of the http {} block, where PORT
// stands for the listening port and TMP for the prefix) and the Lua
// module loaded when lua is true, waits until it accepts connections, and
// kills it when the test ends.
func Start(t testing.TB, lua bool, http string) *Nginx {
	t.Helper()
	if _, err := exec.LookPath("nginx"); err != nil {
		t.Fatalf("nginxtest: nginx is not installed (make deps installs it): %v", err)
	}
	dir, err := os.MkdirTemp("", "ngx")
	if err != nil {
		t.Fatalf("nginxtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		n, err := start(dir, lua, http, FreePort(t))
		if err == nil {
			t.Cleanup(n.Stop)
			return n
		}
		lastErr = err // most likely the port was taken in between: retry
	}
	t.Fatalf("nginxtest: %v", lastErr)
	return nil
}

func start(dir string, lua bool, http string, port int) (*Nginx, error) {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var conf strings.Builder
	if lua {
		for _, m := range Modules {
			fmt.Fprintf(&conf, "load_module %s;\n", m)
		}
	}
	fmt.Fprintf(&conf, "daemon off;\nmaster_process off;\nerror_log %s/error.log warn;\npid %s/nginx.pid;\n", dir, dir)
	fmt.Fprintf(&conf, "events { worker_connections 1024; }\nhttp {\n  access_log off;\n")
	for _, p := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		fmt.Fprintf(&conf, "  %s_temp_path %s/%s;\n", p, dir, p)
	}
	if lua {
		fmt.Fprintf(&conf, "  lua_package_path \"%s/clients/openresty/?.lua;;\";\n", RepoDir())
	}
	conf.WriteString(strings.NewReplacer("PORT", strconv.Itoa(port), "TMP", dir).Replace(http))
	conf.WriteString("\n}\n")
	cfg := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfg, []byte(conf.String()), 0o644); err != nil {
		return nil, err
	}
	_ = os.Remove(filepath.Join(dir, "error.log"))
	n := &Nginx{Dir: dir, Addr: addr, URL: "http://" + addr, exited: make(chan struct{})}
	n.cmd = exec.Command("nginx", "-p", dir, "-c", cfg)
	n.cmd.Stdout = &lockedWriter{n}
	n.cmd.Stderr = &lockedWriter{n}
	if err := n.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	go func() { _ = n.cmd.Wait(); close(n.exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return n, nil
		}
		select {
		case <-n.exited:
			return nil, fmt.Errorf("nginx exited before listening:\n%s\n%s", n.Output(), conf.String())
		default:
		}
		if time.Now().After(deadline) {
			n.Stop()
			return nil, fmt.Errorf("nginx not listening on %s after 10s:\n%s", addr, n.Output())
		}
		time.Sleep(10 * time.Millisecond) // polling readiness
	}
}

type lockedWriter struct{ n *Nginx }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.n.mu.Lock()
	defer w.n.mu.Unlock()
	return w.n.out.Write(b)
}

// Output returns nginx's stderr and its error log.
func (n *Nginx) Output() string {
	n.mu.Lock()
	out := n.out.String()
	n.mu.Unlock()
	log, _ := os.ReadFile(filepath.Join(n.Dir, "error.log"))
	return out + string(log)
}

// ErrorLog returns nginx's error log.
func (n *Nginx) ErrorLog() string {
	log, _ := os.ReadFile(filepath.Join(n.Dir, "error.log"))
	return string(log)
}

// Stop kills nginx and waits for it.
func (n *Nginx) Stop() {
	select {
	case <-n.exited:
		return
	default:
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.exited
}
