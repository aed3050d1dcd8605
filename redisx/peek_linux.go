package redisx

import (
	"net"
	"syscall"
)

// peekSupported says whether socket.open works here: the direct path
// (see directBusy) is used only where it does.
const peekSupported = true

// socket is the socket of a direct connection, to peek at.
type socket struct {
	raw  syscall.RawConn
	buf  [1]byte
	ok   bool
	peek func(fd uintptr) bool // s.peekFD, made once: no allocation per call
}

func newSocket(c net.Conn) (*socket, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, errNotSocket
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	s := &socket{raw: raw}
	s.peek = s.peekFD
	return s, nil
}

// open reports whether the connection is open as far as this host knows
// and idle: no end of stream or reset has arrived, and no byte waits to
// be read. It does not block. Not safe for concurrent use.
func (s *socket) open() bool {
	s.ok = false
	if err := s.raw.Read(s.peek); err != nil {
		return false
	}
	return s.ok
}

func (s *socket) peekFD(fd uintptr) bool {
	_, _, err := syscall.Recvfrom(int(fd), s.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	s.ok = err == syscall.EAGAIN
	return true // done: never wait
}
