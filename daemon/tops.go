package daemon

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redisx"
)

// Each daemon on Redis publishes its heavy hitters every topEvery; top
// merges the reports not older than topTTL.
const (
	topEvery = 2 * time.Second
	topTTL   = 10 * time.Second
)

var topPublishErrors = metrics.NewCounter(`rld_top_publish_errors_total`)

// topReport is what a daemon publishes: its denials of each rule that
// denied, TopKeys keys each.
type topReport struct {
	Rules []admin.RuleTop `json:"rules"`
}

// report returns the observer's denials of each rule that denied, at
// most n keys each.
func (o *observer) report(n int) topReport {
	tops := *o.tops.Load()
	r := topReport{Rules: make([]admin.RuleTop, 0, len(tops))}
	for name, s := range tops {
		entries, total := s.Top(n)
		rt := admin.RuleTop{Rule: name, Denied: total, Keys: make([]admin.KeyCount, 0, len(entries))}
		for _, e := range entries {
			rt.Keys = append(rt.Keys, admin.KeyCount{Key: e.Key, Count: e.Count, Error: e.Error})
		}
		r.Rules = append(r.Rules, rt)
	}
	return r
}

// publishTops publishes this daemon's report every topEvery until ctx is
// done; a failure is counted, logged once per run of failures, and the
// next tick tries again.
func (d *Daemon) publishTops(ctx context.Context, tops *redisx.Tops) {
	t := time.NewTicker(topEvery)
	defer t.Stop()
	failing := false
	for {
		b, _ := json.Marshal(d.ops.obs.report(TopKeys))
		pctx, cancel := context.WithTimeout(ctx, syncTimeout)
		err := tops.Publish(pctx, d.ops.obs.id, string(b), topTTL)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			topPublishErrors.Inc()
			if !failing {
				d.log.Warn("top: cannot publish this daemon's denials; the fleet's top lacks them meanwhile", slog.Any("error", err))
			}
			failing = true
		case err == nil:
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// fleetTop answers top for the fleet: this daemon's denials now, merged
// with the reports the others published. Without Redis, or when asked,
// it is this daemon's alone; when Redis fails, too, with a warning.
func (s adminService) fleetTop(ctx context.Context, a admin.TopArgs) (admin.TopResult, error) {
	d := s.d
	p := d.pol()
	self := admin.DaemonSeen{Daemon: d.ops.obs.id, Self: true}
	if a.Local || d.tops == nil {
		res, err := d.ops.obs.top(p, a)
		res.Daemons = []admin.DaemonSeen{self}
		return res, err
	}
	rctx, cancel := context.WithTimeout(ctx, syncTimeout)
	reps, err := d.tops.Reports(rctx, topTTL)
	cancel()
	if err != nil {
		res, terr := d.ops.obs.top(p, a)
		res.Daemons = []admin.DaemonSeen{self}
		res.Warning = "this daemon's denials only: cannot read the fleet's from redis: " + err.Error()
		return res, terr
	}
	m := newTopMerge()
	m.add(self.Daemon, d.ops.obs.report(TopKeys))
	seen := []admin.DaemonSeen{self}
	for _, r := range reps {
		if r.Daemon == self.Daemon {
			continue
		}
		var rep topReport
		if err := json.Unmarshal([]byte(r.Value), &rep); err != nil {
			d.log.Warn("top: a daemon's report is unreadable; skipped", slog.String("daemon", r.Daemon), slog.Any("error", err))
			continue
		}
		m.add(r.Daemon, rep)
		seen = append(seen, admin.DaemonSeen{Daemon: r.Daemon, AgeMs: r.Age.Milliseconds()})
	}
	res, err := m.result(p, a)
	res.Daemons, res.Fleet = seen, true
	return res, err
}

// topMerge sums the reports of several daemons, rule by rule and key by
// key.
type topMerge struct {
	rules map[string]*mergedRule
}

type mergedRule struct {
	denied uint64
	keys   map[string]*admin.KeyCount
}

func newTopMerge() *topMerge { return &topMerge{rules: map[string]*mergedRule{}} }

// add adds daemon's report.
func (m *topMerge) add(daemon string, r topReport) {
	for _, rt := range r.Rules {
		mr := m.rules[rt.Rule]
		if mr == nil {
			mr = &mergedRule{keys: map[string]*admin.KeyCount{}}
			m.rules[rt.Rule] = mr
		}
		mr.denied += rt.Denied
		for _, k := range rt.Keys {
			kc := mr.keys[k.Key]
			if kc == nil {
				kc = &admin.KeyCount{Key: k.Key}
				mr.keys[k.Key] = kc
			}
			kc.Count += k.Count
			kc.Error += k.Error
			kc.By = append(kc.By, admin.DaemonCount{Daemon: daemon, Count: k.Count})
		}
	}
}

// result lists the merged denials as top answers them: the rules of p in
// order (then those only the reports name), each with its N most denied
// keys, each key with the daemons that denied it.
func (m *topMerge) result(p *policy.Policy, a admin.TopArgs) (admin.TopResult, error) {
	res := admin.TopResult{Rules: []admin.RuleTop{}}
	var names []string
	known := map[string]bool{}
	for _, r := range p.Rules() {
		names = append(names, r.Name)
		known[r.Name] = true
	}
	var extra []string
	for name := range m.rules {
		if !known[name] {
			extra = append(extra, name)
		}
	}
	slices.Sort(extra)
	names = append(names, extra...)
	if a.Rule != "" && !known[a.Rule] && m.rules[a.Rule] == nil {
		return res, admin.Errorf(admin.CodeNotFound, "no rule %q", a.Rule)
	}
	for _, name := range names {
		if a.Rule != "" && name != a.Rule {
			continue
		}
		rt := admin.RuleTop{Rule: name, Keys: []admin.KeyCount{}}
		if mr := m.rules[name]; mr != nil {
			rt.Denied = mr.denied
			for _, kc := range mr.keys {
				slices.SortFunc(kc.By, func(x, y admin.DaemonCount) int {
					return cmp.Or(cmp.Compare(y.Count, x.Count), cmp.Compare(x.Daemon, y.Daemon))
				})
				rt.Keys = append(rt.Keys, *kc)
			}
			slices.SortFunc(rt.Keys, func(x, y admin.KeyCount) int {
				return cmp.Or(cmp.Compare(y.Count, x.Count), cmp.Compare(x.Key, y.Key))
			})
			if a.N > 0 && len(rt.Keys) > a.N {
				rt.Keys = rt.Keys[:a.N]
			}
		}
		if a.Rule != "" || rt.Denied > 0 {
			res.Rules = append(res.Rules, rt)
		}
	}
	return res, nil
}
