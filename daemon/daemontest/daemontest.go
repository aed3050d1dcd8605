// Package daemontest starts an rld daemon inside a test process, on a
// socket in a temporary directory, the way net/http/httptest starts an HTTP
// server.
package daemontest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/rld/rld/daemon"
)

// Server is a running in-process daemon.
type Server struct {
	// Daemon is the server's daemon.
	Daemon *daemon.Daemon
	// Dir is the temporary directory holding the config and the socket.
	Dir string
	// ConfigPath is the configuration file the daemon loaded.
	ConfigPath string
	// Socket is the daemon's Unix socket path.
	Socket string
	// HTTP is the HTTP check endpoint's address, host:port.
	HTTP string
	// AdminHTTP is the admin HTTP API's address, host:port, or "" when it
	// does not listen (it needs admin.token_file).
	AdminHTTP string

	opts   daemon.Options
	cancel context.CancelFunc
	done   chan error
}

// Start writes config (rld.toml text) to a new temporary directory and
// starts a daemon on it, overriding the socket with one in that directory
// and HTTP (and the admin HTTP API, which listens only when the config
// names a token file) with free loopback ports. Logs are discarded unless
// RLD_TEST_LOG is set.
func Start(config string) (*Server, error) {
	dir, err := os.MkdirTemp("", "rld")
	if err != nil {
		return nil, fmt.Errorf("daemontest: %w", err)
	}
	s := &Server{Dir: dir, ConfigPath: filepath.Join(dir, "rld.toml"), Socket: filepath.Join(dir, "rld.sock")}
	if err := os.WriteFile(s.ConfigPath, []byte(config), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("daemontest: %w", err)
	}
	var logOut io.Writer = io.Discard
	if os.Getenv("RLD_TEST_LOG") != "" {
		logOut = os.Stderr
	}
	httpAddr, adminAddr := "127.0.0.1:0", "127.0.0.1:0"
	opts := daemon.Options{
		ConfigPath: s.ConfigPath,
		Socket:     s.Socket,
		HTTP:       &httpAddr,
		AdminHTTP:  &adminAddr,
		Logger:     slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	s.opts = opts
	if err := s.run(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// run starts a daemon with s.opts and waits until it is ready.
func (s *Server) run() error {
	d, err := daemon.New(s.opts)
	if err != nil {
		return err
	}
	s.Daemon = d
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.done = make(chan error, 1)
	go func() { s.done <- d.Run(ctx) }()
	select {
	case <-d.Ready():
	case err := <-s.done:
		cancel()
		return fmt.Errorf("daemontest: daemon did not start: %w", err)
	case <-time.After(10 * time.Second):
		cancel()
		return fmt.Errorf("daemontest: daemon not ready after 10s")
	}
	s.HTTP = d.HTTPAddr()
	s.AdminHTTP = d.AdminHTTPAddr()
	return nil
}

// Restart stops the daemon and starts a new one on the same socket and
// configuration, as a process restart would.
func (s *Server) Restart() error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.run()
}

// Stop drains the daemon as SIGTERM would and returns Run's result.
func (s *Server) Stop() error {
	s.cancel()
	err := <-s.done
	s.done <- err // Stop may be called again
	return err
}

// Close stops the daemon and removes its directory.
func (s *Server) Close() {
	_ = s.Stop()
	os.RemoveAll(s.Dir)
}
