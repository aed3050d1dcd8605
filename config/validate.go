package config

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/rld/rld/algo"
)

// problems collects what validate finds, one line each.
type problems []string

func (p *problems) add(format string, args ...any) {
	*p = append(*p, fmt.Sprintf(format, args...))
}

// validate returns every problem of c, each naming the field path and the
// bad value, in file order. set reports whether the file gives a key
// (toml.MetaData.IsDefined): a setting that an engine reads is left zero
// when unset, and checked only when given.
func (c *Config) validate(set func(key ...string) bool) []string {
	var p problems
	for i, s := range c.Allow {
		if _, err := ParseSelector(s); err != nil {
			p.add("allow[%d] = %q: %v", i, s, err)
		}
	}
	for i, s := range c.Deny {
		if _, err := ParseSelector(s); err != nil {
			p.add("deny[%d] = %q: %v", i, s, err)
		}
	}
	c.Server.validate(&p)
	c.Store.validate(&p, func(key string) bool { return set("store", key) })
	c.Admin.validate(&p)
	c.Log.validate(&p)
	c.Envoy.validate(&p)
	c.Global.validate(&p)
	seen := make(map[string]int, len(c.Rules))
	for i := range c.Rules {
		r := &c.Rules[i]
		r.validate(&p, i)
		r.validateScope(&p, fmt.Sprintf("rule[%d] %q", i, r.Name), &c.Global)
		if r.Name == "" {
			continue
		}
		if j, dup := seen[r.Name]; dup {
			p.add("rule[%d] %q: name = %q: already used by rule[%d]", i, r.Name, r.Name, j)
		} else {
			seen[r.Name] = i
		}
	}
	return p
}

func (e *Envoy) validate(p *problems) {
	if e.Listen != "" {
		if _, _, err := net.SplitHostPort(e.Listen); err != nil {
			p.add("envoy.listen = %q: not host:port (\"\" disables it): %v", e.Listen, err)
		}
	}
	if len(e.Socket) > MaxSocketPath {
		p.add("envoy.socket = %q: %d bytes, longer than the kernel allows for a Unix socket path (%d)", e.Socket, len(e.Socket), MaxSocketPath)
	}
}

func (s *Server) validate(p *problems) {
	if s.Socket == "" {
		p.add(`server.socket = "": must not be empty`)
	} else if len(s.Socket) > MaxSocketPath {
		p.add("server.socket = %q: %d bytes, longer than the kernel allows for a Unix socket path (%d)", s.Socket, len(s.Socket), MaxSocketPath)
	}
	if m, err := strconv.ParseUint(s.SocketMode, 8, 32); err != nil || s.SocketMode == "" {
		p.add("server.socket_mode = %q: not an octal mode such as \"0660\"", s.SocketMode)
	} else if m > 0o777 {
		p.add("server.socket_mode = %q: above 0777", s.SocketMode)
	}
	if s.HTTP != "" {
		if _, _, err := net.SplitHostPort(s.HTTP); err != nil {
			p.add("server.http = %q: not host:port (\"\" disables HTTP): %v", s.HTTP, err)
		}
	}
	s.validateHTTP(p)
	if s.MaxConnections <= 0 {
		p.add("server.max_connections = %d: must be positive", s.MaxConnections)
	}
	if s.MaxInflight <= 0 {
		p.add("server.max_inflight = %d: must be positive", s.MaxInflight)
	}
	if s.ReadTimeout <= 0 {
		p.add("server.read_timeout = %q: must be positive", s.ReadTimeout)
	}
	if s.IdleTimeout < 0 {
		p.add("server.idle_timeout = %q: must not be negative (0 disables it)", s.IdleTimeout)
	}
	if s.DrainTimeout < 0 {
		p.add("server.drain_timeout = %q: must not be negative", s.DrainTimeout)
	}
	if s.ConfigPoll != 0 && (s.ConfigPoll < Duration(10*time.Millisecond) || s.ConfigPoll > Duration(time.Hour)) {
		p.add("server.config_poll = %q: want 10ms to 1h, or 0 to turn polling off", s.ConfigPoll)
	}
	switch s.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		p.add("server.log_level = %q: want debug, info, warn or error", s.LogLevel)
	}
	switch s.LogFormat {
	case "text", "json":
	default:
		p.add("server.log_format = %q: want text or json", s.LogFormat)
	}
}

