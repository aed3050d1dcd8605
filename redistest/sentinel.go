package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

const (
	sentinelCount  = 3
	sentinelQuorum = 2
	// masterSet is the name the sentinels monitor the primary under.
	masterSet = "mymaster"
)

// Sentinel is a running Redis Sentinel group: one primary, one replica and
// three sentinels monitoring the primary with quorum 2, set up to fail over
// in about 2 s. Primary and Replica report the roles as of start-up or the
// last WaitFailover. Its methods are safe for concurrent use.
type Sentinel struct {
	// MasterSet is the name the sentinels monitor the primary under, the
	// MasterSet of a Sentinel client.
	MasterSet string

	sentinels []*Server
	tls       *tlsFiles // with SentinelTLS

	// CAFile is the PEM file of the CA that signed the servers' and the
	// sentinels' certificates, with SentinelTLS; else "".
	CAFile string

	mu      sync.Mutex
	primary *Server // guarded by mu
	replica *Server // guarded by mu
}

// SentinelOption changes how StartSentinel starts a group.
type SentinelOption func(*Sentinel)

// SentinelTLS starts the servers and the sentinels with TLS as well, as
// StandaloneTLS does (each one's TLS port in its TLSAddr, the CA in
// Sentinel.CAFile): the replica replicates over TLS, and the sentinels
// monitor the servers, announce themselves and report the primary on
// their TLS ports. The plain ports stay open, for the test's own reads.
func SentinelTLS() SentinelOption {
	return func(g *Sentinel) { g.tls = &tlsFiles{} }
}

// StartSentinel starts a primary, a replica of it and three sentinels, and
// waits until the replica is in sync and every sentinel reports the
// primary as master and knows the replica and the other two sentinels.
// The processes are killed when t ends.
func StartSentinel(t testing.TB, opts ...SentinelOption) *Sentinel {
	t.Helper()
	g := &Sentinel{MasterSet: masterSet}
	for _, o := range opts {
		o(g)
	}
	offset := 0
	if g.tls != nil {
		*g.tls, offset = writeTLSFiles(t), 1 // the TLS port is the next one
		g.CAFile = g.tls.ca
	}
	g.primary, g.replica = &Server{Dir: t.TempDir()}, &Server{Dir: t.TempDir()}
	t.Cleanup(g.primary.Kill)
	t.Cleanup(g.replica.Kill)
	dataArgs := func(s *Server, extra ...string) func(int) ([]string, error) {
		return func(port int) ([]string, error) {
			return append(append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
				"--save", "", "--appendonly", "no", "--dir", s.Dir,
				"--repl-diskless-sync-delay", "0"}, g.tlsArgs(port)...), extra...), nil
		}
	}
	if err := g.primary.spawn(dataArgs(g.primary), offset); err != nil {
		t.Fatalf("redistest: sentinel primary: %v", err)
	}
	g.setTLSAddr(g.primary)
	err := g.replica.spawn(dataArgs(g.replica, "--replicaof", "127.0.0.1", strconv.Itoa(g.port(g.primary))), offset)
	g.setTLSAddr(g.replica)
	if err != nil {
		t.Fatalf("redistest: sentinel replica: %v", err)
	}
	// Sentinels learn of replicas from the primary's INFO, which they ask
	// for every 10 s once started: the replica must be connected first.
	poll(t, "the replica to sync", g.checkReplication, g.primary, g.replica)

	for range sentinelCount {
		s := &Server{Dir: t.TempDir()}
		t.Cleanup(s.Kill)
		g.sentinels = append(g.sentinels, s)
	}
	errs := make([]error, sentinelCount)
	var wg sync.WaitGroup
	for i, s := range g.sentinels {
		wg.Go(func() { errs[i] = s.spawn(g.sentinelArgs(s), offset) })
	}
	wg.Wait()
	for _, s := range g.sentinels {
		g.setTLSAddr(s)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("redistest: sentinel: %v", err)
	}
	poll(t, "the sentinels to be ready", g.checkSentinels, append([]*Server{g.primary, g.replica}, g.sentinels...)...)
	return g
}

