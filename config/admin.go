package config

import (
	"errors"
	"fmt"
	"net"
	"os"
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

// DefaultSocketUIDs are the peer uids that may send admin frames on the
// socket when admin.socket_uids is not set: root only.
var DefaultSocketUIDs = []int{0}

// Admin is the [admin] table: who may use the admin operations, and where.
type Admin struct {
	// HTTP is the host:port of the admin HTTP API; "" disables it. It
	// listens only when TokenFile is set.
	HTTP string `toml:"http"`
	// TokenFile names a file holding the bearer token every admin HTTP
	// request must carry; a trailing newline is ignored. It is read when
	// the daemon starts.
	TokenFile string `toml:"token_file"`
	// SocketUIDs lists the peer uids allowed to send admin frames on the
	// socket; an empty list allows none.
	SocketUIDs []int `toml:"socket_uids"`
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
	if a.TokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(a.TokenFile)
	if err != nil {
		return "", fmt.Errorf("cannot read admin.token_file=%q: %w", a.TokenFile, err)
	}
	t := strings.TrimRight(string(b), "\r\n")
	if t == "" {
		return "", fmt.Errorf("admin.token_file=%q: %w", a.TokenFile, errEmptyToken)
	}
	return t, nil
}

var errEmptyToken = errors.New("the file is empty: write a token (at least 16 characters) in it")

// MinTokenLen is the shortest admin token accepted.
const MinTokenLen = 16

// AllowsUID reports whether uid may send admin frames on the socket.
func (a *Admin) AllowsUID(uid int) bool {
	for _, u := range a.SocketUIDs {
		if u == uid {
			return true
		}
	}
	return false
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
	if a.TokenFile != "" {
		if t, err := a.Token(); err != nil {
			p.add("admin.token_file = %q: %v", a.TokenFile, errors.Unwrap(err))
		} else if len(t) < MinTokenLen {
			p.add("admin.token_file = %q: the token has %d characters; at least %d are needed", a.TokenFile, len(t), MinTokenLen)
		}
	}
	for i, u := range a.SocketUIDs {
		if u < 0 || u > 1<<32-1 {
			p.add("admin.socket_uids[%d] = %d: not a uid (0 to 4294967295)", i, u)
		}
	}
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
