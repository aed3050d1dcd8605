package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"reflect"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/config"
)

// loadedConfig describes the configuration file in force.
type loadedConfig struct {
	hash string // ConfigHash of its bytes
	path string
	at   time.Time
}

// ConfigHash returns what /healthz, rld_config_info and `rld admin config`
// show of a configuration file: the first 16 hex digits of the SHA-256 of
// its bytes.
func ConfigHash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

var configLoadedAt = metrics.NewGauge(`rld_config_last_load_timestamp_seconds`, nil)

// newLoaded describes data, read from the configuration file now.
func (d *Daemon) newLoaded(data []byte) *loadedConfig {
	return &loadedConfig{hash: ConfigHash(data), path: d.opts.ConfigPath, at: time.Now()}
}

// announceLoaded tells the metrics and the decision log that lc, put in
// force, is the configuration. The caller holds reloadMu, or is New. The
// rld_config_info{hash="…"} series of the previous load is unregistered;
// the metrics are the process's, so with several daemons in one process
// (tests) a daemon unregisters only the series of its own last load.
func (d *Daemon) announceLoaded(lc *loadedConfig) {
	if d.ops.infoSeries != "" {
		metrics.UnregisterMetric(d.ops.infoSeries)
	}
	d.ops.infoSeries = `rld_config_info{hash="` + lc.hash + `"}`
	metrics.GetOrCreateGauge(d.ops.infoSeries, nil).Set(1)
	configLoadedAt.Set(float64(lc.at.UnixMilli()) / 1000)
	lastReloadOK.Set(1)
	if d.ops.obs != nil {
		d.ops.obs.WriteConfig(lc.hash, lc.path, len(d.cfg().Rules))
	}
}

// loaded returns the configuration file in force.
func (d *Daemon) loaded() *loadedConfig { return d.live.Load().file }

// pollConfig hashes the configuration file every interval and reloads it
// when its content differs from the one in force, until ctx is done. A
// new content is loaded once two polls in a row read it, so that a file
// caught while an editor or a deploy tool is still writing it is not
// loaded half-written (a valid prefix of the file would otherwise be put
// in force for one interval). A content that failed to load, here or by
// SIGHUP, is not tried again by the poll until it changes: the log says
// so once, not at every poll (a SIGHUP tries it again: a file it names,
// such as admin.token_file, may have been fixed). A file put back to the
// content in force clears the failure (rld_config_last_reload_successful
// is 1 again).
func (d *Daemon) pollConfig(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	readFailed, seen := false, ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.pollConfigOnce(&readFailed, &seen)
		d.configPolls.Add(1)
	}
}

// pollConfigOnce is one poll of pollConfig; readFailed and seen are its
// state across polls.
func (d *Daemon) pollConfigOnce(readFailed *bool, seen *string) {
	data, err := os.ReadFile(d.opts.ConfigPath)
	if err != nil {
		if !*readFailed {
			d.log.Warn("config poll: cannot read the file; keeping the rules in force", slog.String("path", d.opts.ConfigPath), slog.Any("error", err))
			*readFailed = true
		}
		return
	}
	*readFailed = false
	h := ConfigHash(data)
	if h == d.loaded().hash {
		*seen = ""
		d.reloadMu.Lock()
		// Read again under the lock: a reload (SIGHUP) of another
		// content may have failed since the read above.
		if now, err := os.ReadFile(d.opts.ConfigPath); err == nil && ConfigHash(now) == d.loaded().hash {
			d.inForceAgainLocked()
		}
		d.reloadMu.Unlock()
		return
	}
	d.reloadMu.Lock()
	failed := d.failedConfig
	d.reloadMu.Unlock()
	if h == failed {
		*seen = ""
		return
	}
	if h != *seen {
		*seen = h // changed since the last poll: read it again next time
		return
	}
	*seen = ""
	d.log.Info("config file changed; reloading", slog.String("path", d.opts.ConfigPath), slog.String("hash", h))
	_ = d.Reload() // a failure is logged, counted and recorded by Reload
}

// inForceAgainLocked records, with reloadMu held, that the file holds the
// configuration in force again: a reload that failed since no longer
// stands.
func (d *Daemon) inForceAgainLocked() {
	if d.failedConfig == "" {
		return
	}
	d.failedConfig = ""
	lastReloadOK.Set(1)
	d.log.Info("config file is back to the configuration in force", slog.String("path", d.opts.ConfigPath))
}

// keepOpsSettings keeps old's [admin] and [log] tables, and the poll
// interval, in cfg, a reload's new configuration: they take effect on
// restart, as [server] does.
func keepOpsSettings(log *slog.Logger, old, cfg *config.Config) {
	if !reflect.DeepEqual(old.Admin, cfg.Admin) {
		log.Warn("[admin] settings changed; they take effect on restart")
		cfg.Admin = old.Admin
	}
	if old.Log != cfg.Log {
		log.Warn("[log] settings changed; they take effect on restart")
		cfg.Log = old.Log
	}
}
