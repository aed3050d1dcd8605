package daemon_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/policy"
)

// jsonFields returns the JSON names of t's fields, embedded ones
// flattened.
func jsonFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case f.Anonymous && name == "":
			for n := range jsonFields(f.Type) {
				out[n] = true
			}
		case name == "":
			out[f.Name] = true
		default:
			out[name] = true
		}
	}
	return out
}

// TestEntriesMirrorPolicy: the admin API's entries carry every field of
// the policy's overrides and blocks, under the same JSON names, so that
// a field added to one is not forgotten in the other. (The admin types
// are kept apart from policy's so that the admin package, which the CLI
// and Go tools use to call a daemon, does not depend on the daemon's
// stores; its Period is a duration's text, policy's the nanoseconds it
// stores.)
func TestEntriesMirrorPolicy(t *testing.T) {
	for _, tc := range []struct{ admin, policy reflect.Type }{
		{reflect.TypeFor[admin.OverrideEntry](), reflect.TypeFor[policy.Override]()},
		{reflect.TypeFor[admin.BlockEntry](), reflect.TypeFor[policy.Block]()},
	} {
		have := jsonFields(tc.admin)
		for name := range jsonFields(tc.policy) {
			if !have[name] {
				t.Errorf("%v has no field %q of %v", tc.admin, name, tc.policy)
			}
		}
	}
}
