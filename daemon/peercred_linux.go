package daemon

import (
	"fmt"
	"net"
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
