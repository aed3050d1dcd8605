package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const globalBase = `
[global]
redis = ["127.0.0.1:7000"]
region = "eu"
regions = ["eu", "us", "ap"]

[[rule]]
name = "g"
by = ["api_key"]
limit = 900
period = "1s"
`

func TestGlobalRuleParses(t *testing.T) {
	c, err := Parse([]byte(globalBase+"scope = \"global\"\nfallback_share = 100\n"), "g.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Rules[0].IsGlobal() || c.Rules[0].FallbackShare != 100 || !c.Global.Enabled() {
		t.Fatalf("parsed %+v / %+v", c.Rules[0], c.Global)
	}
	if c.Global.Interval != Duration(DefaultGlobalInterval) || c.Global.Lease != Duration(DefaultGlobalLease) {
		t.Fatalf("defaults: interval %s lease %s", c.Global.Interval, c.Global.Lease)
	}
}

func TestGlobalStrictRuleParses(t *testing.T) {
	c, err := Parse([]byte(globalBase+"scope = \"global\"\nglobal_strict = true\n"), "g.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Rules[0].GlobalStrict || !c.Rules[0].IsGlobal() {
		t.Fatalf("parsed %+v", c.Rules[0])
	}
}

func TestGlobalConfigErrors(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{strings.Replace(globalBase, `redis = ["127.0.0.1:7000"]`, "", 1) + "scope = \"global\"\n", "needs a [global] table"},
		{globalBase + "scope = \"galactic\"\n", `scope = "galactic": want local or global`},
		{globalBase + "scope = \"global\"\nfallback_share = 301\n", "fallback_share = 301"},
		{globalBase + "fallback_share = 10\n", `only for scope = "global"`},
		{globalBase + "scope = \"global\"\nfallback_share = -1\n", "must not be negative"},
		{globalBase + "global_strict = true\n", `rule[0] "g": global_strict = true: only for scope = "global"`},
		{globalBase + "scope = \"local\"\nglobal_strict = true\n", `global_strict = true: only for scope = "global"`},
		{globalBase + "scope = \"global\"\nglobal_strict = true\nfallback_share = 100\n", "fallback_share = 100 must be left out"},
		{strings.Replace(globalBase, `region = "eu"`, `region = "mars"`, 1), `global.region = "mars"`},
		{strings.Replace(globalBase, `"ap"]`, `"eu"]`, 1), "listed twice"},
		{strings.Replace(globalBase, `region = "eu"`, "region = \"eu\"\nlease = \"100ms\"", 1), "global.lease"},
		{strings.Replace(globalBase, `region = "eu"`, "region = \"eu\"\nmode = \"sentinel\"", 1), "global.mode"},
		{strings.Replace(globalBase, "limit = 900\nperiod = \"1s\"", "algorithm = \"concurrency\"\nlimit = 9\ntimeout = \"1s\"", 1) + "scope = \"global\"\n", "concurrency limits cannot be global"},
	} {
		_, err := Parse([]byte(tc.text), "g.toml")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %q: error %v, want one containing %q", tc.text, err, tc.want)
		}
	}
}

// TestGlobalAuthAndTLS: [global]'s password, password file and TLS
// settings are read and checked as [store]'s are: one of password and
// password_file, a CA file that exists and holds a PEM certificate, and
// the TLS keys only with tls = true.
func TestGlobalAuthAndTLS(t *testing.T) {
	dir := t.TempDir()
	pw, notPEM := filepath.Join(dir, "pw"), filepath.Join(dir, "not.pem")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	with := func(lines string) string {
		return strings.Replace(globalBase, `region = "eu"`, "region = \"eu\"\n"+lines, 1)
	}
	c, err := Parse([]byte(with(fmt.Sprintf("username = \"rld\"\npassword_file = %q\ntls = true\ntls_server_name = \"global.example\"", pw))), "g.toml")
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := c.Global.Credentials(); err != nil || got != "s3cret" || c.Global.Username != "rld" {
		t.Fatalf("password %q (%v), username %q", got, err, c.Global.Username)
	}
	if _, tc, err := c.Global.Credentials(); err != nil || tc == nil || tc.ServerName != "global.example" || tc.RootCAs != nil {
		t.Fatalf("TLS config %+v (%v): want the system's roots and the server name", tc, err)
	}
	for _, tc := range []struct{ lines, want string }{
		{fmt.Sprintf("password = \"x\"\npassword_file = %q", pw), "global.password_file = " + strconv.Quote(pw) + ": set either password or password_file, not both"},
		{"password_file = \"/nonexistent/pw\"", `global.password_file = "/nonexistent/pw": open /nonexistent/pw: no such file or directory`},
		{"tls_ca_file = \"/etc/ssl/certs/ca-certificates.crt\"", "tls_ca_file and tls_server_name need tls = true"},
		{"tls = true\ntls_ca_file = \"/nonexistent/ca.pem\"", `cannot read global.tls_ca_file="/nonexistent/ca.pem"`},
		{fmt.Sprintf("tls = true\ntls_ca_file = %q", notPEM), "no PEM certificate in the file"},
	} {
		_, err := Parse([]byte(with(tc.lines)), "g.toml")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config with %q: error %v, want one containing %q", tc.lines, err, tc.want)
		}
	}
}
