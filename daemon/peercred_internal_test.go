//go:build linux

package daemon

import (
	"slices"
	"testing"
)

// TestUnmappedUIDs: a uid outside every range of a uid_map is reported;
// this process's own map (no user namespace here, or one mapping them)
// maps root.
func TestUnmappedUIDs(t *testing.T) {
	for _, c := range []struct {
		uidMap string
		uids   []int
		want   []int
	}{
		{"         0          0 4294967295\n", []int{0, 1000, 65534}, nil},
		// systemd's PrivateUsers=yes for User=rld (uid 998): root and rld.
		{"         0          0          1\n       998        998          1\n", []int{0, 998, 1000}, []int{1000}},
		// unshare --user --map-root-user, run by uid 1000.
		{"         0       1000          1\n", []int{0, 1000}, []int{1000}},
		{"", []int{0}, []int{0}},
	} {
		if got := unmappedIn(c.uids, c.uidMap); !slices.Equal(got, c.want) {
			t.Errorf("unmappedIn(%v, %q) = %v, want %v", c.uids, c.uidMap, got, c.want)
		}
	}
	if got := unmappedUIDs([]int{0}); len(got) != 0 {
		t.Errorf("this process's user namespace does not map root: %v", got)
	}
}
