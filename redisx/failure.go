package redisx

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/rueidis"
)

// failureReplies are the first words of the Redis error replies that say
// the node cannot serve now, whatever the command: they count as failures.
var failureReplies = map[string]bool{
	"CLUSTERDOWN": true, // the cluster, or the slot's shard, is down
	"LOADING":     true, // the dataset is being loaded after a restart
	"MASTERDOWN":  true, // a replica lost its primary
	"READONLY":    true, // a write reached a replica: a failover under way
	"TRYAGAIN":    true, // a slot is being migrated
	"BUSY":        true, // a script or function runs too long
	"MISCONF":     true, // persistence fails, writes are refused
	"NOREPLICAS":  true, // min-replicas-to-write not met
	"OOM":         true, // maxmemory reached, writes are refused
}

// errClusterDown is a probe's error for a Cluster node whose CLUSTER INFO
// says cluster_state:fail: it answers PING, but refuses the keys' calls
// with CLUSTERDOWN.
var errClusterDown = errors.New("redisx: cluster_state is not ok")

// isFailure reports whether err, the error of a Redis call, says the node
// is unhealthy, which its breaker counts: a deadline that passed, a
// connection that could not be made or broke, no connection (yet), or an
// error reply in failureReplies. Other error replies (WRONGTYPE, script
// errors, unknown commands) are answers from a healthy node, and a
// canceled call or a closed Client says nothing about Redis: they are not
// failures. A nil err is not.
func isFailure(err error) bool {
	if err == nil {
		return false
	}
	if re, ok := errors.AsType[*rueidis.RedisError](err); ok {
		if re.IsNil() {
			return false
		}
		word, _, _ := strings.Cut(re.Error(), " ")
		return failureReplies[word]
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, ErrClosed):
		return false
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, ErrNotConnected),
		errors.Is(err, rueidis.ErrClosing), // "closing or unable to connect"
		errors.Is(err, rueidis.ErrNoSlot),
		errors.Is(err, rueidis.ErrNoAddr),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, errClusterDown):
		return true
	}
	_, ok := errors.AsType[net.Error](err) // *net.OpError of a dial, read or write; DNS errors
	return ok
}
