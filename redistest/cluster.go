package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/rld/rld/redisx/keyslot"
)

const (
	clusterPrimaries = 3
	clusterReplicas  = 1 // per primary
	// clusterBusOffset is where a node's cluster bus port is, from its port.
	clusterBusOffset = 10000
	// clusterNodeTimeout, in milliseconds, makes a failover take 2–3 s.
	clusterNodeTimeout = "1000"
)

// Role is what a Cluster node is, as the cluster sees it.
type Role string

// The roles of a Cluster node.
const (
	RolePrimary Role = "primary"
	RoleReplica Role = "replica"
	// RoleFailed is a node the cluster has marked FAIL, whatever it was.
	RoleFailed Role = "failed"
)

// ClusterNode is one node of a Cluster as the cluster saw it when it became
// ready or at the last WaitFailover.
type ClusterNode struct {
	*Server
	// ID is the node's Cluster ID.
	ID string
	// Role is the node's role.
	Role Role
	// Primary is the primary a replica replicates (or a failed replica
	// replicated); nil for a primary.
	Primary *Server
}

// ClusterOption changes how StartCluster starts a Cluster.
type ClusterOption func(*clusterConfig)

type clusterConfig struct {
	partialCoverage bool
	tls             bool
	tlsFiles        tlsFiles // set by StartCluster when tls
	extra           []string
}

// AllowPartialCoverage starts the nodes with
// --cluster-require-full-coverage no: while a shard is down only its slots
// fail, instead of the whole cluster answering CLUSTERDOWN.
func AllowPartialCoverage() ClusterOption {
	return func(c *clusterConfig) { c.partialCoverage = true }
}

// ClusterTLS starts the nodes with TLS as well, as StandaloneTLS does
// (each node's TLS port is in its TLSAddr, the CA in Cluster.CAFile),
// with the cluster bus and replication over TLS. The plain ports stay
// open, for the test's own reads; CLUSTER SHARDS names both ports.
func ClusterTLS() ClusterOption {
	return func(c *clusterConfig) { c.tls = true }
}

// NodeArgs adds redis-server arguments to every node.
func NodeArgs(args ...string) ClusterOption {
	return func(c *clusterConfig) { c.extra = append(c.extra, args...) }
}

// offsets are the ports a node needs beside its own, from its port: the
// bus port, and with TLS the TLS port.
func (c *clusterConfig) offsets() []int {
	if c.tls {
		return []int{clusterBusOffset, 1}
	}
	return []int{clusterBusOffset}
}

func (c *clusterConfig) nodeArgs(port int, dir string) []string {
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--cluster-enabled", "yes", "--cluster-node-timeout", clusterNodeTimeout,
		"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
		"--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"}
	if c.partialCoverage {
		args = append(args, "--cluster-require-full-coverage", "no")
	}
	if c.tls {
		// The bus port is set: by default it would be the TLS port's
		// +10000.
		args = append(append(args, c.tlsFiles.args(port+1)...), "--tls-cluster", "yes", "--tls-replication", "yes",
			"--cluster-port", strconv.Itoa(port+clusterBusOffset))
	}
	return append(args, c.extra...)
}

// Cluster is a running Redis Cluster of 3 primaries and 3 replicas. Its
// view of which node serves which slots is the one from when it became
// ready or from the last WaitFailover; it is not refreshed behind the
// test's back. Its methods are safe for concurrent use.
type Cluster struct {
	nodes  []*Server
	byPort map[int]*Server
	dir    string // holds the log of redis-cli --cluster create

	// CAFile is the PEM file of the CA that signed the nodes'
	// certificates, with ClusterTLS; else "".
	CAFile string

	mu   sync.Mutex
	topo *topology // guarded by mu
}

// StartCluster starts six cluster-enabled redis-server processes, joins
// them with redis-cli --cluster create into 3 primaries with one replica
// each, and waits until every node reports cluster_state:ok, all agree on
// which node serves which slots and every replica is in sync. The
// processes are killed when t ends.
func StartCluster(t testing.TB, opts ...ClusterOption) *Cluster {
	t.Helper()
	var cfg clusterConfig
	for _, o := range opts {
		o(&cfg)
	}
	c := &Cluster{dir: t.TempDir(), byPort: make(map[int]*Server)}
	if cfg.tls {
		cfg.tlsFiles = writeTLSFiles(t)
		c.CAFile = cfg.tlsFiles.ca
	}
	for range clusterPrimaries * (1 + clusterReplicas) {
		s := &Server{Dir: t.TempDir()}
		t.Cleanup(s.Kill)
		c.nodes = append(c.nodes, s)
	}
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, s := range c.nodes {
		wg.Go(func() {
			errs[i] = s.spawn(func(port int) ([]string, error) {
				return cfg.nodeArgs(port, s.Dir), nil
			}, cfg.offsets()...)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("redistest: cluster: %v", err)
	}
	for _, s := range c.nodes {
		c.byPort[s.Port] = s
		if cfg.tls {
			s.TLSAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port+1))
		}
	}
	c.create(t)
	poll(t, "the cluster to be ready", c.checkReady, c.nodes...)
	return c
}

