//go:build !linux

package redisx

import (
	"net"
	"syscall"
)

// peekSupported says whether socket.open works here: not on this
// system, so single calls always go through the pipeline.
const peekSupported = false

// socket would be the socket of a direct connection.
type socket struct{}

func newSocket(net.Conn) (*socket, error) { return nil, syscall.ENOTSUP }

func (*socket) open() bool { return false }
