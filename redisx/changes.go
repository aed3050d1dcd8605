package redisx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// changesKey ends the key of the run-time changes (overrides and blocks),
// after the prefix, inside a hash tag: "{<prefix>changes}". One hash
// holds them all, so it works on Cluster: field "v" is the version,
// bumped by every change; each other field is an entry's id, its value
// "<expiry in Redis TIME ms> <the entry's JSON>".
const changesKey = "changes"

// changesScript runs one operation on the changes' hash and answers with
// Redis TIME in ms first, so that a caller learns the offset of its clock
// to Redis's from every call:
//
//	put ID VALUE EXPIRY_MS TTL_MS → {time, version, expiry}: expiry is
//	    EXPIRY_MS, or TIME + TTL_MS when EXPIRY_MS is 0; refused when not
//	    after TIME. Publishes the version on the channel (the key).
//	del ID → {time, version, deleted}: publishes when deleted.
//	load → {time, version, id, value, id, value, …}: the entries not
//	    expired; expired ones are removed.
//	version → {time, version}
var changesScript = rueidis.NewLuaScript(`
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[1]
if op == 'put' then
  local exp = tonumber(ARGV[4])
  if exp == 0 then exp = now + tonumber(ARGV[5]) end
  if exp <= now then return redis.error_reply('ERR expiry not after Redis TIME') end
  redis.call('HSET', key, ARGV[2], string.format('%d', exp) .. ' ' .. ARGV[3])
  local v = redis.call('HINCRBY', key, 'v', 1)
  redis.call('PUBLISH', key, v)
  return {now, v, exp}
elseif op == 'del' then
  local n = redis.call('HDEL', key, ARGV[2])
  local v = tonumber(redis.call('HGET', key, 'v') or '0')
  if n > 0 then
    v = redis.call('HINCRBY', key, 'v', 1)
    redis.call('PUBLISH', key, v)
  end
  return {now, v, n}
elseif op == 'load' then
  local all = redis.call('HGETALL', key)
  local out = {now, 0}
  for i = 1, #all, 2 do
    local f, val = all[i], all[i + 1]
    if f == 'v' then
      out[2] = tonumber(val)
    else
      local sp = string.find(val, ' ', 1, true)
      local exp = tonumber(string.sub(val, 1, (sp or 1) - 1)) or 0
      if exp <= now then
        redis.call('HDEL', key, f)
      else
        out[#out + 1] = f
        out[#out + 1] = val
      end
    end
  end
  return out
elseif op == 'version' then
  return {now, tonumber(redis.call('HGET', key, 'v') or '0')}
end
return redis.error_reply('ERR unknown changes op ' .. tostring(op))
`)

// Changes keeps the run-time changes of a fleet in Redis: entries by id
// with an expiry in Redis TIME, a version, and a pub/sub channel that
// announces each change. Safe for concurrent use.
type Changes struct {
	c   *Client
	key string // also the channel's name
}

// NewChanges returns the Changes on c, under c's key prefix.
func NewChanges(c *Client) *Changes {
	return &Changes{c: c, key: "{" + c.o.KeyPrefix + changesKey + "}"}
}

// Key returns the hash's key, which is also the channel's name.
func (s *Changes) Key() string { return s.key }

// ChangeEntry is one stored entry.
type ChangeEntry struct {
	// Expires is the entry's expiry, in Redis TIME.
	Expires time.Time
	// Value is what Put stored.
	Value string
}

// Stamp is what a call learnt: the version after it, and Redis TIME
// with the local clock around the call, for the offset of the two.
type Stamp struct {
	Version int64
	// Redis is Redis TIME during the call; Local the middle of the call
	// by the local clock.
	Redis, Local time.Time
}

// Skew returns Redis TIME minus the local clock, as the call saw them.
func (st Stamp) Skew() time.Duration { return st.Redis.Sub(st.Local) }

// Put stores the entry id with value, expiring at expires (when not zero)
// or ttl after Redis TIME, bumps the version and announces it. It returns
// the expiry in Redis TIME.
func (s *Changes) Put(ctx context.Context, id, value string, expires time.Time, ttl time.Duration) (time.Time, Stamp, error) {
	if id == "" || id == "v" || strings.ContainsAny(id, " ") {
		return time.Time{}, Stamp{}, fmt.Errorf("redisx: changes: bad id %q", id)
	}
	var exp int64
	if !expires.IsZero() {
		exp = expires.UnixMilli()
	}
	vals, st, err := s.call(ctx, "put", id, value, strconv.FormatInt(exp, 10), strconv.FormatInt(ttl.Milliseconds(), 10))
	if err != nil {
		return time.Time{}, st, fmt.Errorf("redisx: changes: put %s: %w", id, err)
	}
	return time.UnixMilli(vals[2]), st, nil
}

// Delete removes the entry id; it reports whether there was one.
func (s *Changes) Delete(ctx context.Context, id string) (bool, Stamp, error) {
	vals, st, err := s.call(ctx, "del", id)
	if err != nil {
		return false, st, fmt.Errorf("redisx: changes: delete %s: %w", id, err)
	}
	return vals[2] > 0, st, nil
}

// Version returns the current version.
func (s *Changes) Version(ctx context.Context) (Stamp, error) {
	_, st, err := s.call(ctx, "version")
	if err != nil {
		return st, fmt.Errorf("redisx: changes: version: %w", err)
	}
	return st, nil
}

