// Package config loads and validates rld.toml.
//
// Load and Parse decode the file into a Config filled with the defaults
// below (a setting that an engine reads is left zero, which the engine
// takes as its own default), reject keys the Config does not know, and
// check every field, reporting all problems at once, each naming the
// field and its value.
// A Config is plain data: once shared, treat it as read-only.
package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/descriptor"
)

// Defaults of the [server] and [store] tables that config owns. A
// setting that an engine reads (store.max_keys, sweep_interval, timeout,
// sync_interval and the breaker_* keys) has none here: config leaves it
// zero when the file does not set it, and the engine's constructor fills
// in its own default (memstore, redisx, shardcache, breaker), which
// docs/configuration.md states.
const (
	DefaultSocket         = "/run/rld/rld.sock"
	DefaultSocketMode     = "0660"
	DefaultHTTP           = "127.0.0.1:9464"
	DefaultMaxConnections = 4096
	DefaultMaxInflight    = 1024
	DefaultReadTimeout    = 30 * time.Second
	DefaultIdleTimeout    = 0 // connections may idle forever
	DefaultDrainTimeout   = 5 * time.Second
	DefaultLogLevel       = "info"
	DefaultLogFormat      = "text"

	DefaultRedisMode = RedisStandalone
	// DefaultKeyPrefix is store.key_prefix's default ("" is a prefix
	// too: none).
	DefaultKeyPrefix = "rld:"
	// DefaultChangesPoll is store.changes_poll's default.
	DefaultChangesPoll = time.Second
)

// MaxKeyPrefix is the longest store.key_prefix, in bytes.
const MaxKeyPrefix = 64

// RedisMode says how rld reaches Redis: store.mode.
type RedisMode string

// Redis modes.
const (
	// RedisStandalone is one Redis server: store.redis holds its address.
	RedisStandalone RedisMode = "standalone"
	// RedisSentinel finds the primary through Sentinel: store.redis holds
	// the sentinels' addresses and store.master_set names the primary.
	RedisSentinel RedisMode = "sentinel"
	// RedisCluster is a Redis Cluster: store.redis holds one or more seed
	// nodes.
	RedisCluster RedisMode = "cluster"
)

// Defaults of a [[rule]]. The default mode depends on the algorithm:
// ModeStrict for sliding_log and concurrency, ModeCached for the others.
const (
	DefaultAlgorithm = "token_bucket"
	DefaultFail      = FailOpen
)

// TierDescriptor is the descriptor whose value selects a rule's tier.
const TierDescriptor = "tier"

// Limits on names: those on descriptors are package descriptor's, which
// the protocol's (package wire) agree with.
const (
	// MaxRuleName is the longest rule name, in bytes.
	MaxRuleName = 255
	// MaxDescriptorName is the longest descriptor name, in bytes.
	MaxDescriptorName = descriptor.MaxNameLen
	// MaxGlob is the longest glob, in bytes: the longest descriptor value.
	MaxGlob = descriptor.MaxValueLen
	// MaxBy is the most descriptors a counter key may be built from: the
	// most a request carries.
	MaxBy = descriptor.MaxDescriptors
)

// Reserved rule names: a decision that no rule made reports "allow"
// (the allow list), "deny" (the deny list) or, in metrics, "none".
var reservedNames = []string{"allow", "deny", "none"}

// Mode says where a rule's decisions are made (used by the Redis store).
type Mode string

// Modes.
const (
	// ModeCached rules may be decided locally from leased quota.
	ModeCached Mode = "cached"
	// ModeStrict rules are decided by the shared store on every check.
	ModeStrict Mode = "strict"
)

// Fail says what a rule does when the shared store cannot be reached.
type Fail string

// Failure modes.
const (
	// FailOpen rules keep limiting on local state alone.
	FailOpen Fail = "open"
	// FailClosed rules deny.
	FailClosed Fail = "closed"
)

