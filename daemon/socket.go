package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/rld/rld/config"
)

// ErrSocketInUse is returned when another process already serves the socket.
var ErrSocketInUse = errors.New("socket is in use by a running process")

// listenUnix creates the socket at path with the given mode. It creates the
// parent directory, removes a stale socket file only after a connect to it
// fails, and narrows the umask while binding so the socket is never wider
// than mode, not even for an instant.
func listenUnix(path string, mode fs.FileMode) (*net.UnixListener, error) {
	if len(path) > config.MaxSocketPath {
		return nil, fmt.Errorf("socket %q: %d bytes, longer than the kernel allows for a Unix socket path (%d)", path, len(path), config.MaxSocketPath)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("cannot create socket directory %q: %w", filepath.Dir(path), err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	old := syscall.Umask(int(0o777 &^ mode.Perm()))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on socket %q: %w", path, err)
	}
	if err := os.Chmod(path, mode.Perm()); err != nil {
		ln.Close()
		return nil, fmt.Errorf("cannot set mode %#o on socket %q: %w", mode.Perm(), path, err)
	}
	ln.SetUnlinkOnClose(true)
	return ln, nil
}

// removeStale removes the file at path if it is a socket nobody answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot stat socket %q: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("socket path %q exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("socket %q: %w", path, ErrSocketInUse)
	}
	// Only a refused connect proves nobody listens: a full accept queue
	// (EAGAIN) or a socket we may not open (EACCES) may hide a live daemon.
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("socket %q exists and cannot be tested (%v); remove it if no rld is running: %w", path, err, ErrSocketInUse)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cannot remove stale socket %q: %w", path, err)
	}
	return nil
}

// sdNotify sends state to systemd's notification socket when rld runs
// under a Type=notify unit; it does nothing otherwise.
func sdNotify(state string) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("cannot reach NOTIFY_SOCKET: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("cannot notify systemd: %w", err)
	}
	return nil
}

// watchdogInterval returns how often to send WATCHDOG=1: half of
// WATCHDOG_USEC, which systemd sets for a unit with WatchdogSec=, when
// WATCHDOG_PID is unset or this process; 0 when there is no watchdog.
func watchdogInterval() time.Duration {
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}

// activatedListener returns the Unix socket systemd passed to this process
// (socket activation: LISTEN_PID is us and LISTEN_FDS is 1), or nil when
// rld was started without one.
func activatedListener() (*net.UnixListener, error) {
	if os.Getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) || os.Getenv("LISTEN_FDS") == "" {
		return nil, nil
	}
	n, err := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	if err != nil || n != 1 {
		return nil, fmt.Errorf("socket activation: want LISTEN_FDS=1, got %q", os.Getenv("LISTEN_FDS"))
	}
	os.Unsetenv("LISTEN_PID")
	os.Unsetenv("LISTEN_FDS")
	os.Unsetenv("LISTEN_FDNAMES")
	const firstFD = 3
	f := os.NewFile(firstFD, "systemd-socket")
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil, fmt.Errorf("socket activation: fd %d is not a Unix stream socket", firstFD)
	}
	ul.SetUnlinkOnClose(false) // systemd owns the socket file
	return ul, nil
}
