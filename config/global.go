package config

import (
	"crypto/tls"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/rld/rld/algo"
)

// Defaults of the [global] table.
const (
	// DefaultGlobalInterval is global.interval.
	DefaultGlobalInterval = 250 * time.Millisecond
	// DefaultGlobalLease is global.lease: four intervals.
	DefaultGlobalLease = 4 * DefaultGlobalInterval
)

// Scopes of a rule: rule.scope.
const (
	// ScopeLocal rules hold their limit on the region's own store (the
	// default).
	ScopeLocal = "local"
	// ScopeGlobal rules hold their limit across every region: each
	// region decides with its leased share of it (package region).
	ScopeGlobal = "global"
)

// Global is the [global] table: the store shared by every region, on
// which each region's share of a global rule's limit is leased.
type Global struct {
	// Redis lists host:port addresses of the global store: one
	// (standalone) or a Cluster's seed nodes.
	Redis []string `toml:"redis"`
	// Mode is standalone or cluster.
	Mode RedisMode `toml:"mode"`
	// Region is this daemon's region, one of Regions.
	Region string `toml:"region"`
	// Regions names every region.
	Regions []string `toml:"regions"`
	// Interval is how often demand is flushed, shares loaded and renewed.
	Interval Duration `toml:"interval"`
	// Lease is how long a renewed share holds.
	Lease Duration `toml:"lease"`
	// RedisAccess holds the global store's credentials and TLS
	// settings.
	RedisAccess
}

// Credentials returns the password and the TLS configuration (nil
// without tls = true) of connections to the global store.
func (g *Global) Credentials() (string, *tls.Config, error) { return g.credentials("global") }

// Enabled reports whether the [global] table names a global store.
func (g *Global) Enabled() bool { return len(g.Redis) > 0 }

// IsGlobal reports whether the rule's scope is global.
func (r *Rule) IsGlobal() bool { return r.Scope == ScopeGlobal }

func (g *Global) validate(p *problems) {
	for i, addr := range g.Redis {
		if _, port, err := net.SplitHostPort(addr); err != nil {
			p.add("global.redis[%d] = %q: not host:port: %v", i, addr, err)
		} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			p.add("global.redis[%d] = %q: port %q is not 1 to 65535", i, addr, port)
		}
	}
	switch g.Mode {
	case RedisStandalone:
		if len(g.Redis) > 1 {
			p.add("global.redis has %d addresses: standalone mode takes one (use mode = \"cluster\" for several)", len(g.Redis))
		}
	case RedisCluster:
	default:
		p.add("global.mode = %q: want standalone or cluster", g.Mode)
	}
	if g.Interval < Duration(10*time.Millisecond) || g.Interval > Duration(time.Minute) {
		p.add("global.interval = %q: want 10ms to 1m", g.Interval)
	}
	if g.Lease <= g.Interval {
		p.add("global.lease = %q: must be longer than global.interval (%s)", g.Lease, g.Interval)
	}
	g.RedisAccess.validate(p, "global")
	if !g.Enabled() {
		if g.Region != "" || len(g.Regions) > 0 {
			p.add("global.redis = []: name the global store, or leave global.region and global.regions out")
		}
		return
	}
	for i, r := range g.Regions {
		if r == "" {
			p.add("global.regions[%d] = \"\": must not be empty", i)
		} else if slices.Index(g.Regions, r) < i {
			p.add("global.regions[%d] = %q: listed twice", i, r)
		}
	}
	if !slices.Contains(g.Regions, g.Region) {
		p.add("global.region = %q: must be one of global.regions %q", g.Region, g.Regions)
	}
}

// validateScope checks scope and fallback_share of rule r (at names it).
func (r *Rule) validateScope(p *problems, at string, g *Global) {
	switch r.Scope {
	case "", ScopeLocal:
		if r.FallbackShare != 0 {
			p.add("%s: fallback_share = %d: only for scope = \"global\"", at, r.FallbackShare)
		}
		if r.GlobalStrict {
			p.add("%s: global_strict = true: only for scope = \"global\" (a local rule always decides on the region's store)", at)
		}
		return
	case ScopeGlobal:
	default:
		p.add("%s: scope = %q: want local or global", at, r.Scope)
		return
	}
	if !g.Enabled() {
		p.add("%s: scope = \"global\": needs a [global] table naming the global store", at)
	}
	if k, err := algo.ParseKind(r.Algorithm); err == nil && k == algo.Concurrency {
		p.add("%s: scope = \"global\": concurrency limits cannot be global (a slot is held, not a rate to share); use a rate algorithm", at)
	}
	if r.Shadow {
		p.add("%s: scope = \"global\": a shadow rule cannot be global", at)
	}
	if r.GlobalStrict && r.FallbackShare != 0 {
		p.add("%s: global_strict = true: fallback_share = %d must be left out (a strict rule's fallback share is 0)", at, r.FallbackShare)
	}
	if r.FallbackShare < 0 {
		p.add("%s: fallback_share = %d: must not be negative", at, r.FallbackShare)
	} else if n := int64(max(len(g.Regions), 1)); r.FallbackShare > 0 && r.FallbackShare*n > r.Limit {
		p.add("%s: fallback_share = %d: %d regions × %d exceeds limit %d: the fallback shares must fit in the limit", at, r.FallbackShare, n, r.FallbackShare, r.Limit)
	}
}
