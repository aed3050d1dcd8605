package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
)

func TestShippedFile(t *testing.T) {
	c, err := Load("../rld.toml")
	require.NoError(t, err)
	assert.Equal(t, "/run/rld/rld.sock", c.Server.Socket)
	assert.Equal(t, "127.0.0.1:9464", c.Server.HTTP)
	assert.Equal(t, []string{"api_key=sk_internal_*"}, c.Allow)
	assert.Equal(t, []string{"api_key=sk_revoked_*"}, c.Deny)

	byName := map[string]*Rule{}
	for i := range c.Rules {
		byName[c.Rules[i].Name] = &c.Rules[i]
	}
	login := byName["login"]
	require.NotNil(t, login)
	assert.Equal(t, algo.SlidingLog, login.Kind())
	assert.Equal(t, ModeStrict, login.Mode, "sliding_log defaults to strict")
	assert.Equal(t, int64(5), login.Limit)
	assert.Equal(t, map[string]string{"endpoint": "/v1/login"}, login.Match)

	search := byName["search"]
	require.NotNil(t, search)
	assert.Equal(t, algo.Params{Kind: algo.TokenBucket, Limit: 30, Period: time.Minute}, search.Params(search.Limit))
	assert.Equal(t, ModeCached, search.Mode)
	assert.Equal(t, FailOpen, search.Fail)
	require.NotNil(t, byName["users"])
	assert.Equal(t, int64(100), byName["users"].Limit)

	tier := byName["per-tier"]
	require.NotNil(t, tier)
	assert.Equal(t, map[string]int64{"free": 100, "pro": 1000, "enterprise": 10000}, tier.Tiers)
	assert.Equal(t, int64(100), tier.DefaultLimit())
	require.NotNil(t, byName["per-tenant"])
	assert.Equal(t, []string{"tenant"}, byName["per-tenant"].By)
}

func TestDefaults(t *testing.T) {
	c, err := Parse([]byte(`
[[rule]]
name = "r"
by = ["ip"]
limit = 10
period = "1s"
`), "x.toml")
	require.NoError(t, err)
	want := Default()
	want.Rules = []Rule{{
		Name: "r", By: []string{"ip"}, Algorithm: "token_bucket", Limit: 10,
		Period: Duration(time.Second), Mode: ModeCached, Fail: FailOpen,
	}}
	assert.Equal(t, want, c)
	assert.Equal(t, os.FileMode(0o660), c.Server.SocketFileMode())
	assert.Equal(t, 30*time.Second, time.Duration(c.Server.ReadTimeout))
}

func TestRedisStore(t *testing.T) {
	c, err := Parse([]byte(`
[store]
redis = ["10.0.0.1:26379", "10.0.0.2:26379", "[::1]:26379"]
mode = "sentinel"
master_set = "mymaster"
username = "rld"
password = "secret"
key_prefix = "limits:"
timeout = "20ms"
breaker_failure_rate = 80
breaker_min_calls = 100
breaker_failures = 3
breaker_window = "500ms"
breaker_cooldown = "100ms"
`), "x.toml")
	require.NoError(t, err)
	assert.Equal(t, 80, c.Store.BreakerFailureRate)
	assert.Equal(t, 100, c.Store.BreakerMinCalls)
	assert.Equal(t, 3, c.Store.BreakerFailures)
	assert.Equal(t, 500*time.Millisecond, time.Duration(c.Store.BreakerWindow))
	assert.Equal(t, 100*time.Millisecond, time.Duration(c.Store.BreakerCooldown))
	assert.True(t, c.Store.UsesRedis())
	assert.Equal(t, RedisSentinel, c.Store.Mode)
	assert.Equal(t, "mymaster", c.Store.MasterSet)
	assert.Equal(t, "limits:", c.Store.KeyPrefix)
	assert.Equal(t, 20*time.Millisecond, time.Duration(c.Store.Timeout))
	pw, _, err := c.Store.Credentials()
	require.NoError(t, err)
	assert.Equal(t, "secret", pw)

	d := Default()
	assert.False(t, d.Store.UsesRedis(), "no redis: the embedded store")
	assert.Equal(t, RedisStandalone, d.Store.Mode)
	assert.Equal(t, "rld:", d.Store.KeyPrefix)
	// The settings the engines read are left to them: zero, which the
	// file may not give explicitly (see TestInvalid's "store", "redis" and "breaker" cases).
	assert.Zero(t, d.Store.Timeout)
	assert.Zero(t, d.Store.SyncInterval)
	assert.Zero(t, d.Store.MaxKeys)
	assert.Zero(t, d.Store.SweepInterval)
	assert.Zero(t, d.Store.BreakerFailureRate)
	assert.Zero(t, d.Store.BreakerMinCalls)
	assert.Zero(t, d.Store.BreakerFailures)
	assert.Zero(t, d.Store.BreakerWindow)
	assert.Zero(t, d.Store.BreakerCooldown)

	pwFile := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pwFile, []byte("from-file\n"), 0o600))
	c, err = Parse([]byte("[store]\nredis = [\"127.0.0.1:6379\"]\nmode = \"cluster\"\npassword_file = \""+pwFile+"\"\n"), "x.toml")
	require.NoError(t, err)
	pw, _, err = c.Store.Credentials()
	require.NoError(t, err)
	assert.Equal(t, "from-file", pw, "trailing newline dropped")
}

