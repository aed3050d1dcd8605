package decisions

import (
	"bytes"
	"testing"
	"time"

	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/topk"
)

// TestSamplingRates feeds the observer many decisions and checks that
// the lines written follow the configured rates, within generous bounds,
// and that a rate of 0 writes none.
func TestSamplingRates(t *testing.T) {
	cfg, err := config.Parse([]byte("[[rule]]\nname = \"r\"\nby = [\"k\"]\nlimit = 1\nperiod = \"1h\"\n"), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.New(cfg, memstore.New(memstore.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	o := &Observer{id: "test", out: &out, deniedThresh: threshold(0.01), allowedThresh: threshold(0)}
	o.tops.Store(&map[string]*topk.Sketch{})
	descs := []descriptor.Descriptor{{Name: []byte("k"), Value: []byte("v")}}
	denied := policy.Decision{Status: policy.StatusLimited, Rule: "r"}
	allowed := policy.Decision{Status: policy.StatusAllowed, Rule: "r"}
	var sc Scratch
	now := time.Now()
	const n = 100_000
	for range n {
		o.Observe(p, &denied, descs, now, &sc)
		o.Observe(p, &allowed, descs, now, &sc)
	}
	lines := bytes.Count(out.Bytes(), []byte("\n"))
	if lines < n/100/2 || lines > n/100*2 {
		t.Fatalf("%d lines for %d denials at rate 0.01", lines, n)
	}
	if bytes.Contains(out.Bytes(), []byte(`"decision":"allowed"`)) {
		t.Fatal("allowed_rate 0 wrote an allowed answer")
	}
	top, total := (*o.tops.Load())["r"].Top(1)
	if total != n || top[0].Key != "k=v" || top[0].Count != n {
		t.Fatalf("sketch: %+v of %d", top, total)
	}
}
