package daemon_test

import (
	"testing"

	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/wire"
)

// TestFrameLimitsAgree checks that the protocol's limits (package wire,
// which depends on nothing of rld's) are the ones that policy, config and
// package descriptor hold requests to: a frame the daemon decodes never
// carries what they refuse, and they never produce what a frame cannot
// carry.
func TestFrameLimitsAgree(t *testing.T) {
	for _, c := range []struct {
		name       string
		wire, ours int
	}{
		{"descriptor.MaxDescriptors", wire.MaxDescriptors, descriptor.MaxDescriptors},
		{"descriptor.MaxNameLen", wire.MaxNameLen, descriptor.MaxNameLen},
		{"descriptor.MaxValueLen", wire.MaxValueLen, descriptor.MaxValueLen},
		{"policy.MaxLeaseLen (wire.MaxTokenLen)", wire.MaxTokenLen, policy.MaxLeaseLen},
		{"config.MaxRuleName (wire.MaxRuleLen)", wire.MaxRuleLen, config.MaxRuleName},
	} {
		if c.wire != c.ours {
			t.Errorf("%s = %d, but the protocol's is %d", c.name, c.ours, c.wire)
		}
	}
}
