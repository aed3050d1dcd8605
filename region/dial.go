package region

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/rueidis"
)

// DialOptions names a Redis deployment: the global store, or a region's
// own Redis.
type DialOptions struct {
	// Addrs are host:port: one server, or a Cluster's seed nodes.
	Addrs []string
	// Cluster says the addresses are a Cluster's.
	Cluster bool
	// MasterSet, when set, names the primary that the sentinels at
	// Addrs watch.
	MasterSet string
	// Username and Password authenticate to the Redis servers.
	Username, Password string
	// TLS, when set, connects with TLS, to the sentinels too (a
	// cross-region global store, or a region's Redis that takes TLS).
	TLS *tls.Config
	// Timeout bounds the set-up of a connection and how long a
	// connection may go without answers (default 1s).
	Timeout time.Duration
}

// Dial returns a rueidis client of o's deployment: no client cache, no
// retries (a renewal must not apply twice), fail fast.
func Dial(o DialOptions) (rueidis.Client, error) {
	if len(o.Addrs) == 0 {
		return nil, errors.New("region: dial: no redis address")
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	ro := rueidis.ClientOption{
		InitAddress:      o.Addrs,
		Username:         o.Username,
		Password:         o.Password,
		TLSConfig:        o.TLS,
		ClientName:       "rld-region",
		Dialer:           net.Dialer{Timeout: o.Timeout},
		ConnWriteTimeout: o.Timeout,
		DisableCache:     true,
		DisableRetry:     true,
	}
	switch {
	case o.MasterSet != "":
		ro.Sentinel = rueidis.SentinelOption{MasterSet: o.MasterSet, TLSConfig: o.TLS}
	case !o.Cluster:
		ro.ForceSingleClient = true
	}
	c, err := rueidis.NewClient(ro)
	if err != nil {
		return nil, fmt.Errorf("region: dial %v: %w", o.Addrs, err)
	}
	return c, nil
}
