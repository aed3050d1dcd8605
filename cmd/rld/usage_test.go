package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
)

// commands returns the commands `rld help` lists, as the words that name
// them ("serve", "config check", ...), each with its synopsis line.
func commands(t *testing.T) map[string]string {
	t.Helper()
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"help"}, &out, &errOut), errOut.String())
	cmds := map[string]string{}
	re := regexp.MustCompile(`^  rld (\[serve\]|config check|config import-envoy|[a-z]+)(?: |$)`)
	for _, line := range strings.Split(out.String(), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		name := m[1]
		if name == "[serve]" {
			name = "serve"
		}
		cmds[name] = line
	}
	for _, want := range []string{"serve", "check", "acquire", "release", "settle", "config check", "admin", "version", "help"} {
		require.Contains(t, cmds, want, "rld help lists %s", want)
	}
	return cmds
}

// flagsOf returns the flags that `rld CMD -h` lists.
func flagsOf(t *testing.T, cmd string) []string {
	t.Helper()
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(append(strings.Fields(cmd), "-h"), &out, &errOut), "rld %s -h: %s", cmd, errOut.String())
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  (-[a-z-]+)`).FindAllStringSubmatch(out.String(), -1) {
		flags = append(flags, m[1])
	}
	return flags
}

// TestEveryCommandHelpAndErrors: every command `rld help` lists has its
// help (-h, rld help CMD) on stdout with exit 0, and its synopsis in
// `rld help` names every flag its -h lists; an unknown command, an
// unknown flag or a missing argument is an error on stderr, exit 2, with
// nothing on stdout. Every admin op has its line in `rld admin -h`, and
// `rld admin OP -h` prints it.
func TestEveryCommandHelpAndErrors(t *testing.T) {
	for name, synopsis := range commands(t) {
		args := strings.Fields(name)
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(append(args, "-h"), &out, &errOut), "rld %s -h: %s", name, errOut.String())
		assert.Empty(t, errOut.String(), "rld %s -h", name)
		help := out.String()
		if name != "help" {
			assert.Contains(t, help, "usage: rld", "rld %s -h", name)
			assert.Contains(t, help, name, "rld %s -h", name)
			out.Reset()
			require.Equal(t, 0, run(append([]string{"help"}, args[0]), &out, &errOut), "rld help %s", name)
			assert.Equal(t, help, out.String(), "rld help %s is rld %s -h", name, name)
		}
		for _, f := range flagsOf(t, name) {
			assert.Contains(t, synopsis, f, "rld help: the synopsis of %s names %s", name, f)
		}
		if name == "help" || name == "config check" {
			continue
		}
		out.Reset()
		errOut.Reset()
		assert.Equal(t, exitError, run(append(args, "-no-such-flag", "a=b"), &out, &errOut), "rld %s -no-such-flag", name)
		assert.Contains(t, errOut.String(), "flag provided but not defined: -no-such-flag", "rld %s", name)
		assert.Contains(t, errOut.String(), "usage: rld", "rld %s: a bad flag prints the usage", name)
		assert.Empty(t, out.String(), "rld %s -no-such-flag", name)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"config"}, "usage: rld config check FILE"},
		{[]string{"config", "lint", "rld.toml"}, "usage: rld config check FILE"},
		{[]string{"config", "check"}, "usage: rld config check FILE"},
		{[]string{"config", "check", "/nonexistent/rld.toml"}, "/nonexistent/rld.toml"},
		{[]string{"check", "novalue"}, `descriptor "novalue" is not name=value`},
		{[]string{"check", "-cost", "0", "a=b"}, "-cost must be from 1"},
		{[]string{"acquire", "=b"}, "is not name=value"},
		{[]string{"release"}, "want one LEASE"},
		{[]string{"release", "a", "b"}, "want one LEASE"},
		{[]string{"settle", "lease"}, "want LEASE COST"},
		{[]string{"settle", "lease", "-1"}, "COST must be from 0"},
		{[]string{"admin"}, "usage: rld admin"},
		{[]string{"admin", "explain", "-bogus"}, "explain: flag provided but not defined: -bogus"},
		{[]string{"admin", "override"}, "give set, delete ID or list"},
		{[]string{"admin", "override", "frob"}, "give set, delete ID or list"},
		{[]string{"admin", "block", "ip=1"}, "name the key with -key"},
		{[]string{"admin", "-http", "http://127.0.0.1:1", "-token-file", "/nonexistent/token", "config"}, "cannot read -token-file"},
	} {
		var out, errOut bytes.Buffer
		assert.Equal(t, exitError, run(tc.args, &out, &errOut), "rld %v", tc.args)
		assert.Contains(t, errOut.String(), tc.want, "rld %v", tc.args)
		assert.Empty(t, out.String(), "rld %v", tc.args)
	}

	var adminHelp, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"admin", "-h"}, &adminHelp, &errOut))
	for _, op := range admin.Ops() {
		cli := strings.ReplaceAll(op.Name, "-", " ") // override-set is rld admin override set
		assert.Contains(t, adminHelp.String(), "  "+cli+" ", "rld admin -h lists %s", op.Name)
		var out bytes.Buffer
		args := append([]string{"admin"}, strings.Fields(cli)...)
		assert.Equal(t, 0, run(append(args, "-h"), &out, &errOut), "rld %s -h", strings.Join(args, " "))
		assert.Equal(t, adminHelp.String(), out.String(), "rld %s -h prints the admin usage", strings.Join(args, " "))
	}
}

// TestManPage: packaging/rld.1 renders without a warning (as lintian
// renders it), and names every command `rld help` lists, every flag of
// each, every admin op, and each command's exit status.
func TestManPage(t *testing.T) {
	if _, err := exec.LookPath("man"); err != nil {
		t.Fatalf("man (man-db) is not installed: make deps installs it: %v", err)
	}
	const page = "../../packaging/rld.1"
	lint := exec.Command("man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", page)
	lint.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "MANROFFSEQ=")
	var stderr bytes.Buffer
	lint.Stderr = &stderr
	require.NoError(t, lint.Run(), "%s", stderr.String())
	assert.Empty(t, stderr.String(), "man --warnings finds nothing in rld.1")

	render := exec.Command("man", "-l", page)
	render.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "MANWIDTH=200", "MAN_KEEP_FORMATTING=")
	b, err := render.Output()
	require.NoError(t, err)
	text := string(b)
	section := func(name string) string {
		i := strings.Index(text, "\n"+name+"\n")
		require.GreaterOrEqual(t, i, 0, "rld.1 has a %s section", name)
		rest := text[i+len(name)+2:]
		if j := regexp.MustCompile(`\n[A-Z][A-Z ]+\n`).FindStringIndex(rest); j != nil {
			rest = rest[:j[0]]
		}
		return rest
	}
	synopsis, cmdsText, exits := section("SYNOPSIS"), section("COMMANDS"), section("EXIT STATUS")
	for name := range commands(t) {
		assert.Contains(t, synopsis, "rld "+strings.TrimPrefix(name, "serve"), "SYNOPSIS names rld %s", name)
		assert.Regexp(t, `(?m)^ {7}`+regexp.QuoteMeta(name)+`\b`, cmdsText, "COMMANDS describes %s", name)
		if name != "help" && name != "version" {
			assert.Contains(t, exits, name, "EXIT STATUS gives the codes of %s", name)
		}
		for _, f := range flagsOf(t, name) {
			assert.Contains(t, synopsis, f, "SYNOPSIS of %s names %s", name, f)
			assert.Contains(t, cmdsText, f, "COMMANDS describes %s %s", name, f)
		}
	}
	for _, op := range admin.Ops() {
		cli := strings.ReplaceAll(op.Name, "-", " ")
		assert.Regexp(t, `(?m)^ +`+regexp.QuoteMeta(cli)+`\b`, cmdsText, "COMMANDS describes rld admin %s", cli)
	}
	assert.Contains(t, section("ENVIRONMENT"), "RLD_SOCKET")
	for _, f := range []string{"/etc/rld/rld.toml", "/run/rld/rld.sock", "rld.service", "/usr/share/doc/rld/"} {
		assert.Contains(t, section("FILES"), f)
	}
}

// TestOperationsCommands: the Commands table of docs/operations.md has a
// row for every command `rld help` lists, naming each of its flags.
func TestOperationsCommands(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	doc := string(b)
	start := strings.Index(doc, "\n## Commands\n")
	require.GreaterOrEqual(t, start, 0, "docs/operations.md has a Commands section")
	doc = doc[start+1:]
	doc = doc[:strings.Index(doc[1:], "\n## ")+1]
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `rld (\\[serve\\]|config check|config import-envoy|[a-z]+)[ `](.*)$").FindAllStringSubmatch(doc, -1) {
		rows[strings.Trim(m[1], "[]")] = m[0]
	}
	for name := range commands(t) {
		row, ok := rows[name]
		if !assert.True(t, ok, "docs/operations.md#commands has a row for rld %s", name) {
			continue
		}
		for _, f := range flagsOf(t, name) {
			if f == "-socket" && name != "serve" && name != "admin" {
				continue // said once, above the table
			}
			assert.Contains(t, row, f, "docs/operations.md#commands: rld %s names %s", name, f)
		}
	}
}
