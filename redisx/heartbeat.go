package redisx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/lua"
)

// daemonsKey ends the key of the registry of live daemons, after the
// Store's prefix.
const daemonsKey = "daemons"

// heartbeatScript is lua.HeartbeatSource; Exec falls back from EVALSHA to
// EVAL when Redis lost it.
var heartbeatScript = rueidis.NewLuaScript(lua.HeartbeatSource())

// Heartbeat records that daemon id is live now and returns how many
// daemons were live within ttl (including this one). One script call on
// one key (prefix+"daemons", a sorted set scored by Redis TIME ms: the
// time until which each daemon counts as live; stale members removed),
// so it works on Cluster. A daemon counts as live for ttl after its last
// Heartbeat; as each member carries its own deadline, daemons with
// different ttls can share the registry. ttl is rounded up to whole
// milliseconds.
//
// Call it at an interval well below ttl. Like every call it lasts at most
// the Client's Timeout, or until ctx's deadline.
func (s *Store) Heartbeat(ctx context.Context, id string, ttl time.Duration) (live int, err error) {
	if id == "" || ttl <= 0 {
		return 0, fmt.Errorf("redisx: heartbeat %q: want a daemon id and a positive ttl, got ttl %s", id, ttl)
	}
	ms := (ttl + time.Millisecond - 1) / time.Millisecond
	n, err := s.registry(ctx, "beat", id, strconv.FormatInt(int64(ms), 10))
	if err != nil {
		return 0, fmt.Errorf("redisx: heartbeat %q: %w", id, err)
	}
	return int(n), nil
}

// Leave removes daemon id from the registry of live daemons (on
// shutdown), so that the others count it out at once instead of after its
// ttl. Leaving twice, or without a Heartbeat, is not an error.
func (s *Store) Leave(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("redisx: leave: empty daemon id")
	}
	if _, err := s.registry(ctx, "leave", id); err != nil {
		return fmt.Errorf("redisx: leave %q: %w", id, err)
	}
	return nil
}

// registry runs the heartbeat script with args (op, id, …) and returns
// its integer reply, through the breaker of the registry's key.
func (s *Store) registry(ctx context.Context, args ...string) (int64, error) {
	r, err := s.c.exec(ctx, heartbeatScript, s.prefix+daemonsKey, args)
	if err != nil {
		return 0, err
	}
	return r.AsInt64()
}