// validate checks s; set reports whether the file gives a key of the
// [store] table. The keys an engine reads (max_keys, sweep_interval,
// timeout, sync_interval, breaker_*) are checked when given: unset, they
// are zero, and the engine fills in its default.
func (s *Store) validate(p *problems, set func(key string) bool) {
	s.validateEngines(p, set)
	for i, addr := range s.Redis {
		if _, port, err := net.SplitHostPort(addr); err != nil {
			p.add("store.redis[%d] = %q: not host:port: %v", i, addr, err)
		} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			p.add("store.redis[%d] = %q: port %q is not 1 to 65535", i, addr, port)
		}
	}
	switch s.Mode {
	case RedisStandalone:
		if len(s.Redis) > 1 {
			p.add("store.redis has %d addresses: standalone mode takes one (use mode = \"cluster\" or \"sentinel\" for several)", len(s.Redis))
		}
	case RedisSentinel:
		if s.MasterSet == "" {
			p.add(`store.master_set = "": required with mode = "sentinel"`)
		}
	case RedisCluster:
	default:
		p.add("store.mode = %q: want standalone, sentinel or cluster", s.Mode)
	}
	if s.MasterSet != "" && s.Mode != RedisSentinel {
		p.add("store.master_set = %q: only for mode = \"sentinel\", not %q", s.MasterSet, s.Mode)
	}
	s.RedisAccess.validate(p, "store")
	if _, err := s.LeaseKey(); err != nil {
		p.add("%v", err)
	}
	if strings.ContainsAny(s.KeyPrefix, "{}") {
		p.add("store.key_prefix = %q: must not contain { or } (rld puts each counter key in a {hash tag})", s.KeyPrefix)
	}
	if len(s.KeyPrefix) > MaxKeyPrefix {
		p.add("store.key_prefix = %q: longer than %d bytes", s.KeyPrefix, MaxKeyPrefix)
	}
	if s.ChangesPoll < Duration(10*time.Millisecond) || s.ChangesPoll > Duration(time.Minute) {
		p.add("store.changes_poll = %q: want 10ms to 1m", s.ChangesPoll)
	}
}

// validateEngines checks the [store] keys that an engine reads, those
// the file gives (set) or that are not zero.
func (s *Store) validateEngines(p *problems, set func(key string) bool) {
	given := func(key string, zero bool) bool { return !zero || set(key) }
	if given("max_keys", s.MaxKeys == 0) && s.MaxKeys <= 0 {
		p.add("store.max_keys = %d: must be positive", s.MaxKeys)
	}
	if given("sweep_interval", s.SweepInterval == 0) && (s.SweepInterval < Duration(100*time.Millisecond) || s.SweepInterval > Duration(time.Hour)) {
		p.add("store.sweep_interval = %q: want 100ms to 1h", s.SweepInterval)
	}
	if given("sync_interval", s.SyncInterval == 0) && (s.SyncInterval < Duration(10*time.Millisecond) || s.SyncInterval > Duration(10*time.Second)) {
		p.add("store.sync_interval = %q: want 10ms to 10s", s.SyncInterval)
	}
	if given("timeout", s.Timeout == 0) && s.Timeout <= 0 {
		p.add("store.timeout = %q: must be positive", s.Timeout)
	}
	if given("breaker_failure_rate", s.BreakerFailureRate == 0) && (s.BreakerFailureRate < 1 || s.BreakerFailureRate > 100) {
		p.add("store.breaker_failure_rate = %d: want a percentage, 1 to 100", s.BreakerFailureRate)
	}
	if given("breaker_min_calls", s.BreakerMinCalls == 0) && (s.BreakerMinCalls < 1 || s.BreakerMinCalls > MaxBreakerMinCalls) {
		p.add("store.breaker_min_calls = %d: want 1 to %d", s.BreakerMinCalls, MaxBreakerMinCalls)
	}
	if given("breaker_failures", s.BreakerFailures == 0) && (s.BreakerFailures < 1 || s.BreakerFailures > MaxBreakerFailures) {
		p.add("store.breaker_failures = %d: want 1 to %d", s.BreakerFailures, MaxBreakerFailures)
	}
	if given("breaker_window", s.BreakerWindow == 0) && (s.BreakerWindow < Duration(time.Millisecond) || s.BreakerWindow > Duration(time.Minute)) {
		p.add("store.breaker_window = %q: want 1ms to 1m", s.BreakerWindow)
	}
	if given("breaker_cooldown", s.BreakerCooldown == 0) && (s.BreakerCooldown < Duration(time.Millisecond) || s.BreakerCooldown > Duration(time.Minute)) {
		p.add("store.breaker_cooldown = %q: want 1ms to 1m", s.BreakerCooldown)
	}
}

