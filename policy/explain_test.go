package policy

import (
	"context"
	"testing"
	"time"

	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/memstore"
)

func TestExplainConsumesNothing(t *testing.T) {
	cfg, err := config.Parse([]byte(`
deny = ["ip=10.*"]
[[rule]]
name = "per-key"
by = ["api_key"]
limit = 3
period = "1m"
tiers = { pro = 10 }
[[rule]]
name = "per-ip"
match = { endpoint = "/v1/*" }
by = ["ip"]
algorithm = "fixed_window"
limit = 5
period = "1m"
mode = "strict"
[[rule]]
name = "other"
match = { endpoint = "/v2/*" }
by = ["api_key"]
limit = 1
period = "1s"
`), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, memstore.New(memstore.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), time.Unix(1000, 0)
	descs := []descriptor.Descriptor{
		{Name: []byte("api_key"), Value: []byte("k1")},
		{Name: []byte("tier"), Value: []byte("pro")},
		{Name: []byte("endpoint"), Value: []byte("/v1/x")},
	}
	p.Check(ctx, &Request{Now: now, Descs: descs, Cost: 2}, nil) // per-key: 8 of 10 left
	for range 3 {
		e := p.Explain(ctx, &Request{Now: now, Descs: descs, Cost: 1})
		if e.List != "" || len(e.Rules) != 2 {
			t.Fatalf("explain = %+v", e)
		}
		k, ip := e.Rules[0], e.Rules[1]
		if k.Rule != "per-key" || k.Key != "api_key=k1" || k.Tier != "pro" || k.Params.Limit != 10 || k.Result.Remaining != 7 || !k.Result.Allowed {
			t.Fatalf("per-key = %+v", k)
		}
		if ip.Rule != "per-ip" || ip.Missing != "ip" || ip.Key != "" || ip.Mode != config.ModeStrict {
			t.Fatalf("per-ip = %+v", ip)
		}
	}
	// The check after the explains finds what the first check left.
	if d := p.Check(ctx, &Request{Now: now, Descs: descs, Cost: 1}, nil); d.Result.Remaining != 7 {
		t.Fatalf("after explain: remaining %d, want 7", d.Result.Remaining)
	}
	if e := p.Explain(ctx, &Request{Now: now, Descs: []descriptor.Descriptor{{Name: []byte("ip"), Value: []byte("10.1.1.1")}}, Cost: 1}); e.List != RuleDeny || len(e.Rules) != 1 || e.Rules[0].Missing != "api_key" {
		t.Fatalf("deny-listed: %+v", e)
	}
	text, ok := p.AppendKeyText(nil, "per-key", descs)
	if !ok || string(text) != "api_key=k1" {
		t.Fatalf("AppendKeyText = %q, %v", text, ok)
	}
	if _, ok := p.AppendKeyText(nil, "nope", descs); ok {
		t.Fatal("AppendKeyText of an unknown rule reports ok")
	}
}
