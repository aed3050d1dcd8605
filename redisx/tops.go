package redisx

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// topsKey ends the key of the fleet's heavy hitters, after the prefix,
// inside a hash tag: "{<prefix>top}", a hash with one field per daemon,
// its value "<Redis TIME ms when published> <the daemon's report>".
const topsKey = "top"

// topsScript publishes one daemon's report, or reads them all:
//
//	put ID VALUE TTL_MS → {time}: stores VALUE as ID's, removes the
//	    reports older than TTL_MS and keeps the hash TTL_MS longer.
//	get TTL_MS → {time, id, published_ms, value, …}: the reports not
//	    older than TTL_MS.
var topsScript = rueidis.NewLuaScript(`
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[1]
local ttl = tonumber(op == 'put' and ARGV[4] or ARGV[2])
local out = {now}
local all = redis.call('HGETALL', key)
for i = 1, #all, 2 do
  local f, val = all[i], all[i + 1]
  local sp = string.find(val, ' ', 1, true)
  local at = tonumber(string.sub(val, 1, (sp or 1) - 1)) or 0
  if at + ttl < now then
    redis.call('HDEL', key, f)
  elseif op == 'get' then
    out[#out + 1] = f
    out[#out + 1] = at
    out[#out + 1] = string.sub(val, (sp or 0) + 1)
  end
end
if op == 'put' then
  redis.call('HSET', key, ARGV[2], string.format('%d', now) .. ' ' .. ARGV[3])
  redis.call('PEXPIRE', key, ttl)
end
return out
`)

// Tops is where the daemons of a fleet publish their heavy hitters, for
// an admin's view of the fleet. Safe for concurrent use.
type Tops struct {
	c   *Client
	key string
}

// NewTops returns the Tops on c, under c's key prefix.
func NewTops(c *Client) *Tops {
	return &Tops{c: c, key: "{" + c.o.KeyPrefix + topsKey + "}"}
}

// Key returns the hash's key.
func (s *Tops) Key() string { return s.key }

// Report is one daemon's published report.
type Report struct {
	// Daemon is the id it was published as.
	Daemon string
	// Age is how long ago, by Redis TIME.
	Age time.Duration
	// Value is what Publish stored.
	Value string
}

// Publish stores value as daemon id's report; reports older than ttl
// (this one included, unless published again) are removed.
func (s *Tops) Publish(ctx context.Context, id, value string, ttl time.Duration) error {
	if id == "" || ttl <= 0 {
		return fmt.Errorf("redisx: tops: publish %q: want a daemon id and a positive ttl, got %s", id, ttl)
	}
	_, err := s.c.exec(ctx, topsScript, s.key, []string{"put", id, value, strconv.FormatInt(ttl.Milliseconds(), 10)})
	if err != nil {
		return fmt.Errorf("redisx: tops: publish %q: %w", id, err)
	}
	return nil
}

// Reports returns the reports published within ttl.
func (s *Tops) Reports(ctx context.Context, ttl time.Duration) ([]Report, error) {
	r, err := s.c.exec(ctx, topsScript, s.key, []string{"get", strconv.FormatInt(ttl.Milliseconds(), 10)})
	if err != nil {
		return nil, fmt.Errorf("redisx: tops: read: %w", err)
	}
	arr, err := r.ToArray()
	if err != nil || len(arr)%3 != 1 {
		return nil, fmt.Errorf("redisx: tops: read: bad reply: %v", err)
	}
	now, err := arr[0].AsInt64()
	if err != nil {
		return nil, fmt.Errorf("redisx: tops: read: %w", err)
	}
	out := make([]Report, 0, len(arr)/3)
	for i := 1; i < len(arr); i += 3 {
		id, err1 := arr[i].ToString()
		at, err2 := arr[i+1].AsInt64()
		val, err3 := arr[i+2].ToString()
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("redisx: tops: read: bad report %d", i/3)
		}
		out = append(out, Report{Daemon: id, Age: time.Duration(now-at) * time.Millisecond, Value: val})
	}
	return out, nil
}
