-- heartbeat.lua: the registry of live daemons. Unlike the algorithms'
-- scripts it is not prefixed with lib.lua (lua.HeartbeatSource).
--
-- KEYS[1] is a sorted set: one member per daemon id, scored by the Redis
-- TIME, in unix ms, until which that daemon counts as live (its last
-- heartbeat plus the ttl it gave). Scoring by the deadline rather than by
-- the heartbeat lets daemons with different ttls share the set.
--
-- ARGV[1]  op: "beat" or "leave"
-- ARGV[2]  the daemon's id (not empty)
-- beat     ARGV[3] = ttl in ms (>= 1): the daemon is live until now + ttl.
--          Stale members (deadline <= now) are removed, the key is kept
--          for at least ttl ms, and the reply is the number of members
--          left: the daemons live now, this one included.
-- leave    removes the id; replies 1 if it was there, else 0.
--
-- The script touches KEYS[1] only, so it runs on Cluster.

local key = KEYS[1]
local op, id = ARGV[1], ARGV[2]
if not id or id == '' then
  return redis.error_reply('ERR rld: heartbeat wants a daemon id')
end
if op == 'leave' then
  return redis.call('ZREM', key, id)
end
if op ~= 'beat' then
  return redis.error_reply('ERR rld: unknown heartbeat op ' .. tostring(op) .. ' (want beat or leave)')
end
local ttl = tonumber(ARGV[3])
if not ttl or ttl ~= math.floor(ttl) or ttl < 1 then
  return redis.error_reply('ERR rld: heartbeat wants ARGV[3] ttl_ms >= 1')
end
local t = redis.call('TIME')
-- Integers below 2^53: exact. string.format, not tostring (exponents).
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
redis.call('ZADD', key, string.format('%d', now + ttl), id)
if redis.call('PTTL', key) < ttl then
  redis.call('PEXPIRE', key, string.format('%d', ttl))
end
return redis.call('ZCARD', key)