func TestExplicitEmptyHTTPDisables(t *testing.T) {
	c, err := Parse([]byte("[server]\nhttp = \"\"\nsocket_mode = \"0600\"\nlog_level = \"debug\"\n"), "x.toml")
	require.NoError(t, err)
	assert.Equal(t, "", c.Server.HTTP)
	assert.Equal(t, os.FileMode(0o600), c.Server.SocketFileMode())
	assert.Equal(t, "DEBUG", c.Server.SlogLevel().String())
}

// TestInvalid checks that each bad field is reported with its path and
// value, and that all problems of one file come out together.
func TestInvalid(t *testing.T) {
	const rule = "[[rule]]\nname = \"r\"\nby = [\"ip\"]\nlimit = 10\nperiod = \"1m\"\n"
	tests := []struct {
		name string
		toml string
		want []string // substrings of the error, each expected
	}{
		{"unknown algorithm", "[[rule]]\nname = \"login\"\nby = [\"ip\"]\nlimit = 5\nperiod = \"1m\"\nalgorithm = \"leaky\"\n",
			[]string{`x.toml: rule[0] "login": algorithm = "leaky": unknown algorithm "leaky"`}},
		{"cached sliding log", "[[rule]]\nname = \"log\"\nby = [\"ip\"]\nlimit = 10\nperiod = \"1m\"\nalgorithm = \"sliding_log\"\nmode = \"cached\"\n",
			[]string{`rule[0] "log": mode = "cached": sliding_log is always strict (a lease would let its log forget admissions early)`}},
		{"cached concurrency", "[[rule]]\nname = \"cc\"\nby = [\"ip\"]\nlimit = 2\ntimeout = \"30s\"\nalgorithm = \"concurrency\"\nmode = \"cached\"\n",
			[]string{`rule[0] "cc": mode = "cached": concurrency is always strict`}},
		{"concurrency with a period", "[[rule]]\nname = \"cc\"\nby = [\"ip\"]\nlimit = 2\nperiod = \"1m\"\nalgorithm = \"concurrency\"\n",
			[]string{`rule[0] "cc": period = "1m": a concurrency rule has no period`}},
		// A bad algorithm hides nothing the algorithm does not decide.
		{"unknown algorithm and a tier named *", "[[rule]]\nname = \"r\"\nby = [\"ip\"]\ntiers = { \"*\" = 5 }\nperiod = \"1m\"\nalgorithm = \"leaky\"\n",
			[]string{`rule[0] "r": algorithm = "leaky"`, `rule[0] "r": tiers."*": a tier is chosen by an exact tier descriptor`}},
		{"unknown algorithm and more", "[[rule]]\nname = \"r\"\nby = [\"ip\"]\nlimit = -1\nperiod = \"-1s\"\nalgorithm = \"leaky\"\nmode = \"foo\"\nfail = \"bar\"\n",
			[]string{`rule[0] "r": algorithm = "leaky"`, `rule[0] "r": limit = -1: must be positive`, `rule[0] "r": period = "-1s": must not be negative`,
				`rule[0] "r": mode = "foo": want cached or strict`, `rule[0] "r": fail = "bar": want open or closed`}},
		{"concurrency with a period and no timeout", "[[rule]]\nname = \"cc\"\nby = [\"ip\"]\nlimit = 2\nperiod = \"1s\"\nalgorithm = \"concurrency\"\n",
			[]string{`rule[0] "cc": period = "1s": a concurrency rule has no period`, `rule[0] "cc": timeout = "0s": a concurrency rule needs a positive timeout`}},
		{"timeout and no period", "[[rule]]\nname = \"r\"\nby = [\"ip\"]\nlimit = 0\ntimeout = \"5s\"\n",
			[]string{`rule[0] "r": timeout = "5s": only a concurrency rule`, `rule[0] "r": period = "0s": must be positive`, `rule[0] "r": limit = 0: must be positive`}},
		{"concurrency without a timeout", "[[rule]]\nname = \"cc\"\nby = [\"ip\"]\nlimit = 2\nalgorithm = \"concurrency\"\n",
			[]string{`rule[0] "cc": timeout = "0s": a concurrency rule needs a positive timeout`}},
		{"timeout on a rate rule", rule + "timeout = \"5s\"\n",
			[]string{`rule[0] "r": timeout = "5s": only a concurrency rule takes a timeout, not token_bucket`}},
		{"sliding log too large", "[[rule]]\nname = \"log\"\nby = [\"ip\"]\nlimit = 1000000\nperiod = \"1h\"\nalgorithm = \"sliding_log\"\n",
			[]string{`rule[0] "log": limit = 1000000: sliding_log keeps one entry per admission, so its limit is at most 10000`}},
		{"index and name", rule + rule + strings.Replace(rule, `"r"`, `"login"`, 1) + "algorithm = \"leaky\"\n",
			[]string{`rule[1] "r": name = "r": already used by rule[0]`, `rule[2] "login": algorithm = "leaky"`}},
		{"empty name", "[[rule]]\nby = [\"ip\"]\nlimit = 1\nperiod = \"1s\"\n",
			[]string{`rule[0]: name = "": must not be empty`}},
		{"bad name", strings.Replace(rule, `"r"`, `"a b"`, 1), []string{`rule[0] "a b": name = "a b": character ' ' not allowed`}},
		{"long name", strings.Replace(rule, `"r"`, `"`+strings.Repeat("n", 256)+`"`, 1), []string{`longer than 255 bytes`}},
		{"reserved name", strings.Replace(rule, `"r"`, `"deny"`, 1), []string{`name = "deny": reserved`}},
		{"no by", strings.Replace(rule, `by = ["ip"]`, `by = []`, 1), []string{`rule[0] "r": by = []`}},
		{"missing by", strings.Replace(rule, "by = [\"ip\"]\n", "", 1), []string{`rule[0] "r": by = []`}},
		{"long by", strings.Replace(rule, `"ip"`, `"`+strings.Repeat("d", 65)+`"`, 1), []string{`by[0] = "ddd`, `longer than 64 bytes`}},
		{"dup by", strings.Replace(rule, `"ip"`, `"ip", "ip"`, 1), []string{`by[1] = "ip": listed twice`}},
		{"zero limit", strings.Replace(rule, "limit = 10", "limit = 0", 1), []string{`rule[0] "r": limit = 0: must be positive (or give tiers)`}},
		{"negative limit with tiers", strings.Replace(rule, "limit = 10", "limit = -1\ntiers = { a = 1 }", 1), []string{`limit = -1: must not be negative`}},
		{"bad tier", strings.Replace(rule, "limit = 10", "tiers = { free = 0, pro = -2 }", 1),
			[]string{`rule[0] "r": tiers.free = 0: must be positive`, `tiers.pro = -2: must be positive`}},
		{"period", strings.Replace(rule, `"1m"`, `"0s"`, 1), []string{`rule[0] "r": period = "0s": must be positive`}},
		{"period too small", strings.Replace(rule, `"1m"`, `"1us"`, 1), []string{`period = "1µs": period must be at least 1ms`}},
		{"too large", strings.Replace(rule, "limit = 10", "limit = 9000000000000000", 1), []string{`limit = 9000000000000000, period = "1m": limit×period too large`}},
		{"burst for window", rule + "algorithm = \"fixed_window\"\nburst = 3\n", []string{`burst = 3: only token_bucket and gcra take a burst, not fixed_window`}},
		{"burst with tiers", strings.Replace(rule, "limit = 10", "tiers = { a = 1 }\nburst = 5", 1), []string{`burst = 5: cannot be combined with tiers`}},
		{"negative burst", rule + "burst = -1\n", []string{`rule[0] "r": burst = -1: must not be negative`}},
		// A bad period hides nothing else of the rule.
		{"every problem of a rule", strings.Replace(rule, "limit = 10\nperiod = \"1m\"", "limit = 0\nperiod = \"0s\"\nburst = -1", 1),
			[]string{`rule[0] "r": period = "0s": must be positive`, `rule[0] "r": burst = -1: must not be negative`, `rule[0] "r": limit = 0: must be positive`}},
		{"tier named *", strings.Replace(rule, "limit = 10", "tiers = { \"*\" = 50, free = 10 }", 1),
			[]string{`rule[0] "r": tiers."*": a tier is chosen by an exact tier descriptor`}},
		{"socket path too long", "[server]\nsocket = \"/run/" + strings.Repeat("s", 103) + "\"\n",
			[]string{`server.socket = "/run/sss`, `108 bytes, longer than the kernel allows for a Unix socket path (107)`}},
		{"mode", rule + "mode = \"lazy\"\n", []string{`mode = "lazy": want cached or strict`}},
		{"fail", rule + "fail = \"maybe\"\n", []string{`fail = "maybe": want open or closed`}},
		{"match glob", rule + "match = { endpoint = \"\" }\n", []string{`rule[0] "r": match.endpoint = "": empty glob`}},
		{"match regexp", rule + "match = { endpoint = \"~/v1/orders/([0-9]+\", method = \"~\", path = \"~a)|(b\" }\n",
			[]string{`x.toml: rule[0] "r": match.endpoint = "~/v1/orders/([0-9]+": regular expression: error parsing regexp: missing closing ): ` + "`/v1/orders/([0-9]+`",
				`x.toml: rule[0] "r": match.method = "~": empty regular expression after "~"`,
				`x.toml: rule[0] "r": match.path = "~a)|(b": regular expression: error parsing regexp: unexpected )`}},
		{"selector regexp", "allow = [\"api_key=~sk_[\"]\ndeny = [\"ip=~10\\\\.0\\\\.0\\\\.(1|2\"]\n",
			[]string{`allow[0] = "api_key=~sk_[": selector "api_key=~sk_[": regular expression: error parsing regexp: missing closing ]`,
				`deny[0] = "ip=~10\\.0\\.0\\.(1|2": selector "ip=~10\\.0\\.0\\.(1|2": regular expression: error parsing regexp: missing closing )`}},
		{"enforce", rule + "enforce = \"25\"\n" + strings.Replace(rule, `"r"`, `"s"`, 1) + "enforce = \"100.5%\"\n" +
			strings.Replace(rule, `"r"`, `"t"`, 1) + "enforce = \"12.345%\"\n" + strings.Replace(rule, `"r"`, `"u"`, 1) + "enforce = \"-1%\"\n" +
			strings.Replace(rule, `"r"`, `"v"`, 1) + "enforce = \"25%\"\nshadow = true\n" + strings.Replace(rule, `"r"`, `"w"`, 1) + "enforce = \" 5%\"\n",
			[]string{`x.toml: rule[0] "r": enforce = "25": want a percentage such as "25%" or "12.5%"`,
				`x.toml: rule[1] "s": enforce = "100.5%": more than 100%`,
				`x.toml: rule[2] "t": enforce = "12.345%": at most two decimals`,
				`x.toml: rule[3] "u": enforce = "-1%": want a percentage`,
				`x.toml: rule[4] "v": enforce = "25%": a shadow rule enforces no key; set shadow = false to roll it out`,
				`x.toml: rule[5] "w": enforce = " 5%": want a percentage`}},
		{"selectors", "allow = [\"api_key\"]\ndeny = [\"=x\", \"ip=\"]\n",
			[]string{`allow[0] = "api_key": selector "api_key" must have the form name=glob`,
				`deny[0] = "=x": selector "=x": empty descriptor name`, `deny[1] = "ip=": selector "ip=": empty glob`}},
		{"server", "[server]\nsocket = \"\"\nsocket_mode = \"0999\"\nhttp = \"nope\"\nmax_connections = 0\nmax_inflight = -1\nread_timeout = \"0s\"\nidle_timeout = \"-1s\"\ndrain_timeout = \"-2s\"\nlog_level = \"loud\"\nlog_format = \"xml\"\n",
			[]string{`server.socket = "": must not be empty`, `server.socket_mode = "0999": not an octal mode`,
				`server.http = "nope": not host:port`, `server.max_connections = 0: must be positive`,
				`server.max_inflight = -1: must be positive`, `server.read_timeout = "0s": must be positive`,
				`server.idle_timeout = "-1s": must not be negative`, `server.drain_timeout = "-2s": must not be negative`,
				`server.log_level = "loud"`, `server.log_format = "xml"`}},
		{"socket mode too wide", "[server]\nsocket_mode = \"01777\"\n", []string{`server.socket_mode = "01777": above 0777`}},
		{"store", "[store]\nmax_keys = 0\nsweep_interval = \"0s\"\n", []string{`store.max_keys = 0: must be positive`, `store.sweep_interval = "0s": want 100ms to 1h`}},
		{"sweep too often", "[store]\nsweep_interval = \"1ns\"\n", []string{`store.sweep_interval = "1ns": want 100ms to 1h`}},
		{"redis", "[store]\nredis = [\"nohost\", \"h:0\", \"h:99999\"]\nmode = \"ring\"\nmaster_set = \"m\"\npassword = \"p\"\npassword_file = \"/nonexistent/pw\"\nkey_prefix = \"rld:{x}\"\ntimeout = \"0s\"\n",
			[]string{`store.redis[0] = "nohost": not host:port`, `store.redis[1] = "h:0": port "0" is not 1 to 65535`,
				`store.redis[2] = "h:99999": port "99999"`, `store.mode = "ring": want standalone, sentinel or cluster`,
				`store.master_set = "m": only for mode = "sentinel", not "ring"`,
				`store.password_file = "/nonexistent/pw": set either password or password_file, not both`,
				`store.password_file = "/nonexistent/pw": open /nonexistent/pw: no such file or directory`,
				`store.key_prefix = "rld:{x}": must not contain { or }`, `store.timeout = "0s": must be positive`}},
		{"redis standalone takes one address", "[store]\nredis = [\"a:1\", \"b:2\"]\n",
			[]string{`store.redis has 2 addresses: standalone mode takes one`}},
		{"sentinel needs master_set", "[store]\nredis = [\"a:1\"]\nmode = \"sentinel\"\n",
			[]string{`store.master_set = "": required with mode = "sentinel"`}},
		{"breaker", "[store]\nbreaker_failure_rate = 101\nbreaker_min_calls = 0\nbreaker_failures = 0\nbreaker_window = \"0s\"\nbreaker_cooldown = \"2m\"\n",
			[]string{`store.breaker_failure_rate = 101: want a percentage, 1 to 100`, `store.breaker_min_calls = 0: want 1 to 1000000`,
				`store.breaker_failures = 0: want 1 to 10000`, `store.breaker_window = "0s": want 1ms to 1m`,
				`store.breaker_cooldown = "2m": want 1ms to 1m`}},
		{"long key prefix", "[store]\nkey_prefix = \"" + strings.Repeat("p", 65) + "\"\n", []string{`longer than 64 bytes`}},
		{"unknown key", "[server]\nsocket = \"/tmp/s\"\nsokcet_mode = \"0600\"\n", []string{`x.toml:3: unknown key "server.sokcet_mode"`}},
		{"unknown rule key", rule + "limt = 3\n", []string{`x.toml:6: unknown key "rule.limt"`}},
		{"unknown table", "[servr]\nsocket = \"x\"\n", []string{`x.toml:1: unknown key "servr"`}},
		// Every place of a repeated unknown key, each at its own line; a key
		// named like another table's known one is found in its own table.
		// The decoder drops a match or tiers that is not a table: a rule
		// without its match would count every request.
		{"match and tiers not tables", rule + "match = \"path=/login\"\ntiers = [1]\n",
			[]string{`x.toml: rule[0] "r": match = "path=/login": want a table`, `x.toml: rule[0] "r": tiers = [1]: want a table`}},
		{"unknown key in two rules", rule + "colour = \"red\"\n" + rule + "colour = \"blue\"\n[server]\nlimit = 5\n",
			[]string{`x.toml:6: unknown key "rule.colour"`, `x.toml:12: unknown key "rule.colour"`, `x.toml:14: unknown key "server.limit"`}},
		{"unknown key in an inline table", strings.Replace(rule, "limit = 10", "limit = 10\npenalty = { after = 3, factor = 2.0, max = \"1m\", extra = 1 }", 1),
			[]string{`x.toml: unknown key "rule.penalty.extra"`}},
		{"unknown key and invalid value", "[server]\nmax_connections = 0\ncolour = 1\n",
			[]string{`x.toml:3: unknown key "server.colour"`, `server.max_connections = 0`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.toml), "x.toml")
			require.Error(t, err)
			assert.Nil(t, c)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			// Every line names the file.
			for _, line := range strings.Split(err.Error(), "\n") {
				assert.True(t, strings.HasPrefix(line, "x.toml"), "line %q", line)
			}
		})
	}
}

