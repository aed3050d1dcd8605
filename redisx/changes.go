package redisx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
// bumped by every change; field "e" the epoch, a random id written by
// the first change to the hash, which a Redis that lost the hash
// (restarted without persistence) no longer has; a field "x:ID" is the
// tombstone of the deleted entry ID, its value the entry's expiry (ms),
// kept until then so that a restore does not bring the entry back (an
// entry put again under that id, as an automatic block's is, has
// another expiry and removes the tombstone); each
// other field is an entry's id, its value "<expiry in Redis TIME ms>
// <the entry's JSON>".
const changesKey = "changes"

// changesScript runs one operation on the changes' hash and answers with
// Redis TIME in ms and the version first, so that a caller learns the
// offset of its clock to Redis's from every call:
//
//	put ID VALUE EXPIRY_MS TTL_MS EPOCH → {time, version, expiry}: expiry
//	    is EXPIRY_MS, or TIME + TTL_MS when EXPIRY_MS is 0; refused when
//	    not after TIME. Removes ID's tombstone. Sets the epoch to EPOCH
//	    when the hash has none.
//	    Publishes the version on the channel (the key).
//	del ID → {time, version, deleted}: publishes when deleted, and keeps
//	    the entry's tombstone until its expiry.
//	load → {time, version, epoch, {id, expiry_ms, …} of the tombstones,
//	    id, value, id, value, …}: the entries not expired; expired entries
//	    and tombstones are removed.
//	version → {time, version, epoch}
//	restore EPOCH KNOWN_VERSION N_TOMBS (ID EXPIRY_MS)×N (ID VALUE)… →
//	    {time, version, epoch, began, restored}: sets the epoch to EPOCH
//	    when the hash has none; began = 1 when it had none or its version
//	    was below KNOWN_VERSION (no restore has raised it), writes the
//	    tombstones and deletes their entries (the entry of that id and
//	    expiry), adds each entry that is not expired, not there and not
//	    deleted (restored counts them), sets the version above
//	    KNOWN_VERSION and the hash's, and publishes it.
var changesScript = rueidis.NewLuaScript(`
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[1]
local function expiry(val)
  local sp = string.find(val, ' ', 1, true)
  return tonumber(string.sub(val, 1, (sp or 1) - 1)) or 0
end
if op == 'put' then
  local exp = tonumber(ARGV[4])
  if exp == 0 then exp = now + tonumber(ARGV[5]) end
  if exp <= now then return redis.error_reply('ERR expiry not after Redis TIME') end
  redis.call('HSET', key, ARGV[2], string.format('%d', exp) .. ' ' .. ARGV[3])
  redis.call('HDEL', key, 'x:' .. ARGV[2])
  redis.call('HSETNX', key, 'e', ARGV[6])
  local v = redis.call('HINCRBY', key, 'v', 1)
  redis.call('PUBLISH', key, v)
  return {now, v, exp}
elseif op == 'del' then
  local old = redis.call('HGET', key, ARGV[2])
  local n = 0
  local v = tonumber(redis.call('HGET', key, 'v') or '0')
  if old then
    n = redis.call('HDEL', key, ARGV[2])
    local exp = expiry(old)
    if exp > now then redis.call('HSET', key, 'x:' .. ARGV[2], string.format('%d', exp)) end
    v = redis.call('HINCRBY', key, 'v', 1)
    redis.call('PUBLISH', key, v)
  end
  return {now, v, n}
elseif op == 'load' then
  local all = redis.call('HGETALL', key)
  local out = {now, 0, '', {}}
  for i = 1, #all, 2 do
    local f, val = all[i], all[i + 1]
    if f == 'v' then
      out[2] = tonumber(val)
    elseif f == 'e' then
      out[3] = val
    elseif string.sub(f, 1, 2) == 'x:' then
      if (tonumber(val) or 0) <= now then
        redis.call('HDEL', key, f)
      else
        local tombs = out[4]
        tombs[#tombs + 1] = string.sub(f, 3)
        tombs[#tombs + 1] = val
      end
    elseif expiry(val) <= now then
      redis.call('HDEL', key, f)
    else
      out[#out + 1] = f
      out[#out + 1] = val
    end
  end
  return out
elseif op == 'version' then
  return {now, tonumber(redis.call('HGET', key, 'v') or '0'), redis.call('HGET', key, 'e') or ''}
elseif op == 'restore' then
  local created = redis.call('HSETNX', key, 'e', ARGV[2])
  local known = tonumber(ARGV[3])
  local ntombs = tonumber(ARGV[4])
  local i = 5
  for _ = 1, ntombs do
    local id, exp = ARGV[i], tonumber(ARGV[i + 1])
    if exp > now then
      redis.call('HSET', key, 'x:' .. id, ARGV[i + 1])
      local cur = redis.call('HGET', key, id)
      if cur and expiry(cur) == exp then redis.call('HDEL', key, id) end
    end
    i = i + 2
  end
  local restored = 0
  while i < #ARGV do
    local id, val = ARGV[i], ARGV[i + 1]
    local tomb = tonumber(redis.call('HGET', key, 'x:' .. id) or '0')
    if expiry(val) > now and tomb ~= expiry(val) and redis.call('HEXISTS', key, id) == 0 then
      redis.call('HSET', key, id, val)
      restored = restored + 1
    end
    i = i + 2
  end
  local hv = tonumber(redis.call('HGET', key, 'v') or '0')
  local began = 0
  if created == 1 or hv < known then began = 1 end
  local v = math.max(hv, known) + 1
  redis.call('HSET', key, 'v', v)
  redis.call('PUBLISH', key, v)
  return {now, v, redis.call('HGET', key, 'e'), began, restored}
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
	// Epoch is the hash's epoch ("" when it has none, or the call does
	// not read it: Put and Delete).
	Epoch string
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
	vals, st, err := s.call(ctx, "put", id, value, strconv.FormatInt(exp, 10), strconv.FormatInt(ttl.Milliseconds(), 10), NewEpoch())
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

// NewEpoch returns a new random epoch id.
func NewEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Version returns the current version and epoch.
func (s *Changes) Version(ctx context.Context) (Stamp, error) {
	arr, st, err := s.script(ctx, "version")
	if err == nil && len(arr) == 3 {
		st.Epoch, err = arr[2].ToString()
	}
	if err != nil {
		return st, fmt.Errorf("redisx: changes: version: %w", err)
	}
	return st, nil
}

// Load returns the entries not expired, by id, the tombstones of the
// entries deleted before their expiry (id → that expiry), and the
// version and epoch they are.
func (s *Changes) Load(ctx context.Context) (map[string]ChangeEntry, map[string]time.Time, Stamp, error) {
	arr, st, err := s.script(ctx, "load")
	if err == nil && (len(arr) < 4 || len(arr)%2 != 0) {
		err = errors.New("bad reply")
	}
	var tombs map[string]time.Time
	if err == nil {
		st.Epoch, err = arr[2].ToString()
	}
	if err == nil {
		tombs, err = parseTombs(arr[3])
	}
	if err != nil {
		return nil, nil, st, fmt.Errorf("redisx: changes: load: %w", err)
	}
	out := make(map[string]ChangeEntry, len(arr)/2-2)
	for i := 4; i < len(arr); i += 2 {
		id, err1 := arr[i].ToString()
		val, err2 := arr[i+1].ToString()
		if err := errors.Join(err1, err2); err != nil {
			return nil, nil, st, fmt.Errorf("redisx: changes: load: %w", err)
		}
		ms, rest, _ := strings.Cut(val, " ")
		exp, err := strconv.ParseInt(ms, 10, 64)
		if err != nil {
			return nil, nil, st, fmt.Errorf("redisx: changes: load: entry %s: bad expiry %q", id, ms)
		}
		out[id] = ChangeEntry{Expires: time.UnixMilli(exp), Value: rest}
	}
	return out, tombs, st, nil
}

// parseTombs reads the load's list of tombstones: id, expiry ms, ….
func parseTombs(m rueidis.RedisMessage) (map[string]time.Time, error) {
	arr, err := m.ToArray()
	if err != nil || len(arr)%2 != 0 {
		return nil, fmt.Errorf("bad tombstones: %v", err)
	}
	out := make(map[string]time.Time, len(arr)/2)
	for i := 0; i < len(arr); i += 2 {
		id, err1 := arr[i].ToString()
		ms, err2 := arr[i+1].ToString()
		exp, err3 := strconv.ParseInt(ms, 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("bad tombstone: %w", err)
		}
		out[id] = time.UnixMilli(exp)
	}
	return out, nil
}

// Restored is what a Restore did.
type Restored struct {
	// Began reports that this Restore began the restore: the hash had
	// no epoch (Redis had lost it), or a version below the caller's (it
	// had lost writes), rather than one that another daemon's Restore
	// had raised.
	Began bool
	// Entries is how many entries it wrote back: those that were not
	// expired, not in the hash and not deleted.
	Entries int
}

// Restore writes back what a Redis that lost the hash (or writes to it)
// no longer has: each of entries not expired, not in the hash and
// without a tombstone, and the tombstones (whose entries it deletes). It
// gives the hash a new epoch when it has none, sets its version above
// known and above its own, and announces it. What it keeps of entries is
// their value and expiry as Load returned them.
func (s *Changes) Restore(ctx context.Context, known int64, entries map[string]ChangeEntry, tombs map[string]time.Time) (Restored, Stamp, error) {
	args := make([]string, 0, 4+2*len(tombs)+2*len(entries))
	args = append(args, "restore", NewEpoch(), strconv.FormatInt(known, 10), strconv.Itoa(len(tombs)))
	for id, exp := range tombs {
		args = append(args, id, strconv.FormatInt(exp.UnixMilli(), 10))
	}
	for id, e := range entries {
		args = append(args, id, strconv.FormatInt(e.Expires.UnixMilli(), 10)+" "+e.Value)
	}
	arr, st, err := s.script(ctx, args...)
	var res Restored
	if err == nil && len(arr) != 5 {
		err = errors.New("bad reply")
	}
	if err == nil {
		var began, n int64
		st.Epoch, err = arr[2].ToString()
		if err == nil {
			began, err = arr[3].AsInt64()
		}
		if err == nil {
			n, err = arr[4].AsInt64()
		}
		res = Restored{Began: began == 1, Entries: int(n)}
	}
	if err != nil {
		return Restored{}, st, fmt.Errorf("redisx: changes: restore: %w", err)
	}
	return res, st, nil
}

// script runs the changes' script with args and returns its reply's
// elements and the stamp of its first two.
func (s *Changes) script(ctx context.Context, args ...string) ([]rueidis.RedisMessage, Stamp, error) {
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
	return arr, st, err
}

// call runs op on the changes' hash and returns its integer replies.
func (s *Changes) call(ctx context.Context, args ...string) ([]int64, Stamp, error) {
	arr, st, err := s.script(ctx, args...)
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
