package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"
)

// Defaults of the [admin] and [log] tables, and of server.config_poll.
const (
	// DefaultAdminHTTP is where the admin HTTP API listens once
	// admin.token_file is set.
	DefaultAdminHTTP = "127.0.0.1:9465"
	// DefaultConfigPoll is how often the daemon hashes its configuration
	// file to reload it when it changed.
	DefaultConfigPoll = 2 * time.Second

	DefaultDecisions       = "off"
	DefaultDeniedRate      = 0.01
	DefaultDeniedPerSecond = 100
	DefaultAllowedRate     = 0.0001
)

// DefaultSocketUIDs returns the peer uids that may send admin frames on
// the socket when admin.socket_uids is not set: root only. Each call
// returns a slice of its own.
func DefaultSocketUIDs() []int { return []int{0} }

// Admin is the [admin] table: who may use the admin operations, and where.
type Admin struct {
	// HTTP is the host:port of the admin HTTP API; "" disables it. It
	// listens only when TokenFile is set.
	HTTP string `toml:"http"`
	// TokenFile names a file holding the bearer token every admin HTTP
	// request must carry; a trailing newline is ignored. It is read when
	// the daemon starts.
	TokenFile string `toml:"token_file"`
	// ReadTokenFile names a file holding a second bearer token, of the
	// read role: it may run the ops that change nothing (explain, top,
	// list, config) and no other. The token of TokenFile has the write
	// role: every op. Either file makes the admin HTTP API listen.
	ReadTokenFile string `toml:"read_token_file"`
	// SocketUIDs lists the peer uids allowed to send admin frames on the
	// socket, with the write role (every op); an empty list allows none.
	SocketUIDs []int `toml:"socket_uids"`
	// ReadSocketUIDs lists the peer uids allowed to send admin frames of
	// the read role (the ops that change nothing). A uid in both lists
	// has the write role.
	ReadSocketUIDs []int `toml:"read_socket_uids"`
	// StateFile is where the embedded store keeps the overrides and
	// blocks in force, so that a restart keeps them; "" means the
	// socket's path with ".changes.json" appended. Unused with Redis,
	// where they live in Redis.
	StateFile string `toml:"state_file"`
}

// ChangesFile returns where the embedded store keeps the run-time
// changes: StateFile, or next to socket.
func (a *Admin) ChangesFile(socket string) string {
	if a.StateFile != "" {
		return a.StateFile
	}
	return socket + ".changes.json"
}

// Token returns the content of TokenFile without its trailing newline,
// or "" when TokenFile is not set.
func (a *Admin) Token() (string, error) {
	return readToken("admin.token_file", a.TokenFile)
}

// ReadToken returns the content of ReadTokenFile without its trailing
// newline, or "" when ReadTokenFile is not set.
func (a *Admin) ReadToken() (string, error) {
	return readToken("admin.read_token_file", a.ReadTokenFile)
}

// readToken returns the token in the file path, the setting key.
func readToken(key, path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("cannot read %s=%q: %w", key, path, err)
	}
	t := strings.TrimRight(string(b), "\r\n")
	if t == "" {
		return "", fmt.Errorf("%s=%q: %w", key, path, errEmptyToken)
	}
	return t, nil
}

var errEmptyToken = errors.New("the file is empty: write a token (at least 16 characters) in it")

// MinTokenLen is the shortest admin token accepted.
const MinTokenLen = 16

// AllowsUID reports whether uid may send admin frames on the socket,
// of either role.
func (a *Admin) AllowsUID(uid int) bool {
	return slices.Contains(a.SocketUIDs, uid) || slices.Contains(a.ReadSocketUIDs, uid)
}

// WritesUID reports whether uid has the write role on the socket (it is
// in SocketUIDs).
func (a *Admin) WritesUID(uid int) bool {
	return slices.Contains(a.SocketUIDs, uid)
}

// Log is the [log] table: the decision log.
type Log struct {
	// Decisions is "off", "stderr", or the path of a file that decision
	// lines are appended to.
	Decisions string `toml:"decisions"`
	// DeniedRate is the fraction of denied checks logged, 0 to 1.
	DeniedRate float64 `toml:"denied_rate"`
	// DeniedPerSecond caps the denied checks logged per second.
	DeniedPerSecond int `toml:"denied_per_second"`
	// AllowedRate is the fraction of allowed checks logged, 0 to 1.
	AllowedRate float64 `toml:"allowed_rate"`
}

func (a *Admin) validate(p *problems) {
	if a.HTTP != "" {
		if _, _, err := net.SplitHostPort(a.HTTP); err != nil {
			p.add("admin.http = %q: not host:port (\"\" disables the admin HTTP API): %v", a.HTTP, err)
		}
	}
	write := validToken(p, "admin.token_file", a.TokenFile, a.Token)
	read := validToken(p, "admin.read_token_file", a.ReadTokenFile, a.ReadToken)
	if write != "" && write == read {
		p.add("admin.read_token_file = %q holds the token of admin.token_file: a token has one role; write another", a.ReadTokenFile)
	}
	for i, u := range a.SocketUIDs {
		if u < 0 || u > 1<<32-1 {
			p.add("admin.socket_uids[%d] = %d: not a uid (0 to 4294967295)", i, u)
		}
	}
	for i, u := range a.ReadSocketUIDs {
		if u < 0 || u > 1<<32-1 {
			p.add("admin.read_socket_uids[%d] = %d: not a uid (0 to 4294967295)", i, u)
		}
	}
}

// validToken returns the token of the file path (setting key), read by
// read, or "" after adding a problem when it is not a valid token.
func validToken(p *problems, key, path string, read func() (string, error)) string {
	if path == "" {
		return ""
	}
	t, err := read()
	switch {
	case err != nil:
		p.add("%s = %q: %v", key, path, errors.Unwrap(err))
		return ""
	case len(t) < MinTokenLen:
		p.add("%s = %q: the token has %d characters; at least %d are needed", key, path, len(t), MinTokenLen)
		return ""
	}
	return t
}

func (l *Log) validate(p *problems) {
	if l.Decisions == "" {
		p.add(`log.decisions = "": want "off", "stderr" or a file path`)
	}
	if !(l.DeniedRate >= 0 && l.DeniedRate <= 1) { // NaN too
		p.add("log.denied_rate = %v: must be from 0 to 1", l.DeniedRate)
	}
	if !(l.AllowedRate >= 0 && l.AllowedRate <= 1) {
		p.add("log.allowed_rate = %v: must be from 0 to 1", l.AllowedRate)
	}
	if l.DeniedPerSecond < 0 {
		p.add("log.denied_per_second = %d: must not be negative", l.DeniedPerSecond)
	}
}