// create runs redis-cli --cluster create on the nodes.
func (c *Cluster) create(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redistest: redis-cli not found in PATH: run `make deps` (it installs it with apt-get)")
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(clusterReplicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	logPath := filepath.Join(c.dir, "cluster-create.log")
	os.WriteFile(logPath, out, 0o644)
	if err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n--- %s, last lines:\n%s",
			strings.Join(args, " "), err, logPath, tail(string(out), tailLines))
	}
}

// checkReady returns nil when the cluster is ready, and sets its topology.
func (c *Cluster) checkReady() error {
	topo, err := c.agreed(c.nodes)
	if err != nil {
		return err
	}
	if n := len(topo.primaries()); n != clusterPrimaries {
		return fmt.Errorf("%d primaries serve slots, want %d", n, clusterPrimaries)
	}
	if slot := topo.uncovered(); slot >= 0 {
		return fmt.Errorf("slot %d is not served", slot)
	}
	replicas := make(map[*Server]int)
	for _, s := range c.nodes {
		st, ok := topo.nodes[s]
		switch {
		case !ok:
			return fmt.Errorf("node %s has not joined", s.Addr)
		case st.role == RoleFailed:
			return fmt.Errorf("node %s is marked failed", s.Addr)
		case st.role == RoleReplica:
			replicas[st.primary]++
			info, err := call(s.Addr, pollTimeout, "INFO", "replication")
			if err != nil {
				return fmt.Errorf("%s: INFO replication: %w", s.Addr, err)
			}
			if link := infoField(text(info), "master_link_status"); link != "up" {
				return fmt.Errorf("replica %s: master_link_status:%s", s.Addr, link)
			}
		}
	}
	for _, p := range topo.primaries() {
		if replicas[p] != clusterReplicas {
			return fmt.Errorf("primary %s has %d replicas, want %d", p.Addr, replicas[p], clusterReplicas)
		}
	}
	c.setTopo(topo)
	return nil
}

// agreed asks each of servers for CLUSTER INFO and CLUSTER SHARDS, and
// returns the topology when every one reports cluster_state:ok and all see
// the same one.
func (c *Cluster) agreed(servers []*Server) (*topology, error) {
	var first *topology
	var firstKey, firstAddr string
	for _, s := range servers {
		info, err := call(s.Addr, pollTimeout, "CLUSTER", "INFO")
		if err != nil {
			return nil, fmt.Errorf("%s: CLUSTER INFO: %w", s.Addr, err)
		}
		if state := infoField(text(info), "cluster_state"); state != "ok" {
			return nil, fmt.Errorf("%s: cluster_state:%s", s.Addr, state)
		}
		shards, err := call(s.Addr, pollTimeout, "CLUSTER", "SHARDS")
		if err != nil {
			return nil, fmt.Errorf("%s: CLUSTER SHARDS: %w", s.Addr, err)
		}
		topo, err := c.parseShards(shards)
		if err != nil {
			return nil, fmt.Errorf("%s: CLUSTER SHARDS: %w", s.Addr, err)
		}
		key := topo.String()
		if first == nil {
			first, firstKey, firstAddr = topo, key, s.Addr
		} else if key != firstKey {
			return nil, fmt.Errorf("nodes disagree: %s sees [%s], %s sees [%s]", firstAddr, firstKey, s.Addr, key)
		}
	}
	if first == nil {
		return nil, errors.New("no node is running")
	}
	return first, nil
}

// WaitFailover waits until a replica has taken over all the slots that
// killed served, and every other running node reports cluster_state:ok and
// agrees on the new topology. It returns the promoted replica. killed is a
// primary the test killed or paused.
func (c *Cluster) WaitFailover(t testing.TB, killed *Server) *Server {
	t.Helper()
	c.mu.Lock()
	var owned []slotRange
	for _, r := range c.topo.ranges {
		if r.primary == killed {
			owned = append(owned, r)
		}
	}
	c.mu.Unlock()
	if len(owned) == 0 {
		t.Fatalf("redistest: WaitFailover: %s served no slots; it takes a primary the test killed", killed.Addr)
	}
	var promoted *Server
	poll(t, "a replica to take over the slots of "+killed.Addr, func() error {
		var survivors []*Server
		for _, s := range c.nodes {
			if s != killed && s.running() {
				survivors = append(survivors, s)
			}
		}
		topo, err := c.agreed(survivors)
		if err != nil {
			return err
		}
		for _, r := range owned {
			for slot := r.first; slot <= r.last; slot++ {
				if p := topo.primaryFor(slot); p == nil || p == killed {
					return fmt.Errorf("slot %d is still served by %s", slot, addr(p))
				}
			}
		}
		promoted = topo.primaryFor(owned[0].first)
		c.setTopo(topo)
		return nil
	}, c.nodes...)
	return promoted
}

// Addrs returns the address of every node, in start order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr
	}
	return addrs
}

// TLSAddrs returns the TLS addresses of all six nodes (see ClusterTLS),
// in the order of Addrs.
func (c *Cluster) TLSAddrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.TLSAddr
	}
	return addrs
}