// MaxBreakerFailures is the largest store.breaker_failures.
const MaxBreakerFailures = 10_000

// MaxBreakerMinCalls is the largest store.breaker_min_calls.
const MaxBreakerMinCalls = 1_000_000

func (r *Rule) validate(p *problems, i int) {
	at := fmt.Sprintf("rule[%d]", i)
	if r.Name != "" {
		at += " " + strconv.Quote(r.Name)
	}
	if err := CheckRuleName(r.Name); err != nil {
		p.add("%s: name = %q: %v", at, r.Name, err)
	}
	for _, name := range sortedKeys(r.Match) {
		if err := checkDescriptorName(name); err != nil {
			p.add("%s: match: %v", at, err)
		} else if err := CheckGlob(r.Match[name]); err != nil {
			p.add("%s: match.%s = %q: %v", at, name, r.Match[name], err)
		}
	}
	if len(r.By) == 0 {
		p.add("%s: by = []: name at least one descriptor to count by", at)
	}
	if len(r.By) > MaxBy {
		p.add("%s: by has %d descriptors, more than %d", at, len(r.By), MaxBy)
	}
	for j, name := range r.By {
		if err := checkDescriptorName(name); err != nil {
			p.add("%s: by[%d] = %q: %v", at, j, name, err)
		} else if slices.Index(r.By, name) < j {
			p.add("%s: by[%d] = %q: listed twice", at, j, name)
		}
	}

	r.validatePenalties(p, at)
	r.validateEnforce(p, at)

	kind, err := algo.ParseKind(r.Algorithm)
	if err != nil {
		p.add("%s: algorithm = %q: %v", at, r.Algorithm, err)
	}
	switch r.Mode {
	case ModeCached:
		if err == nil && kind == algo.SlidingLog {
			p.add("%s: mode = \"cached\": sliding_log is always strict (a lease would let its log forget admissions early)", at)
		}
		if err == nil && kind == algo.Concurrency {
			p.add("%s: mode = \"cached\": concurrency is always strict (a slot is held until it is released, not leased)", at)
		}
	case ModeStrict:
	default:
		p.add("%s: mode = %q: want cached or strict", at, r.Mode)
	}
	switch r.Fail {
	case FailOpen, FailClosed:
	default:
		p.add("%s: fail = %q: want open or closed", at, r.Fail)
	}
	if err != nil {
		r.validateWithoutAlgorithm(p, at)
		return
	}
	if r.Burst != 0 {
		switch {
		case kind != algo.TokenBucket && kind != algo.GCRA:
			p.add("%s: burst = %d: only token_bucket and gcra take a burst, not %s", at, r.Burst, kind)
		case len(r.Tiers) > 0:
			p.add("%s: burst = %d: cannot be combined with tiers (each tier's capacity is its limit)", at, r.Burst)
		}
	}
	// A bad period or burst is reported once, here; the limits are still
	// checked on their own, and against the period only when both are good
	// (every such check would repeat the problem).
	combine := true
	if kind == algo.Concurrency {
		if r.Period != 0 {
			p.add("%s: period = %q: a concurrency rule has no period; its timeout says how long a slot not released is held", at, r.Period)
			combine = false
		}
		if r.Timeout <= 0 {
			p.add("%s: timeout = %q: a concurrency rule needs a positive timeout (how long a slot not released is held)", at, r.Timeout)
			combine = false
		}
	} else {
		if r.Timeout != 0 {
			p.add("%s: timeout = %q: only a concurrency rule takes a timeout, not %s", at, r.Timeout, kind)
		}
		if r.Period <= 0 {
			p.add("%s: period = %q: must be positive", at, r.Period)
			combine = false
		}
	}
	if r.Burst < 0 {
		p.add("%s: burst = %d: must not be negative (0 means the limit)", at, r.Burst)
		combine = false
	}

	switch {
	case len(r.Tiers) == 0 && r.Limit <= 0:
		p.add("%s: limit = %d: must be positive (or give tiers)", at, r.Limit)
	case r.Limit < 0:
		p.add("%s: limit = %d: must not be negative", at, r.Limit)
	case r.Limit > 0:
		if err := r.Params(r.Limit).Validate(); err != nil && combine {
			p.add("%s: limit = %d, period = %q: %v", at, r.Limit, r.window(), err)
		}
		if r.Kind() == algo.SlidingLog && r.Limit > MaxSlidingLogLimit {
			p.add("%s: limit = %d: sliding_log keeps one entry per admission, so its limit is at most %d (use sliding_counter for higher limits)", at, r.Limit, MaxSlidingLogLimit)
		}
	}
	for _, tier := range sortedKeys(r.Tiers) {
		limit := r.Tiers[tier]
		if !r.checkTierName(p, at, tier) {
			continue
		}
		if limit <= 0 {
			p.add("%s: tiers.%s = %d: must be positive", at, tier, limit)
			continue
		}
		if err := r.Params(limit).Validate(); err != nil && combine {
			p.add("%s: tiers.%s = %d, period = %q: %v", at, tier, limit, r.window(), err)
		}
		if r.Kind() == algo.SlidingLog && limit > MaxSlidingLogLimit {
			p.add("%s: tiers.%s = %d: sliding_log limits are at most %d", at, tier, limit, MaxSlidingLogLimit)
		}
	}
}

