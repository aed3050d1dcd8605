package redisx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/breaker"
	"github.com/rld/rld/redisx/keyslot"
)

// slotMap maps the slots of a Redis Cluster to the addresses of their
// primaries, named as rueidis names its nodes (rueidis.Client.Nodes), so
// that a per-node breaker can be picked for a key before the call. It is
// refreshed from CLUSTER SHARDS (or CLUSTER SLOTS, before Redis 7). It
// is safe for concurrent use; the zero value knows no slot.
type slotMap struct {
	t atomic.Pointer[slotTable]
	// attach, when set, is called with every table a refresh fetched,
	// before the table is used: the Client gives each primary its
	// breaker there.
	attach func(*slotTable)
	// tls names each primary by its TLS port, as rueidis does when it
	// connects with TLS.
	tls bool
}

// slotTable is one refresh's view: owner[slot] is 1 + the index in addrs
// of the slot's primary, 0 when no primary serves it.
type slotTable struct {
	owner [keyslot.Count]uint16
	addrs []string
	brk   []*breaker.Breaker // by index in addrs, when attach set them
	// node is, by index in addrs, the rueidis client of the primary's
	// connection (rueidis.Client.Nodes), nil when rueidis knows no such
	// node yet.
	node []rueidis.Client
	// at is when the refresh fetched the table (unix ns).
	at int64
}

// nodeTrust is how long after its refresh a table's node clients are
// used. rueidis closes the connection of a node that left the topology
// 5 s after its own refresh saw it go, and a client of a closed
// connection fails every call: while refreshes fail, calls go back to
// rueidis's routing before that can happen.
const nodeTrust = 3 * time.Second

// node returns the address of the primary that serves slot, or "" when
// it is unknown.
func (m *slotMap) node(slot uint16) string {
	t := m.t.Load()
	if t == nil || slot >= keyslot.Count {
		return ""
	}
	if i := t.owner[slot]; i > 0 {
		return t.addrs[i-1]
	}
	return ""
}

// route returns the breaker of the primary that serves slot and the
// client of its connection: nil, nil when the slot is unknown or no
// breaker was attached; a nil client when rueidis knew no connection to
// the primary at the refresh.
func (m *slotMap) route(slot uint16) (*breaker.Breaker, rueidis.Client) {
	t := m.t.Load()
	if t == nil || slot >= keyslot.Count {
		return nil, nil
	}
	i := int(t.owner[slot])
	if i == 0 || i > len(t.brk) {
		return nil, nil
	}
	var node rueidis.Client
	if i <= len(t.node) && time.Now().UnixNano()-t.at < int64(nodeTrust) {
		node = t.node[i-1]
	}
	return t.brk[i-1], node
}

// nodes returns the addresses of the primaries that serve slots.
func (m *slotMap) nodes() []string {
	if t := m.t.Load(); t != nil {
		return append([]string(nil), t.addrs...)
	}
	return nil
}