// Nodes returns every node with its role, in start order.
func (c *Cluster) Nodes() []ClusterNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	nodes := make([]ClusterNode, len(c.nodes))
	for i, s := range c.nodes {
		st := c.topo.nodes[s]
		nodes[i] = ClusterNode{Server: s, ID: st.id, Role: st.role, Primary: st.primary}
	}
	return nodes
}

// Primaries returns the primaries that serve slots, in slot order.
func (c *Cluster) Primaries() []*Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.topo.primaries()
}

// PrimaryFor returns the primary that serves key's slot.
func (c *Cluster) PrimaryFor(key string) *Server { return c.PrimaryForSlot(Slot(key)) }

// PrimaryForSlot returns the primary that serves slot, or nil when none
// does.
func (c *Cluster) PrimaryForSlot(slot int) *Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.topo.primaryFor(slot)
}

func (c *Cluster) setTopo(topo *topology) {
	c.mu.Lock()
	c.topo = topo
	c.mu.Unlock()
}

// topology is one node's view of the cluster.
type topology struct {
	ranges []slotRange // sorted by first slot
	nodes  map[*Server]nodeState
}

type slotRange struct {
	first, last int
	primary     *Server
}

type nodeState struct {
	id      string
	role    Role
	primary *Server
}

// parseShards decodes a CLUSTER SHARDS reply.
func (c *Cluster) parseShards(reply any) (*topology, error) {
	shards, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("want an array, got %T", reply)
	}
	topo := &topology{nodes: make(map[*Server]nodeState)}
	for _, sv := range shards {
		shard, err := fields(sv)
		if err != nil {
			return nil, err
		}
		nodes, _ := shard["nodes"].([]any)
		var primary *Server
		var members []*Server
		for _, nv := range nodes {
			f, err := fields(nv)
			if err != nil {
				return nil, err
			}
			port, err := integer(f["port"])
			if err != nil {
				return nil, fmt.Errorf("node port: %w", err)
			}
			s := c.byPort[port]
			if s == nil {
				return nil, fmt.Errorf("unknown node port %d", port)
			}
			id, _ := f["id"].(string)
			role, _ := f["role"].(string)
			health, _ := f["health"].(string)
			st := nodeState{id: id, role: RoleReplica}
			if role == "master" {
				st.role, primary = RolePrimary, s
			}
			if strings.HasPrefix(health, "fail") {
				st.role = RoleFailed
			}
			topo.nodes[s] = st
			members = append(members, s)
		}
		for _, s := range members {
			if st := topo.nodes[s]; s != primary {
				st.primary = primary
				topo.nodes[s] = st
			}
		}
		slots, _ := shard["slots"].([]any)
		if len(slots)%2 != 0 {
			return nil, fmt.Errorf("odd slot list %v", slots)
		}
		for i := 0; i < len(slots); i += 2 {
			first, err1 := integer(slots[i])
			last, err2 := integer(slots[i+1])
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("slot range: %w", err)
			}
			if primary == nil {
				return nil, fmt.Errorf("slots %d-%d have no primary", first, last)
			}
			topo.ranges = append(topo.ranges, slotRange{first, last, primary})
		}
	}
	slices.SortFunc(topo.ranges, func(a, b slotRange) int { return a.first - b.first })
	return topo, nil
}

// String renders the topology canonically, for comparing two nodes' views.
func (tp *topology) String() string {
	var b strings.Builder
	for _, r := range tp.ranges {
		fmt.Fprintf(&b, "%d-%d:%d ", r.first, r.last, r.primary.Port)
	}
	nodes := make([]*Server, 0, len(tp.nodes))
	for s := range tp.nodes {
		nodes = append(nodes, s)
	}
	slices.SortFunc(nodes, func(a, b *Server) int { return a.Port - b.Port })
	for _, s := range nodes {
		st := tp.nodes[s]
		fmt.Fprintf(&b, "%d=%s", s.Port, st.role)
		if st.primary != nil {
			fmt.Fprintf(&b, "-of-%d", st.primary.Port)
		}
		b.WriteByte(' ')
	}
	return strings.TrimSpace(b.String())
}

func (tp *topology) primaryFor(slot int) *Server {
	for _, r := range tp.ranges {
		if r.first <= slot && slot <= r.last {
			return r.primary
		}
	}
	return nil
}

// primaries returns the nodes that serve slots, in slot order.
func (tp *topology) primaries() []*Server {
	var ps []*Server
	for _, r := range tp.ranges {
		if !slices.Contains(ps, r.primary) {
			ps = append(ps, r.primary)
		}
	}
	return ps
}

// uncovered returns the first slot no node serves, or -1.
func (tp *topology) uncovered() int {
	next := 0
	for _, r := range tp.ranges {
		if r.first > next {
			return next
		}
		next = max(next, r.last+1)
	}
	if next < keyslot.Count {
		return next
	}
	return -1
}

func addr(s *Server) string {
	if s == nil {
		return "no node"
	}
	return s.Addr
}

// Slot returns the Cluster hash slot of key (see keyslot.Of).
func Slot(key string) int { return int(keyslot.Of(key)) }
