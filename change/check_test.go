package change_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rld/rld/change"
)

// TestOverrideCheck: each thing wrong with an override that needs no rule
// to see is refused with a message that names it; good ones pass.
func TestOverrideCheck(t *testing.T) {
	key := map[string]string{"api_key": "k"}
	for _, ok := range []change.Override{
		{Rule: "r", Key: key, Limit: 5},
		{Rule: "r", Key: key, Limit: 5, Period: time.Minute, Burst: 10},
		{Rule: "r", Match: map[string]string{"tier": "pro*"}, Multiplier: 2.5},
	} {
		if err := ok.Check(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	for _, c := range []struct {
		o    change.Override
		want string
	}{
		{change.Override{Key: key, Limit: 5, Multiplier: 2}, "not both"},
		{change.Override{Key: key}, "give a limit (absolute) or a multiplier"},
		{change.Override{Key: key, Limit: -1}, "limit = -1: must be positive"},
		{change.Override{Key: key, Multiplier: -1}, "multiplier = -1: must be positive"},
		{change.Override{Key: key, Multiplier: math.NaN()}, "must be positive"},
		{change.Override{Key: key, Multiplier: math.Inf(1)}, "must be positive"},
		{change.Override{Key: key, Multiplier: 2, Burst: 3}, "period and burst go with an absolute limit"},
		{change.Override{Key: key, Limit: 5, Period: -time.Second}, "must not be negative"},
		{change.Override{Key: key, Limit: 5, Reason: strings.Repeat("x", change.MaxReason+1)}, "reason: 513 bytes, at most 512"},
		{change.Override{Key: key, Limit: 5, Author: strings.Repeat("x", change.MaxAuthor+1)}, "author: 129 bytes"},
		{change.Override{Key: map[string]string{"k": strings.Repeat("v", change.MaxPairsBytes)}, Limit: 5}, "key: 2049 bytes of names and values"},
	} {
		err := c.o.Check()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error containing %q", c.o, err, c.want)
		}
	}
}

// TestBlockCheck: the same for blocks.
func TestBlockCheck(t *testing.T) {
	for _, ok := range []change.Block{
		{Match: map[string]string{"ip": "10.*"}},
		{Rule: "r", Key: map[string]string{"api_key": "k"}},
	} {
		if err := ok.Check(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	for _, c := range []struct {
		b    change.Block
		want string
	}{
		{change.Block{}, "give match globs, or a rule and its key"},
		{change.Block{Match: map[string]string{"ip": "1"}, Key: map[string]string{"ip": "1"}}, "a key needs its rule"},
		{change.Block{Rule: "r"}, "takes its key"},
		{change.Block{Rule: "r", Key: map[string]string{"ip": "1"}, Match: map[string]string{"ip": "1"}}, "takes its key"},
		{change.Block{Match: map[string]string{"ip": strings.Repeat("1", change.MaxPairsBytes)}}, "match: 2050 bytes"},
		{change.Block{Match: map[string]string{"ip": "1"}, Reason: strings.Repeat("x", 600)}, "reason: 600 bytes"},
	} {
		err := c.b.Check()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error containing %q", c.b, err, c.want)
		}
	}
}