// MaxPenaltyFactor is the largest penalty.factor.
const MaxPenaltyFactor = 100

// MaxPenaltyTime bounds penalty.max, block_after.within, block_after.for
// and retry_jitter.
const MaxPenaltyTime = 7 * 24 * time.Hour

// validateWithoutAlgorithm checks, for a rule whose algorithm is not
// known, what does not depend on the algorithm: the signs of the limit,
// period, timeout and burst, and the tiers' names and limits.
func (r *Rule) validateWithoutAlgorithm(p *problems, at string) {
	if len(r.Tiers) == 0 && r.Limit <= 0 {
		p.add("%s: limit = %d: must be positive (or give tiers)", at, r.Limit)
	} else if r.Limit < 0 {
		p.add("%s: limit = %d: must not be negative", at, r.Limit)
	}
	if r.Period < 0 {
		p.add("%s: period = %q: must not be negative", at, r.Period)
	}
	if r.Timeout < 0 {
		p.add("%s: timeout = %q: must not be negative", at, r.Timeout)
	}
	if r.Burst < 0 {
		p.add("%s: burst = %d: must not be negative (0 means the limit)", at, r.Burst)
	}
	for _, tier := range sortedKeys(r.Tiers) {
		if r.checkTierName(p, at, tier) && r.Tiers[tier] <= 0 {
			p.add("%s: tiers.%s = %d: must be positive", at, tier, r.Tiers[tier])
		}
	}
}

// checkTierName reports a tier name that cannot be used, and whether the
// name is good.
func (r *Rule) checkTierName(p *problems, at, tier string) bool {
	switch {
	case tier == "":
		p.add("%s: tiers: empty tier name", at)
	case tier == "*":
		p.add("%s: tiers.\"*\": a tier is chosen by an exact tier descriptor, so \"*\" would be the tier of requests sending tier=*, not a default; a request with no listed tier gets limit (or the smallest tier)", at)
	case len(tier) > MaxGlob:
		p.add("%s: tiers: tier name of %d bytes is longer than %d", at, len(tier), MaxGlob)
	default:
		return true
	}
	return false
}