// sentinelArgs writes s's sentinel.conf (which Sentinel rewrites, so it
// lives in s's Dir) for a given port and returns the arguments that start
// a sentinel on it.
func (g *Sentinel) sentinelArgs(s *Server) func(int) ([]string, error) {
	return func(port int) ([]string, error) {
		conf := filepath.Join(s.Dir, "sentinel.conf")
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
sentinel monitor %s 127.0.0.1 %d %d
sentinel down-after-milliseconds %[3]s 1000
sentinel failover-timeout %[3]s 3000
sentinel parallel-syncs %[3]s 1
`, port, s.Dir, g.MasterSet, g.port(g.primary), sentinelQuorum)
		if g.tls != nil {
			a := g.tlsArgs(port)
			for i := 0; i < len(a); i += 2 {
				text += a[i][2:] + " " + a[i+1] + "\n"
			}
		}
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return nil, err
		}
		return []string{conf, "--sentinel"}, nil
	}
}

// checkReplication returns nil when the replica is in sync with the
// primary.
func (g *Sentinel) checkReplication() error {
	info, err := call(g.primary.Addr, pollTimeout, "INFO", "replication")
	if err != nil {
		return fmt.Errorf("primary %s: INFO replication: %w", g.primary.Addr, err)
	}
	if n := infoField(text(info), "connected_slaves"); n != "1" {
		return fmt.Errorf("primary %s: connected_slaves:%s", g.primary.Addr, n)
	}
	info, err = call(g.replica.Addr, pollTimeout, "INFO", "replication")
	if err != nil {
		return fmt.Errorf("replica %s: INFO replication: %w", g.replica.Addr, err)
	}
	if link := infoField(text(info), "master_link_status"); link != "up" {
		return fmt.Errorf("replica %s: master_link_status:%s", g.replica.Addr, link)
	}
	return nil
}

// checkSentinels returns nil when every sentinel reports the primary as
// master and knows the replica and the other sentinels, which a failover
// needs.
func (g *Sentinel) checkSentinels() error {
	for _, s := range g.sentinels {
		if err := g.checkMaster(s, g.primary); err != nil {
			return err
		}
		reply, err := call(s.Addr, pollTimeout, "SENTINEL", "MASTER", g.MasterSet)
		if err != nil {
			return fmt.Errorf("sentinel %s: SENTINEL MASTER: %w", s.Addr, err)
		}
		f, err := fields(reply)
		if err != nil {
			return fmt.Errorf("sentinel %s: SENTINEL MASTER: %w", s.Addr, err)
		}
		for k, want := range map[string]string{
			"flags":               "master",
			"num-slaves":          "1",
			"num-other-sentinels": strconv.Itoa(sentinelCount - 1),
		} {
			if got := text(f[k]); got != want {
				return fmt.Errorf("sentinel %s: %s is %q, want %q", s.Addr, k, got, want)
			}
		}
	}
	return g.checkReplication()
}

// checkMaster returns nil when sentinel s reports want as the master.
func (g *Sentinel) checkMaster(s, want *Server) error {
	reply, err := call(s.Addr, pollTimeout, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", g.MasterSet)
	if err != nil {
		return fmt.Errorf("sentinel %s: SENTINEL GET-MASTER-ADDR-BY-NAME: %w", s.Addr, err)
	}
	a, ok := reply.([]any)
	if !ok || len(a) != 2 {
		return fmt.Errorf("sentinel %s: master address reply %v", s.Addr, reply)
	}
	if got := net.JoinHostPort(text(a[0]), text(a[1])); got != g.addr(want) {
		return fmt.Errorf("sentinel %s reports master %s, want %s", s.Addr, got, g.addr(want))
	}
	return nil
}

// tlsArgs are the arguments that serve TLS on the port after port, and
// replicate and monitor over TLS, with SentinelTLS; else none.
func (g *Sentinel) tlsArgs(port int) []string {
	if g.tls == nil {
		return nil
	}
	return append(g.tls.args(port+1), "--tls-replication", "yes")
}

// setTLSAddr sets s's TLSAddr, with SentinelTLS.
func (g *Sentinel) setTLSAddr(s *Server) {
	if g.tls != nil && s.Port != 0 {
		s.TLSAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port+1))
	}
}

// addr is the address s is known by to the sentinels and their clients:
// its TLS address with SentinelTLS.
func (g *Sentinel) addr(s *Server) string {
	if g.tls != nil {
		return s.TLSAddr
	}
	return s.Addr
}

// port is the port of addr(s).
func (g *Sentinel) port(s *Server) int {
	if g.tls != nil {
		return s.Port + 1
	}
	return s.Port
}

// WaitFailover waits until every running sentinel reports the replica as
// master and the replica reports role:master, then swaps Primary and
// Replica, and returns the new primary. The test kills or pauses the
// primary first.
func (g *Sentinel) WaitFailover(t testing.TB) *Server {
	t.Helper()
	g.mu.Lock()
	former, promoted := g.primary, g.replica
	g.mu.Unlock()
	poll(t, "the sentinels to promote "+promoted.Addr, func() error {
		for _, s := range g.sentinels {
			if !s.running() {
				continue
			}
			if err := g.checkMaster(s, promoted); err != nil {
				return err
			}
		}
		info, err := call(promoted.Addr, pollTimeout, "INFO", "replication")
		if err != nil {
			return fmt.Errorf("%s: INFO replication: %w", promoted.Addr, err)
		}
		if role := infoField(text(info), "role"); role != "master" {
			return fmt.Errorf("%s: role:%s", promoted.Addr, role)
		}
		return nil
	}, append([]*Server{former, promoted}, g.sentinels...)...)
	g.mu.Lock()
	g.primary, g.replica = promoted, former
	g.mu.Unlock()
	return promoted
}

// SentinelAddrs returns the sentinels' addresses, the InitAddress of a
// Sentinel client (their TLS addresses with SentinelTLS).
func (g *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(g.sentinels))
	for i, s := range g.sentinels {
		addrs[i] = g.addr(s)
	}
	return addrs
}

// Sentinels returns the sentinel processes.
func (g *Sentinel) Sentinels() []*Server { return append([]*Server(nil), g.sentinels...) }

// Primary returns the primary.
func (g *Sentinel) Primary() *Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.primary
}

// Replica returns the replica.
func (g *Sentinel) Replica() *Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.replica
}