// Load returns the entries not expired, by id, and the version they are.
func (s *Changes) Load(ctx context.Context) (map[string]ChangeEntry, Stamp, error) {
	before := time.Now()
	r, err := s.c.exec(ctx, changesScript, s.key, []string{"load"})
	after := time.Now()
	if err != nil {
		return nil, Stamp{}, fmt.Errorf("redisx: changes: load: %w", err)
	}
	arr, err := r.ToArray()
	if err != nil || len(arr) < 2 || len(arr)%2 != 0 {
		return nil, Stamp{}, fmt.Errorf("redisx: changes: load: bad reply: %v", err)
	}
	st, err := stamp(arr, before, after)
	if err != nil {
		return nil, st, err
	}
	out := make(map[string]ChangeEntry, len(arr)/2-1)
	for i := 2; i < len(arr); i += 2 {
		id, err1 := arr[i].ToString()
		val, err2 := arr[i+1].ToString()
		if err := errors.Join(err1, err2); err != nil {
			return nil, st, fmt.Errorf("redisx: changes: load: %w", err)
		}
		ms, rest, _ := strings.Cut(val, " ")
		exp, err := strconv.ParseInt(ms, 10, 64)
		if err != nil {
			return nil, st, fmt.Errorf("redisx: changes: load: entry %s: bad expiry %q", id, ms)
		}
		out[id] = ChangeEntry{Expires: time.UnixMilli(exp), Value: rest}
	}
	return out, st, nil
}

// call runs op on the changes' hash and returns its integer replies.
func (s *Changes) call(ctx context.Context, args ...string) ([]int64, Stamp, error) {
	before := time.Now()
	r, err := s.c.exec(ctx, changesScript, s.key, args)
	after := time.Now()
	if err != nil {
		return nil, Stamp{}, err
	}
	arr, err := r.ToArray()
	if err != nil || len(arr) < 2 {
		return nil, Stamp{}, fmt.Errorf("bad reply: %v", err)
	}
	st, err := stamp(arr, before, after)
	if err != nil {
		return nil, st, err
	}
	vals := make([]int64, len(arr))
	for i := range arr {
		if vals[i], err = arr[i].AsInt64(); err != nil {
			return nil, st, fmt.Errorf("bad reply: %w", err)
		}
	}
	return vals, st, nil
}

func stamp(arr []rueidis.RedisMessage, before, after time.Time) (Stamp, error) {
	now, err1 := arr[0].AsInt64()
	v, err2 := arr[1].AsInt64()
	if err := errors.Join(err1, err2); err != nil {
		return Stamp{}, fmt.Errorf("redisx: changes: bad reply: %w", err)
	}
	return Stamp{Version: v, Redis: time.UnixMilli(now), Local: before.Add(after.Sub(before) / 2)}, nil
}

// Subscribe listens on the changes' channel and calls announced with
// each version announced, and subscribed once the subscription is
// confirmed. It returns when ctx is done (nil) or the subscription fails
// or is lost (its error): the caller subscribes again, and reloads, as a
// message may have been missed meanwhile.
func (s *Changes) Subscribe(ctx context.Context, subscribed func(), announced func(version int64)) error {
	return s.c.subscribe(ctx, s.key, "changes", subscribed, func(msg string) {
		if v, err := strconv.ParseInt(msg, 10, 64); err == nil {
			announced(v)
		}
	})
}

// subscribe listens on channel and calls message with each message
// received, and subscribed once the subscription is confirmed. It
// returns when ctx is done (nil) or the subscription fails or is lost
// (its error, which names what, the subscriber).
func (c *Client) subscribe(ctx context.Context, channel, what string, subscribed func(), message func(string)) error {
	rc, err := c.client()
	if err != nil {
		return err
	}
	dc, cancel := rc.Dedicate()
	defer cancel()
	wait := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(m rueidis.PubSubMessage) { message(m.Message) },
		OnSubscription: func(ps rueidis.PubSubSubscription) {
			if ps.Kind == "subscribe" {
				subscribed()
			}
		},
	})
	// A dedicated connection is dialled by this first call: it has the
	// set-up's time as well as a call's (no check waits on it).
	cctx, ccancel := context.WithTimeout(withDedicatedDial(ctx), c.o.DialTimeout+c.o.Timeout)
	err = dc.Do(cctx, dc.B().Subscribe().Channel(channel).Build()).Error()
	ccancel()
	if err != nil {
		return fmt.Errorf("redisx: %s: subscribe: %w", what, err)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-wait:
		if err == nil {
			err = errors.New("subscription closed")
		}
		return fmt.Errorf("redisx: %s: subscription lost: %w", what, err)
	}
}

// IsReply reports whether err carries an error reply of Redis (the
// script refused the call), rather than a failure to reach Redis: a call
// that failed to reach Redis may be tried again, one that Redis refused
// may not.
func IsReply(err error) bool { return isRefusal(err) }

// Resubscribe runs subscribe until ctx is done, and again each time it
// returns (the subscription failed or was lost), after a backoff from
// 100 ms that doubles up to 5 s and starts over once a subscription is
// confirmed. subscribe calls its argument when its subscription is
// confirmed, from any goroutine; Resubscribe then calls up with whether
// a failure came before. It calls down with each failure's error and
// whether it is the first of a run of failures.
func Resubscribe(ctx context.Context, subscribe func(subscribed func()) error, up func(again bool), down func(err error, first bool)) {
	const minWait, maxWait = 100 * time.Millisecond, 5 * time.Second
	var wait atomic.Int64 // written from rueidis's goroutine too
	var failing atomic.Bool
	wait.Store(int64(minWait))
	for ctx.Err() == nil {
		err := subscribe(func() {
			wait.Store(int64(minWait))
			up(failing.Swap(false))
		})
		if ctx.Err() != nil {
			return
		}
		down(err, !failing.Swap(true))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(wait.Load())):
		}
		wait.Store(min(2*wait.Load(), int64(maxWait)))
	}
}