// validatePenalties checks the rule's penalty, block_after and
// retry_jitter.
func (r *Rule) validatePenalties(p *problems, at string) {
	if pen := r.Penalty; pen != nil {
		if pen.After < 1 || pen.After > 1_000_000 {
			p.add("%s: penalty.after = %d: want 1 to 1000000 early retries", at, pen.After)
		}
		if !(pen.Factor > 1 && pen.Factor <= MaxPenaltyFactor) {
			p.add("%s: penalty.factor = %v: want more than 1, at most %d", at, pen.Factor, MaxPenaltyFactor)
		}
		if pen.Max <= 0 || time.Duration(pen.Max) > MaxPenaltyTime {
			p.add("%s: penalty.max = %q: want a positive duration up to %s", at, pen.Max, Duration(MaxPenaltyTime))
		}
	}
	if b := r.BlockAfter; b != nil {
		if b.Refusals < 1 || b.Refusals > 1_000_000 {
			p.add("%s: block_after.refusals = %d: want 1 to 1000000", at, b.Refusals)
		}
		if b.Within <= 0 || time.Duration(b.Within) > MaxPenaltyTime {
			p.add("%s: block_after.within = %q: want a positive duration up to %s", at, b.Within, Duration(MaxPenaltyTime))
		}
		if time.Duration(b.For) < time.Millisecond || time.Duration(b.For) > MaxPenaltyTime {
			p.add("%s: block_after.for = %q: want 1ms to %s", at, b.For, Duration(MaxPenaltyTime))
		}
	}
	j := r.RetryJitter
	if j.Fixed < 0 || j.Fixed > MaxPenaltyTime {
		p.add("%s: retry_jitter = %q: want a duration up to %s", at, j, Duration(MaxPenaltyTime))
	}
	if j.Fraction < 0 || j.Fraction > 1 || j.Fraction != j.Fraction {
		p.add("%s: retry_jitter = %q: a fraction of the Retry-After is 0 to 1", at, j)
	}
	if r.Shadow && (r.Penalty != nil || r.BlockAfter != nil) {
		p.add("%s: a shadow rule never refuses: penalty and block_after need an enforcing rule", at)
	}
}

// MaxSocketPath is the longest server.socket, in bytes: a Unix socket
// address holds 108 bytes (sun_path) including the terminating NUL.
const MaxSocketPath = 107

// MaxSlidingLogLimit is the highest limit of a sliding_log rule: the log
// holds one entry per admission and every check scans it.
const MaxSlidingLogLimit = 10000

// CheckRuleName reports whether name is a valid rule name: 1 to
// MaxRuleName bytes of A-Z a-z 0-9 _ . : -, and not reserved (allow, deny,
// none).
func CheckRuleName(name string) error {
	if name == "" {
		return errors.New("must not be empty")
	}
	if len(name) > MaxRuleName {
		return fmt.Errorf("longer than %d bytes", MaxRuleName)
	}
	for _, c := range name {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '_' || c == '.' || c == ':' || c == '-') {
			return fmt.Errorf("character %q not allowed (use A-Z a-z 0-9 _ . : -)", c)
		}
	}
	if slices.Contains(reservedNames, name) {
		return fmt.Errorf("reserved (%s)", strings.Join(reservedNames, ", "))
	}
	return nil
}

// sortedKeys returns the keys of m in order, so problems and summaries
// come out the same every time.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// decodeError names the file, and the line when the decoder gives one.
func decodeError(name string, err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg := pe.Message
		if pe.LastKey != "" {
			msg = pe.LastKey + ": " + msg
		}
		return &lineError{file: name, line: pe.Position.Line, msg: msg, err: err}
	}
	// A value of the wrong type is not a ParseError: its text says where.
	if m := typeError.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &lineError{file: name, line: line, msg: fmt.Sprintf("%s: want %s, not %s", m[2], typeName(m[4]), typeName(m[3])), err: err}
	}
	if m := tableError.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &lineError{file: name, line: line, msg: fmt.Sprintf("%s: want a table, not %s", m[2], typeName(m[3])), err: err}
	}
	return fmt.Errorf("%s: %w", name, err)
}

// typeError matches the decoder's text for a value of the wrong type.
var typeError = regexp.MustCompile(`^toml: line (\d+) \(last key "([^"]*)"\): incompatible types: TOML value has type (.+); destination has type (.+)$`)

// notTables reports the rules' match and tiers written as something else
// than a table: the decoder drops such a value without a word, and a rule
// without its match would count every request.
func notTables(data []byte) []string {
	var raw struct {
		Rule []map[string]any `toml:"rule"`
	}
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return nil // the real decode reported it
	}
	var out []string
	for i, r := range raw.Rule {
		at := fmt.Sprintf("rule[%d]", i)
		if name, ok := r["name"].(string); ok {
			at += " " + strconv.Quote(name)
		}
		for _, field := range []string{"match", "tiers"} {
			v, ok := r[field]
			if _, table := v.(map[string]any); ok && !table {
				text := fmt.Sprint(v)
				if s, isString := v.(string); isString {
					text = strconv.Quote(s)
				}
				out = append(out, fmt.Sprintf("%s: %s = %s: want a table, such as %s = { name = ... }", at, field, text, field))
			}
		}
	}
	return out
}

