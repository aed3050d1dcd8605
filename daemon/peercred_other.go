//go:build !linux

package daemon

import (
	"errors"
	"net"
)

// peerUID is unknown off Linux: admin frames are refused there.
func peerUID(*net.UnixConn) (int, error) {
	return -1, errors.New("peer credentials are read on Linux only")
}

// unmappedUIDs is nil off Linux: there are no user namespaces to check.
func unmappedUIDs([]int) []int { return nil }