// TestSocketPathAtTheKernelLimit: 107 bytes and a NUL fill sun_path.
func TestSocketPathAtTheKernelLimit(t *testing.T) {
	path := "/tmp/" + strings.Repeat("s", MaxSocketPath-len("/tmp/"))
	c, err := Parse([]byte("[server]\nsocket = \""+path+"\"\n"), "x.toml")
	require.NoError(t, err)
	assert.Equal(t, path, c.Server.Socket)
}

func TestUnknownTableReportedOnce(t *testing.T) {
	_, err := Parse([]byte("[servr]\nsocket = \"x\"\nhttp = \"\"\n"), "x.toml")
	require.Error(t, err)
	assert.Equal(t, `x.toml:1: unknown key "servr"`, err.Error())
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		toml string
		want string
	}{
		{"syntax", "[server]\nsocket = \"/x\"\nhttp = \n", "x.toml:3: "},
		{"duplicate key", "[server]\nsocket = \"a\"\nsocket = \"b\"\n", "x.toml:3: "},
		{"bad duration", "[[rule]]\nname = \"r\"\nperiod = \"1 minute\"\n", `x.toml:3: rule.period: time: unknown unit " minute"`},
		{"duration without unit", "[server]\n\nread_timeout = 30\n", `x.toml:3: server.read_timeout: time: missing unit`},
		{"type", "[[rule]]\nname = \"r\"\nlimit = \"ten\"\n", `x.toml:3: rule.limit: want an integer, not a string`},
		{"mode as integer", "[server]\nsocket_mode = 0o660\n", `x.toml:2: server.socket_mode: want a string, not an integer`},
		{"by as a string", "[[rule]]\nname = \"r\"\nby = \"ip\"\n", `x.toml:3: rule.by: want an array, not a string`},
		{"socket as an array", "[server]\nsocket = [1]\n", `x.toml:2: server.socket: want a string, not an array`},
		{"penalty as a number", "[[rule]]\nname = \"r\"\npenalty = 3\n", `x.toml:3: rule.penalty: want a table, not an integer`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.toml), "x.toml")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.toml")
	require.NoError(t, os.WriteFile(path, []byte("[server]\nmax_inflight = 0\n"), 0o600))
	_, err := Load(path)
	require.Error(t, err)
	assert.Equal(t, path+": server.max_inflight = 0: must be positive", err.Error())

	_, err = Load(filepath.Join(dir, "missing.toml"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestSummary(t *testing.T) {
	c, err := Parse([]byte(`
[[rule]]
name = "search"
match = { endpoint = "/v1/search*", method = "GET" }
by = ["api_key", "endpoint"]
limit = 30
period = "1m"
burst = 45

[[rule]]
name = "per-tier"
by = ["api_key"]
tiers = { free = 100, pro = 1000, enterprise = 10000 }
period = "1h"
shadow = true

[[rule]]
name = "login"
algorithm = "sliding_log"
by = ["ip"]
limit = 5
period = "90s"
tiers = { gold = 50 }
fail = "closed"

[[rule]]
name = "exports"
algorithm = "concurrency"
by = ["api_key"]
limit = 2
timeout = "30s"
`), "x.toml")
	require.NoError(t, err)
	want := []string{
		"search: token_bucket 30/1m burst 45 by api_key,endpoint match endpoint=/v1/search*,method=GET cached fail=open",
		"per-tier: token_bucket tier{free=100,pro=1000,enterprise=10000,default=100}/1h by api_key cached fail=open shadow",
		"login: sliding_log tier{gold=50,default=5}/1m30s by ip strict fail=closed",
		"exports: concurrency 2 in flight, timeout 30s by api_key strict fail=open",
	}
	for i, w := range want {
		assert.Equal(t, w, c.Rules[i].Summary())
	}

	// A tier called "default" is told from the default.
	c, err = Parse([]byte(`
[[rule]]
name = "named"
by = ["api_key"]
limit = 5
period = "1m"
tiers = { default = 50 }
`), "x.toml")
	require.NoError(t, err)
	assert.Equal(t, `named: token_bucket tier{"default"=50,default=5}/1m by api_key cached fail=open`, c.Rules[0].Summary())
}

func TestDurationString(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Minute: "1m", time.Hour: "1h", 90 * time.Minute: "1h30m", 30 * time.Second: "30s",
		0: "0s", 1500 * time.Millisecond: "1.5s", time.Hour + time.Second: "1h0m1s",
	} {
		assert.Equal(t, want, Duration(d).String())
	}
}

// TestParseShare: the enforce shares rld accepts, in basis points, and
// their canonical form.
func TestParseShare(t *testing.T) {
	for in, want := range map[string]int{"": 10000, "100%": 10000, "0%": 0, "25%": 2500, "12.5%": 1250, "0.01%": 1, "99.99%": 9999, "007%": 700, "50.0%": 5000} {
		bp, err := ParseShare(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, bp, in)
	}
	for bp, want := range map[int]string{10000: "100%", 0: "0%", 2500: "25%", 1250: "12.5%", 1: "0.01%", 10: "0.1%", 9999: "99.99%"} {
		assert.Equal(t, want, FormatShare(bp))
	}
	for _, bad := range []string{"25", "%", "1e1%", "+5%", "5 %", "25.%", ".5%", "1000%", "101%", "100.01%", "0x10%", "½%"} {
		_, err := ParseShare(bad)
		assert.Error(t, err, bad)
	}
}

// TestRegexpGlobsAccepted: valid regular expressions in match and in the
// allow and deny lists load, and the summary shows them as written.
func TestRegexpGlobsAccepted(t *testing.T) {
	c, err := Parse([]byte(`
allow = ["api_key=~sk_internal_[0-9a-f]{8}"]
deny = ["ip=~10\\.66\\..*"]
[[rule]]
name = "orders"
match = { endpoint = "~/v1/orders/[0-9]+" }
by = ["api_key"]
limit = 5
period = "1m"
enforce = "12.5%"
`), "x.toml")
	require.NoError(t, err)
	assert.Equal(t, "orders: token_bucket 5/1m by api_key match endpoint=~/v1/orders/[0-9]+ cached fail=open enforce=12.5%", c.Rules[0].Summary())
	assert.Equal(t, 1250, c.Rules[0].EnforceShare())
}

// TestStoreTLS: store.tls builds a TLS configuration with the CA file's
// certificates and the server name; the CA file must hold a PEM
// certificate, and tls_ca_file and tls_server_name need tls = true.
func TestStoreTLS(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600))
	const base = "[store]\nredis = [\"127.0.0.1:6380\"]\n"
	c, err := Parse([]byte(base+"tls = true\ntls_server_name = \"redis.internal\"\n"), "x.toml")
	require.NoError(t, err)
	_, tc, err := c.Store.Credentials()
	require.NoError(t, err)
	require.NotNil(t, tc)
	assert.Equal(t, "redis.internal", tc.ServerName)
	assert.Nil(t, tc.RootCAs, "the system's roots")
	c, err = Parse([]byte(base), "x.toml")
	require.NoError(t, err)
	_, tc, err = c.Store.Credentials()
	assert.NoError(t, err)
	assert.Nil(t, tc, "no TLS without tls = true")
	for _, tt := range []struct{ lines, want string }{
		{"tls_server_name = \"x\"\n", "store.tls = false: tls_ca_file and tls_server_name need tls = true"},
		{"tls = true\ntls_ca_file = \"/nonexistent/ca.pem\"\n", `cannot read store.tls_ca_file="/nonexistent/ca.pem"`},
		{"tls = true\ntls_ca_file = \"" + notPEM + "\"\n", "no PEM certificate in the file"},
	} {
		_, err := Parse([]byte(base+tt.lines), "x.toml")
		if assert.Error(t, err, tt.lines) {
			assert.Contains(t, err.Error(), tt.want)
		}
	}
}