// refresh asks the nodes of c, one after another until one answers, for
// the cluster's shards, and replaces the map with the answer, each
// primary with the client of rueidis's connection to it. It stops
// at ctx's deadline; on failure the map is left as it was.
func (m *slotMap) refresh(ctx context.Context, c rueidis.Client) error {
	var errs []error
	nodes := c.Nodes()
	for addr, node := range nodes { // in random order
		t, err := fetchSlots(ctx, node, addr, m.tls)
		if err == nil {
			t.node, t.at = make([]rueidis.Client, len(t.addrs)), time.Now().UnixNano()
			for i, a := range t.addrs {
				t.node[i] = nodes[a]
			}
			if m.attach != nil {
				m.attach(t)
			}
			m.t.Store(t)
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return errors.New("redisx: refresh slot map: no cluster node known")
	}
	return fmt.Errorf("redisx: refresh slot map: %w", errors.Join(errs...))
}

// fetchSlots asks node, whose address is addr, for CLUSTER SHARDS and,
// when it does not know the command, CLUSTER SLOTS; with tls, the
// primaries are named by their TLS ports (see parseShards).
func fetchSlots(ctx context.Context, node rueidis.Client, addr string, tls bool) (*slotTable, error) {
	shards, err := node.Do(ctx, node.B().ClusterShards().Build()).ToArray()
	if err == nil {
		return parseShards(shards, addr, tls)
	}
	if re, ok := rueidis.IsRedisErr(err); !ok || !strings.HasPrefix(re.Error(), "ERR unknown") {
		return nil, fmt.Errorf("CLUSTER SHARDS: %w", err)
	}
	slots, err := node.Do(ctx, node.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	return parseSlots(slots, addr)
}

// tableBuilder assembles a slotTable.
type tableBuilder struct {
	t     slotTable
	index map[string]uint16
}

// add records that primary serves first to last.
func (b *tableBuilder) add(first, last int64, primary string) error {
	if first < 0 || last >= keyslot.Count || first > last {
		return fmt.Errorf("bad slot range %d-%d", first, last)
	}
	if b.index == nil {
		b.index = make(map[string]uint16)
	}
	i, ok := b.index[primary]
	if !ok {
		b.t.addrs = append(b.t.addrs, primary)
		i = uint16(len(b.t.addrs))
		b.index[primary] = i
	}
	for s := first; s <= last; s++ {
		b.t.owner[s] = i
	}
	return nil
}

// parseShards reads a CLUSTER SHARDS reply from the node at addr. A
// shard's primary is its node with role "master" and health "online"; a
// shard without one (its primary failed, no replica promoted yet) leaves
// its slots unknown. A node serving both plain and TLS clients is named
// by its TLS port when tls is set, else by its plain port.
func parseShards(shards []rueidis.RedisMessage, addr string, tls bool) (*slotTable, error) {
	var b tableBuilder
	for _, sv := range shards {
		shard, err := sv.AsMap()
		if err != nil {
			return nil, fmt.Errorf("shard: %w", err)
		}
		nodesMsg, slotsMsg := shard["nodes"], shard["slots"]
		nodes, err := nodesMsg.ToArray()
		if err != nil {
			return nil, fmt.Errorf("shard nodes: %w", err)
		}
		primary := ""
		for _, nv := range nodes {
			n, err := nv.AsMap()
			if err != nil {
				return nil, fmt.Errorf("shard node: %w", err)
			}
			str := func(field string) string {
				v := n[field]
				s, _ := v.ToString()
				return s
			}
			role, health := str("role"), str("health")
			if role != "master" || health != "online" {
				continue
			}
			portMsg, tlsPortMsg := n["port"], n["tls-port"]
			first, second := portMsg, tlsPortMsg
			if tls {
				first, second = tlsPortMsg, portMsg
			}
			port, err := first.AsInt64()
			if err != nil { // a node with one port
				port, err = second.AsInt64()
			}
			if err != nil {
				return nil, fmt.Errorf("node %s: no port: %w", str("id"), err)
			}
			primary = nodeAddr(addr, str("endpoint"), port)
		}
		if primary == "" {
			continue
		}
		slots, err := slotsMsg.AsIntSlice()
		if err != nil || len(slots)%2 != 0 {
			return nil, fmt.Errorf("shard slots %v: %v", slots, err)
		}
		for i := 0; i < len(slots); i += 2 {
			if err := b.add(slots[i], slots[i+1], primary); err != nil {
				return nil, err
			}
		}
	}
	return &b.t, nil
}

// parseSlots reads a CLUSTER SLOTS reply from the node at addr: entries
// of first slot, last slot, primary [endpoint, port, id, …], replicas….
func parseSlots(ranges []rueidis.RedisMessage, addr string) (*slotTable, error) {
	var b tableBuilder
	for _, rv := range ranges {
		r, err := rv.ToArray()
		if err != nil || len(r) < 3 {
			return nil, fmt.Errorf("slot range %v: %v", r, err)
		}
		first, err1 := r[0].AsInt64()
		last, err2 := r[1].AsInt64()
		p, err3 := r[2].ToArray()
		if err := errors.Join(err1, err2, err3); err != nil || len(p) < 2 {
			return nil, fmt.Errorf("slot range %v: %v", r, err)
		}
		endpoint, _ := p[0].ToString()
		port, err := p[1].AsInt64()
		if err != nil {
			return nil, fmt.Errorf("slot range %d-%d port: %w", first, last, err)
		}
		if primary := nodeAddr(addr, endpoint, port); primary != "" {
			if err := b.add(first, last, primary); err != nil {
				return nil, err
			}
		}
	}
	return &b.t, nil
}

// nodeAddr returns the address of a node that the node at addr reports
// with endpoint and port, as rueidis computes it: "" or an endpoint
// unknown to the node means addr's host; "?" means no address.
func nodeAddr(addr, endpoint string, port int64) string {
	switch endpoint {
	case "?":
		return ""
	case "":
		endpoint, _, _ = net.SplitHostPort(addr)
	}
	return net.JoinHostPort(endpoint, strconv.FormatInt(port, 10))
}