// Config is the content of rld.toml.
type Config struct {
	// Allow lists selectors ("name=glob"); a request matching one bypasses
	// every rule and is counted nowhere.
	Allow []string `toml:"allow"`
	// Deny lists selectors; a request matching one is blocked. Deny wins
	// over Allow.
	Deny   []string `toml:"deny"`
	Server Server   `toml:"server"`
	Store  Store    `toml:"store"`
	Admin  Admin    `toml:"admin"`
	Log    Log      `toml:"log"`
	// Request says how descriptors are derived from the attributes of a
	// request that a client sends (package derive).
	Request Request `toml:"request"`
	// Envoy is the Envoy rate limit service face (package envoyrls).
	Envoy Envoy `toml:"envoy"`
	// Global is the store shared by every region, for global rules
	// (package region).
	Global Global `toml:"global"`
	// Rules are evaluated in this order.
	Rules []Rule `toml:"rule"`
}

// Server is the [server] table.
type Server struct {
	// Socket is the path of the Unix socket; its directory is created.
	Socket string `toml:"socket"`
	// SocketMode is the socket's permission bits as an octal string.
	SocketMode string `toml:"socket_mode"`
	// HTTP is the host:port of the HTTP listener; "" disables it.
	HTTP string `toml:"http"`
	// HTTPSocket is the path of a Unix socket serving the same HTTP
	// endpoints as HTTP (for nginx's auth_request); "" disables it. Its
	// directory is created and its mode is SocketMode.
	HTTPSocket string `toml:"http_socket"`
	// TrustedProxies lists the peers of the HTTP endpoints (CIDRs, bare
	// addresses, or "unix" for the HTTP socket) whose X-Real-IP,
	// X-Forwarded-For and ip= argument name the client's address.
	TrustedProxies []string `toml:"trusted_proxies"`
	// MaxConnections bounds concurrent socket connections.
	MaxConnections int `toml:"max_connections"`
	// MaxInflight bounds requests in flight on one connection.
	MaxInflight int `toml:"max_inflight"`
	// ReadTimeout bounds how long a frame that has started may take to
	// arrive in full.
	ReadTimeout Duration `toml:"read_timeout"`
	// IdleTimeout closes connections idle this long; 0 never does.
	IdleTimeout Duration `toml:"idle_timeout"`
	// DrainTimeout bounds how long shutdown waits for in-flight requests.
	DrainTimeout Duration `toml:"drain_timeout"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `toml:"log_level"`
	// LogFormat is text or json.
	LogFormat string `toml:"log_format"`
	// ConfigPoll is how often the daemon hashes its configuration file
	// and reloads it when the content changed; 0 turns polling off
	// (SIGHUP still reloads).
	ConfigPoll Duration `toml:"config_poll"`
}

// Envoy is the [envoy] table: Envoy's rate limit service
// (envoy.service.ratelimit.v3, gRPC) beside the binary protocol. Both
// listeners are off by default; docs/envoy.md describes the mapping.
type Envoy struct {
	// Listen is the host:port of the gRPC listener; "" disables it.
	Listen string `toml:"listen"`
	// Socket is the path of a Unix socket serving the same gRPC service;
	// "" disables it. Its directory is created; its mode is
	// server.socket_mode.
	Socket string `toml:"socket"`
}

// Store is the [store] table: the embedded store's bounds, or the Redis
// that the daemons of a fleet share.
// MaxKeys, SweepInterval, Timeout, SyncInterval and the Breaker fields are
// zero when the file does not set them: the default of the engine that
// reads them (memstore, redisx, shardcache, breaker).
type Store struct {
	// MaxKeys bounds the number of counter keys held by the embedded
	// store.
	MaxKeys int `toml:"max_keys"`
	// SweepInterval is how often the embedded store evicts idle keys.
	SweepInterval Duration `toml:"sweep_interval"`

	// Redis lists host:port addresses; empty means the embedded store.
	// Standalone takes one address, sentinel the sentinels, cluster one
	// or more seed nodes.
	Redis []string `toml:"redis"`
	// Mode is standalone, sentinel or cluster.
	Mode RedisMode `toml:"mode"`
	// MasterSet is the name the sentinels know the primary by (sentinel
	// mode only, and required there).
	MasterSet string `toml:"master_set"`
	// RedisAccess holds the credentials and the TLS settings.
	RedisAccess
	// LeaseKeyFile names a file holding the key (16 bytes or more) that
	// signs the leases of acquires, which release and settle verify. The
	// daemons of a fleet share one so that any of them, restarted or
	// not, takes any lease; unset, each daemon signs with a random key
	// of its own until it stops. It is read when the daemon starts.
	LeaseKeyFile string `toml:"lease_key_file"`
	// KeyPrefix starts every Redis key rld writes.
	KeyPrefix string `toml:"key_prefix"`
	// Timeout bounds every Redis call: a check never waits longer on
	// Redis.
	Timeout Duration `toml:"timeout"`
	// SyncInterval is how often the hot-key cache returns, renews and
	// refreshes its leases (Redis only). A lease holds about one
	// interval of a key's local traffic.
	SyncInterval Duration `toml:"sync_interval"`
	// ChangesPoll is how often a daemon on Redis reads the version of
	// the overrides and blocks, to apply a change whose pub/sub
	// announcement it missed.
	ChangesPoll Duration `toml:"changes_poll"`
	// BreakerFailureRate is the share of a Redis node's calls, in
	// percent, that must fail (time out, lose their connection, meet
	// CLUSTERDOWN and the like) within BreakerWindow, once the window
	// holds BreakerMinCalls calls, to open the node's circuit breaker.
	BreakerFailureRate int `toml:"breaker_failure_rate"`
	// BreakerMinCalls is the fewest calls within BreakerWindow for
	// BreakerFailureRate to judge a node.
	BreakerMinCalls int `toml:"breaker_min_calls"`
	// BreakerFailures is how many calls failing in a row, none
	// succeeding in between, open the breaker while BreakerWindow holds
	// fewer than BreakerMinCalls calls.
	BreakerFailures int `toml:"breaker_failures"`
	// BreakerWindow is the rolling window a node's calls and failures
	// are counted in.
	BreakerWindow Duration `toml:"breaker_window"`
	// BreakerCooldown is how long an open breaker sends no call before
	// it lets a probe go.
	BreakerCooldown Duration `toml:"breaker_cooldown"`
}

// MinLeaseKey is the shortest key that lease_key_file may hold.
const MinLeaseKey = 16

// LeaseKey returns the content of LeaseKeyFile without its trailing
// newline, or nil when it is not set.
func (s *Store) LeaseKey() ([]byte, error) {
	if s.LeaseKeyFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(s.LeaseKeyFile)
	if err != nil {
		return nil, fmt.Errorf("cannot read store.lease_key_file=%q: %w", s.LeaseKeyFile, err)
	}
	b = []byte(strings.TrimRight(string(b), "\r\n"))
	if len(b) < MinLeaseKey {
		return nil, fmt.Errorf("store.lease_key_file=%q: a key of %d bytes, want at least %d", s.LeaseKeyFile, len(b), MinLeaseKey)
	}
	return b, nil
}

// UsesRedis reports whether the store is Redis rather than the embedded
// store.
func (s *Store) UsesRedis() bool { return len(s.Redis) > 0 }

// Credentials returns the password (Password, or the content of
// PasswordFile without its trailing newline) and the TLS configuration
// (nil without tls = true) of connections to Redis.
func (s *Store) Credentials() (string, *tls.Config, error) { return s.credentials("store") }

// Request is the [request] table: how the daemon derives descriptors
// (ip, method, host, endpoint and Descriptors) from a request's
// attributes. Package derive compiles and checks it, and fills in its
// defaults for the fields the file does not set (zero here).
type Request struct {
	// TrustedProxies lists the addresses and CIDRs whose forwarding
	// header (ClientIPHeader) names the client.
	TrustedProxies []string `toml:"trusted_proxies"`
	// ClientIPHeader is x-forwarded-for, x-real-ip or forwarded.
	ClientIPHeader string `toml:"client_ip_header"`
	// IPv4Prefix and IPv6Prefix aggregate the ip descriptor to a prefix
	// of this many bits.
	IPv4Prefix int `toml:"ipv4_prefix"`
	IPv6Prefix int `toml:"ipv6_prefix"`
	// Routes are path templates (/v1/orders/{id}); the first that
	// matches a request's path is its endpoint.
	Routes []string `toml:"routes"`
	// Descriptors maps descriptor names to their source: header:NAME,
	// query:NAME, cookie:NAME or jwt:CLAIM.
	Descriptors map[string]string `toml:"descriptors"`
	// JWT verifies the bearer tokens whose claims jwt: sources read.
	JWT JWT `toml:"jwt"`
}

// JWT is the [request.jwt] table.
type JWT struct {
	// KeysFile holds the keys: a JWKS document or PEM public keys. It is
	// read again on every reload.
	KeysFile string `toml:"keys_file"`
	// Issuer and Audience, when set, must be the token's iss and one of
	// its aud.
	Issuer   string `toml:"issuer"`
	Audience string `toml:"audience"`
	// Leeway is the clock skew allowed on exp and nbf.
	Leeway Duration `toml:"leeway"`
}

// Rule is one [[rule]].
type Rule struct {
	// Name identifies the rule in answers, metrics and counter keys.
	Name string `toml:"name"`
	// Match maps descriptor names to globs; the rule applies to a request
	// only when each named descriptor is present and matches.
	Match map[string]string `toml:"match"`
	// By names the descriptors whose values form the counter key. A
	// request lacking one of them is not counted by the rule.
	By []string `toml:"by"`
	// Algorithm is token_bucket, gcra, sliding_log, sliding_counter,
	// fixed_window or concurrency.
	Algorithm string `toml:"algorithm"`
	// Limit is the units admitted per Period. With Tiers it is the limit
	// of requests whose tier is missing or not listed, and may be 0.
	Limit int64 `toml:"limit"`
	// Period is the length of the limit's window or refill period. A
	// concurrency rule has none: see Timeout.
	Period Duration `toml:"period"`
	// Timeout is, for a concurrency rule only, how long a slot acquired
	// and not released stays held: a caller that never releases holds
	// its slots this long at most. Limit is then the slots in flight.
	Timeout Duration `toml:"timeout"`
	// Burst is the capacity of token_bucket and gcra; 0 means Limit.
	Burst int64 `toml:"burst"`
	// Mode is cached or strict.
	Mode Mode `toml:"mode"`
	// Fail is open or closed.
	Fail Fail `toml:"fail"`
	// Shadow rules decide and count but never deny.
	Shadow bool `toml:"shadow"`
	// Enforce is the share of the rule's counter keys that it enforces,
	// "0%" to "100%" in steps of 0.01% ("" means "100%"): a fixed hash of
	// each key says whether the key is in the share; the other keys run
	// as in a shadow rule. See EnforceShare.
	Enforce string `toml:"enforce"`
	// Tiers maps values of the tier descriptor to limits.
	Tiers map[string]int64 `toml:"tiers"`
	// Penalty, when set, lengthens the Retry-After of a key that keeps
	// retrying while refused (see Penalty).
	Penalty *Penalty `toml:"penalty"`
	// BlockAfter, when set, blocks a key that keeps retrying while
	// refused (see BlockAfter).
	BlockAfter *BlockAfter `toml:"block_after"`
	// RetryJitter adds a random 0..RetryJitter to the Retry-After of a
	// refusal ("" or 0: none).
	RetryJitter Jitter `toml:"retry_jitter"`
	// Scope is local (the default) or global: a global rule's limit
	// holds across every region of [global].
	Scope string `toml:"scope"`
	// FallbackShare is, for a global rule, the units of Limit a region
	// uses for a key it holds no lease of; 0 means Limit / regions.
	FallbackShare int64 `toml:"fallback_share"`
	// GlobalStrict, for a global rule, decides a key with no live share
	// in the region by a synchronous renewal on the global store instead
	// of a fallback share (which is then 0).
	GlobalStrict bool `toml:"global_strict"`
}

// Penalty is a rule's penalty = { after, factor, max }: a key refused
// After times while an earlier refusal's Retry-After is still running is
// given a cooldown: its Retry-After becomes the one the limit gives times
// Factor, times Factor again for each further early retry, at most Max;
// checks during the cooldown are refused on the daemon with the time
// left of it.
type Penalty struct {
	After  int64    `toml:"after"`
	Factor float64  `toml:"factor"`
	Max    Duration `toml:"max"`
}

// BlockAfter is a rule's block_after = { refusals, within, for }: a key
// refused Refusals times within Within, each while an earlier refusal's
// Retry-After was still running, is blocked for For, as an admin block
// would block it.
type BlockAfter struct {
	Refusals int64    `toml:"refusals"`
	Within   Duration `toml:"within"`
	For      Duration `toml:"for"`
}

// Jitter is a rule's retry_jitter: a duration ("500ms"), or a fraction
// of the Retry-After ("0.1").
type Jitter struct {
	// Fixed is the most added, when given as a duration.
	Fixed time.Duration
	// Fraction is the most added as a fraction of the Retry-After, when
	// given as a number.
	Fraction float64
}

// UnmarshalText parses a duration or a fraction.
func (j *Jitter) UnmarshalText(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "" {
		*j = Jitter{}
		return nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		*j = Jitter{Fraction: f}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("retry_jitter %q: want a duration (\"500ms\") or a fraction (\"0.1\")", s)
	}
	*j = Jitter{Fixed: d}
	return nil
}

// MarshalText returns j as UnmarshalText reads it.
func (j Jitter) MarshalText() ([]byte, error) { return []byte(j.String()), nil }

// String returns j as the configuration gives it ("" when none).
func (j Jitter) String() string {
	switch {
	case j.Fraction != 0:
		return strconv.FormatFloat(j.Fraction, 'g', -1, 64)
	case j.Fixed != 0:
		return Duration(j.Fixed).String()
	}
	return ""
}

// IsZero reports whether j adds nothing.
func (j Jitter) IsZero() bool { return j.Fixed == 0 && j.Fraction == 0 }

// Default returns a Config holding every default that config owns and no
// rules; the settings an engine reads are zero: its default.
func Default() *Config {
	return &Config{
		Server: Server{
			Socket:         DefaultSocket,
			SocketMode:     DefaultSocketMode,
			HTTP:           DefaultHTTP,
			MaxConnections: DefaultMaxConnections,
			MaxInflight:    DefaultMaxInflight,
			ReadTimeout:    Duration(DefaultReadTimeout),
			IdleTimeout:    Duration(DefaultIdleTimeout),
			DrainTimeout:   Duration(DefaultDrainTimeout),
			LogLevel:       DefaultLogLevel,
			LogFormat:      DefaultLogFormat,
			ConfigPoll:     Duration(DefaultConfigPoll),
		},
		Admin: Admin{
			HTTP:       DefaultAdminHTTP,
			SocketUIDs: DefaultSocketUIDs(),
		},
		Log: Log{
			Decisions:       DefaultDecisions,
			DeniedRate:      DefaultDeniedRate,
			DeniedPerSecond: DefaultDeniedPerSecond,
			AllowedRate:     DefaultAllowedRate,
		},
		Store: Store{
			Mode:        DefaultRedisMode,
			KeyPrefix:   DefaultKeyPrefix,
			ChangesPoll: Duration(DefaultChangesPoll),
		},
		Global: Global{
			Mode:     DefaultRedisMode,
			Interval: Duration(DefaultGlobalInterval),
			Lease:    Duration(DefaultGlobalLease),
		},
	}
}

// Load reads and parses the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read config: %w", err)
	}
	return Parse(data, path)
}

// Parse decodes and validates data, the content of the file called name.
// Errors name the file; a syntax or type error names the line, and an
// invalid configuration gives one line per problem (errors.Join), each
// naming the field and its value.
func Parse(data []byte, name string) (*Config, error) {
	if name == "" {
		name = "config"
	}
	c := Default()
	md, err := toml.Decode(string(data), c)
	if err != nil {
		return nil, decodeError(name, err)
	}
	var problems []error
	for _, p := range unknownKeys(md, data) {
		problems = append(problems, fmt.Errorf("%s%s", name, p))
	}
	for _, p := range notTables(data) {
		problems = append(problems, fmt.Errorf("%s: %s", name, p))
	}
	c.setDefaults()
	for _, p := range c.validate(md.IsDefined) {
		problems = append(problems, fmt.Errorf("%s: %s", name, p))
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	return c, nil
}

// setDefaults fills the rule fields whose default depends on others.
func (c *Config) setDefaults() {
	for i := range c.Rules {
		r := &c.Rules[i]
		if r.Algorithm == "" {
			r.Algorithm = DefaultAlgorithm
		}
		if r.Mode == "" {
			r.Mode = ModeCached
			if r.Algorithm == algo.SlidingLog.String() || r.Algorithm == algo.Concurrency.String() {
				r.Mode = ModeStrict
			}
		}
		if r.Fail == "" {
			r.Fail = DefaultFail
		}
	}
}

// SocketFileMode returns SocketMode as a file mode. It is valid once the
// Config has been parsed.
func (s *Server) SocketFileMode() os.FileMode {
	m, _ := strconv.ParseUint(s.SocketMode, 8, 32)
	return os.FileMode(m) & os.ModePerm
}

// SlogLevel returns LogLevel as a slog level (info when unknown).
func (s *Server) SlogLevel() slog.Level {
	switch s.LogLevel {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Kind returns the rule's algorithm. It is valid once the Config has been
// parsed.
func (r *Rule) Kind() algo.Kind {
	k, _ := algo.ParseKind(r.Algorithm)
	return k
}

// Params returns the parameters of the rule's algorithm with the given
// limit: Limit, or one of Tiers.
func (r *Rule) Params(limit int64) algo.Params {
	return algo.Params{Kind: r.Kind(), Limit: limit, Period: time.Duration(r.window()), Burst: r.Burst}
}

// window returns the rule's Period, or its Timeout for a concurrency
// rule: the Period of its algo.Params.
func (r *Rule) window() Duration {
	if r.Kind() == algo.Concurrency {
		return r.Timeout
	}
	return r.Period
}

// DefaultLimit returns the limit of a request whose tier is missing or not
// listed in Tiers: Limit when set, else the smallest tier limit.
func (r *Rule) DefaultLimit() int64 {
	if r.Limit > 0 || len(r.Tiers) == 0 {
		return r.Limit
	}
	var least int64
	for _, l := range r.Tiers {
		if least == 0 || l < least {
			least = l
		}
	}
	return least
}

// Selector is one entry of the allow or deny list: a descriptor name and
// a glob its value must match.
type Selector struct {
	Name string
	Glob string
}

// ParseSelector parses "name=glob".
func ParseSelector(s string) (Selector, error) {
	name, glob, ok := strings.Cut(s, "=")
	if !ok {
		return Selector{}, fmt.Errorf("selector %q must have the form name=glob", s)
	}
	if err := checkDescriptorName(name); err != nil {
		return Selector{}, fmt.Errorf("selector %q: %w", s, err)
	}
	if err := CheckGlob(glob); err != nil {
		return Selector{}, fmt.Errorf("selector %q: %w", s, err)
	}
	return Selector{Name: name, Glob: glob}, nil
}

// String returns the selector as written in the file.
func (s Selector) String() string { return s.Name + "=" + s.Glob }

// CheckGlob reports whether glob is usable: `*` matches any run of bytes,
// `?` one byte, everything else itself; or, when it starts with '~', the
// rest is a regular expression (see CompileRegexp). A glob must not be
// empty (use "*" for any value) and is at most MaxGlob bytes long.
func CheckGlob(glob string) error {
	if glob == "" {
		return errors.New(`empty glob (use "*" to match any value)`)
	}
	if len(glob) > MaxGlob {
		return fmt.Errorf("glob of %d bytes is longer than %d", len(glob), MaxGlob)
	}
	_, _, err := CompileRegexp(glob)
	return err
}

func checkDescriptorName(name string) error {
	if name == "" {
		return errors.New("empty descriptor name")
	}
	if len(name) > MaxDescriptorName {
		return fmt.Errorf("descriptor name %q is longer than %d bytes", name, MaxDescriptorName)
	}
	return nil
}

// Duration is a time.Duration written as a string such as "30s" or "1m".
type Duration time.Duration

// UnmarshalText parses a time.ParseDuration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalText returns d as String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// String returns d in its shortest form: "1m" rather than "1m0s".
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// RedisAccess is how rld reaches a Redis deployment: the credentials and
// the TLS settings that [store] and [global] both take.
type RedisAccess struct {
	// Username is the Redis ACL user; "" means the default user.
	Username string `toml:"username"`
	// Password authenticates to Redis (not to the sentinels). At most one
	// of Password and PasswordFile may be set.
	Password string `toml:"password"`
	// PasswordFile names a file holding the password; a trailing newline
	// is ignored. It is read when the daemon starts.
	PasswordFile string `toml:"password_file"`
	// TLS connects to the Redis servers, and to the sentinels, with TLS.
	TLS bool `toml:"tls"`
	// TLSCAFile names a PEM file of the certificates that may sign the
	// servers'; "" means the system's roots.
	TLSCAFile string `toml:"tls_ca_file"`
	// TLSServerName is the name the servers' certificates must carry; ""
	// means the host of each address dialled.
	TLSServerName string `toml:"tls_server_name"`
}

// credentials returns a's password and TLS configuration (see password
// and tlsConfig); section names the table in errors.
func (a *RedisAccess) credentials(section string) (string, *tls.Config, error) {
	pw, err := a.password(section)
	if err != nil {
		return "", nil, err
	}
	tc, err := a.tlsConfig(section)
	return pw, tc, err
}

// password returns Password, or the content of PasswordFile without its
// trailing newline; section names the table in errors.
func (a *RedisAccess) password(section string) (string, error) {
	if a.PasswordFile == "" {
		return a.Password, nil
	}
	b, err := os.ReadFile(a.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("cannot read %s.password_file=%q: %w", section, a.PasswordFile, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// tlsConfig returns the TLS configuration of a's settings, nil without
// TLS; section names the table in errors.
func (a *RedisAccess) tlsConfig(section string) (*tls.Config, error) {
	if !a.TLS {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: a.TLSServerName}
	if a.TLSCAFile != "" {
		pem, err := os.ReadFile(a.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read %s.tls_ca_file=%q: %w", section, a.TLSCAFile, err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.tls_ca_file=%q: %w", section, a.TLSCAFile, errNoPEMCertificate)
		}
	}
	return c, nil
}

// errNoPEMCertificate is the error of a CA file with no PEM certificate.
var errNoPEMCertificate = errors.New("no PEM certificate in the file")

// validate checks a (section's): at most one of password and
// password_file, a password file that can be read, tls_ca_file and
// tls_server_name only with tls = true, and a CA file that can be read
// and holds a certificate.
func (a *RedisAccess) validate(p *problems, section string) {
	if a.Password != "" && a.PasswordFile != "" {
		p.add("%s.password_file = %q: set either password or password_file, not both", section, a.PasswordFile)
	}
	if _, err := a.password(section); err != nil {
		p.add("%s.password_file = %q: %v", section, a.PasswordFile, errors.Unwrap(err))
	}
	if !a.TLS && (a.TLSCAFile != "" || a.TLSServerName != "") {
		p.add("%s.tls = false: tls_ca_file and tls_server_name need tls = true", section)
	}
	if _, err := a.tlsConfig(section); err != nil {
		p.add("%v", err)
	}
}
