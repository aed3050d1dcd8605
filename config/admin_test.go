package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAdminAndLogDefaults(t *testing.T) {
	c, err := Parse([]byte(""), "t.toml")
	require.NoError(t, err)
	assert.Equal(t, Admin{HTTP: "127.0.0.1:9465", SocketUIDs: []int{0}}, c.Admin)
	assert.Equal(t, Log{Decisions: "off", DeniedRate: 0.01, DeniedPerSecond: 100, AllowedRate: 0.0001}, c.Log)
	assert.Equal(t, 2*time.Second, time.Duration(c.Server.ConfigPoll))
	assert.True(t, c.Admin.AllowsUID(0))
	assert.False(t, c.Admin.AllowsUID(1000))
	tok, err := c.Admin.Token()
	assert.NoError(t, err)
	assert.Empty(t, tok)
	// Two parses do not share the default uid list.
	c.Admin.SocketUIDs[0] = 7
	c2, _ := Parse([]byte(""), "t.toml")
	assert.Equal(t, []int{0}, c2.Admin.SocketUIDs)
}

func TestAdminAndLogInvalid(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	require.NoError(t, os.WriteFile(short, []byte("abc\n"), 0o600))
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	good := filepath.Join(dir, "good")
	require.NoError(t, os.WriteFile(good, []byte("0123456789abcdef\n"), 0o600))
	tests := []struct{ text, want string }{
		{"[admin]\nhttp = \"nope\"", `admin.http = "nope": not host:port`},
		{"[admin]\ntoken_file = \"" + filepath.Join(dir, "missing") + "\"", "no such file"},
		{"[admin]\ntoken_file = \"" + short + "\"", "the token has 3 characters; at least 16"},
		{"[admin]\ntoken_file = \"" + empty + "\"", "the file is empty"},
		{"[admin]\nsocket_uids = [-1]", "admin.socket_uids[0] = -1: not a uid"},
		{"[admin]\nread_socket_uids = [4294967296]", "admin.read_socket_uids[0] = 4294967296: not a uid"},
		{"[admin]\nread_token_file = \"" + short + "\"", "admin.read_token_file = \"" + short + "\": the token has 3 characters"},
		{"[admin]\nread_token_file = \"" + empty + "\"", "the file is empty"},
		{"[admin]\ntoken_file = \"" + good + "\"\nread_token_file = \"" + good + "\"", "holds the token of admin.token_file: a token has one role"},
		{"[log]\ndecisions = \"\"", `log.decisions = "": want "off", "stderr" or a file path`},
		{"[log]\ndenied_rate = 1.5", "log.denied_rate = 1.5: must be from 0 to 1"},
		{"[log]\nallowed_rate = -0.1", "log.allowed_rate = -0.1"},
		{"[log]\ndenied_rate = nan", "log.denied_rate = NaN: must be from 0 to 1"},
		{"[log]\nallowed_rate = nan", "log.allowed_rate = NaN: must be from 0 to 1"},
		{"[log]\ndenied_per_second = -1", "log.denied_per_second = -1"},
		{"[server]\nconfig_poll = \"-1s\"", `server.config_poll = "-1s": want 10ms to 1h, or 0 to turn polling off`},
		{"[server]\nconfig_poll = \"1ns\"", `server.config_poll = "1ns": want 10ms to 1h`},
		{"[admin]\nsocket = 1", "admin.socket"},
	}
	for _, tt := range tests {
		_, err := Parse([]byte(tt.text), "t.toml")
		if assert.Error(t, err, tt.text) {
			assert.Contains(t, err.Error(), tt.want, tt.text)
		}
	}
	c, err := Parse([]byte("[admin]\ntoken_file = \""+good+"\"\nsocket_uids = [0, 1000]\n[log]\ndecisions = \"stderr\"\n[server]\nconfig_poll = \"0\""), "t.toml")
	require.NoError(t, err)
	tok, err := c.Admin.Token()
	require.NoError(t, err)
	assert.Equal(t, "0123456789abcdef", tok)
	assert.True(t, c.Admin.AllowsUID(1000))
	assert.Zero(t, c.Server.ConfigPoll)
	assert.False(t, strings.Contains(tok, "\n"))
}

// TestAdminRoles: a token file per role, and a uid list per role; a uid
// in both lists writes.
func TestAdminRoles(t *testing.T) {
	dir := t.TempDir()
	w, r := filepath.Join(dir, "w"), filepath.Join(dir, "r")
	require.NoError(t, os.WriteFile(w, []byte("write-token-0123456789\n"), 0o600))
	require.NoError(t, os.WriteFile(r, []byte("read-token-0123456789\n"), 0o600))
	c, err := Parse([]byte("[admin]\ntoken_file = \""+w+"\"\nread_token_file = \""+r+"\"\nsocket_uids = [0, 7]\nread_socket_uids = [1000, 7]\n"), "t.toml")
	require.NoError(t, err)
	tok, err := c.Admin.ReadToken()
	require.NoError(t, err)
	assert.Equal(t, "read-token-0123456789", tok)
	for uid, want := range map[int][2]bool{0: {true, true}, 7: {true, true}, 1000: {true, false}, 1001: {false, false}} {
		assert.Equal(t, want[0], c.Admin.AllowsUID(uid), "uid %d allowed", uid)
		assert.Equal(t, want[1], c.Admin.WritesUID(uid), "uid %d writes", uid)
	}
}