// tableError matches the decoder's text for a value where a table is
// wanted.
var tableError = regexp.MustCompile(`^toml: line (\d+) \(last key "([^"]*)"\): type mismatch for [^:]+: expected table but found (.+)$`)

// typeName says a type of the decoder's messages in the words of a TOML
// file.
func typeName(t string) string {
	switch t {
	case "string":
		return "a string"
	case "integer", "int64", "int":
		return "an integer"
	case "float", "float64":
		return "a number"
	case "bool":
		return "true or false"
	case "slice", "[]interface {}", "[]any":
		return "an array"
	case "struct", "map", "map[string]interface {}", "map[string]any":
		return "a table"
	case "time.Time":
		return "a date"
	}
	return t
}

// lineError is a decoding error at a line of a file, printed the way
// compilers do: "rld.toml:12: message".
type lineError struct {
	file string
	line int
	msg  string
	err  error
}

func (e *lineError) Error() string { return fmt.Sprintf("%s:%d: %s", e.file, e.line, e.msg) }

func (e *lineError) Unwrap() error { return e.err }

// unknownKeys reports each key the decoder did not use, once for every
// place it is written, with its line: the file is scanned line by line,
// following its table headers, and a key is reported at the line that
// defines it in a table of that name. A key inside an unknown table is
// covered by the table's own report. A key that no line defines by that
// path (one inside an inline table) is reported once, without a line.
func unknownKeys(md toml.MetaData, data []byte) []string {
	unknown := map[string]bool{}
	for _, k := range md.Undecoded() {
		unknown[k.String()] = true
	}
	if len(unknown) == 0 {
		return nil
	}
	// inUnknown reports whether a proper ancestor of path is unknown too.
	inUnknown := func(path string) bool {
		for i := strings.LastIndexByte(path, '.'); i > 0; i = strings.LastIndexByte(path[:i], '.') {
			if unknown[path[:i]] {
				return true
			}
		}
		return false
	}
	var out []string
	seen := map[string]bool{}
	table := ""
	for i, line := range strings.Split(string(data), "\n") {
		t := strings.TrimSpace(line)
		var path string
		if name, ok := tableHeader(t); ok {
			table, path = name, name
		} else if key, ok := keyOfLine(t); ok {
			path = key
			if table != "" {
				path = table + "." + key
			}
		} else {
			continue
		}
		if unknown[path] && !inUnknown(path) {
			seen[path] = true
			out = append(out, fmt.Sprintf(":%d: unknown key %q", i+1, path))
		}
	}
	var rest []string
	for k := range unknown {
		if !seen[k] && !inUnknown(k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		out = append(out, fmt.Sprintf(": unknown key %q", k))
	}
	return out
}

// tableHeader returns the dotted name of a [table] or [[array]] header
// line, its parts unquoted.
func tableHeader(t string) (string, bool) {
	if !strings.HasPrefix(t, "[") {
		return "", false
	}
	end := "]"
	t = t[1:]
	if strings.HasPrefix(t, "[") {
		end, t = "]]", t[1:]
	}
	n := strings.Index(t, end)
	if n < 0 {
		return "", false
	}
	return dottedKey(t[:n])
}

// keyOfLine returns the dotted key that a "key = value" line defines, its
// parts unquoted.
func keyOfLine(t string) (string, bool) {
	if t == "" || t[0] == '#' {
		return "", false
	}
	n := strings.IndexByte(t, '=')
	if n <= 0 {
		return "", false
	}
	return dottedKey(t[:n])
}

// dottedKey normalises a written key, `a . "b"`, to a.b. It gives up on
// keys with quoted dots or characters a bare key may not hold.
func dottedKey(s string) (string, bool) {
	parts := strings.Split(s, ".")
	for i, part := range parts {
		part = strings.TrimSpace(part)
		if len(part) >= 2 && (part[0] == '"' || part[0] == '\'') && part[len(part)-1] == part[0] {
			part = part[1 : len(part)-1]
		}
		if part == "" || strings.ContainsAny(part, " \t\"'[]{}=#,") {
			return "", false
		}
		parts[i] = part
	}
	return strings.Join(parts, "."), true
}
