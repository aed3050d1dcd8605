package daemon

import (
	"errors"
	"log/slog"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/config"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/region"
)

// openRegion makes the daemon's part in its region when [global] names a
// global store: global rules then get region.Store through
// policy.Stores.Global. It needs the region's own Redis ([store]).
func (d *Daemon) openRegion(cfg *config.Config) error {
	g := &cfg.Global
	if !g.Enabled() {
		return nil
	}
	if !cfg.Store.UsesRedis() || d.fleet == nil {
		return errors.New("config: [global] needs store.redis: each region decides on its own Redis")
	}
	sc := cfg.Store
	local := region.DialOptions{Addrs: sc.Redis, Cluster: sc.Mode == config.RedisCluster, Username: sc.Username,
		Password: d.fleet.password, TLS: d.fleet.tls}
	if sc.Mode == config.RedisSentinel {
		local.MasterSet = sc.MasterSet
	}
	gpassword, gtls, err := g.Credentials()
	if err != nil {
		return err
	}
	global := region.DialOptions{Addrs: g.Redis, Cluster: g.Mode == config.RedisCluster, Username: g.Username, Password: gpassword, TLS: gtls}
	r, err := region.New(region.Options{
		Region:     g.Region,
		Regions:    g.Regions,
		Interval:   time.Duration(g.Interval),
		Lease:      time.Duration(g.Lease),
		ID:         d.fleet.id,
		DialLocal:  func() (rueidis.Client, error) { return region.Dial(local) },
		DialGlobal: func() (rueidis.Client, error) { return region.Dial(global) },
		Logger:     d.log,
	})
	if err != nil {
		return err
	}
	d.region = r
	d.stores.Global = func(cr *config.Rule, inner policy.Store) policy.Store {
		if cr.GlobalStrict {
			return r.WrapStrict(inner, cr.DefaultLimit())
		}
		return r.Wrap(inner, cr.DefaultLimit(), cr.FallbackShare)
	}
	d.log.Info("global rules enabled", slog.String("region", g.Region), slog.Any("regions", g.Regions), slog.Any("global", g.Redis), slog.Bool("tls", g.TLS))
	return nil
}
