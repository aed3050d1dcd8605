package daemon

import (
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
)

// peerUID returns the uid of the process at the other end of c
// (SO_PEERCRED: the credentials it had when it connected).
func peerUID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("cannot read peer credentials: %w", err)
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return -1, fmt.Errorf("cannot read peer credentials: %w", err)
	}
	if serr != nil {
		return -1, fmt.Errorf("cannot read peer credentials: %w", serr)
	}
	return int(cred.Uid), nil
}

// unmappedUIDs returns the uids of uids that this process's user namespace
// does not map (/proc/self/uid_map): a peer with such a uid is seen as the
// overflow uid (65534), as under systemd's PrivateUsers=yes. It returns
// nil when the map cannot be read.
func unmappedUIDs(uids []int) []int {
	m, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return nil
	}
	return unmappedIn(uids, string(m))
}

// unmappedIn returns the uids of uids outside every range of uidMap, the
// text of a uid_map: lines of "inside outside count".
func unmappedIn(uids []int, uidMap string) []int {
	var out []int
	for _, u := range uids {
		mapped := false
		for _, line := range strings.Split(uidMap, "\n") {
			var inside, outside, count int64
			if n, _ := fmt.Sscan(line, &inside, &outside, &count); n == 3 && int64(u) >= inside && int64(u)-inside < count {
				mapped = true
				break
			}
		}
		if !mapped {
			out = append(out, u)
		}
	}
	return out
}
