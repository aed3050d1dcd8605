-- shares: writes grants to a region's shares hash, each unless the hash
-- holds a later grant of its key, deletes expired shares, and announces
-- a change.
--
-- KEYS[1]  the shares hash
-- ARGV[1]  the channel that announces a change
-- ARGV[2]  now, ms: a share whose expiry is at or before it is expired
-- ARGV[3]  n, the grants
-- ARGV[4 .. 3+2n]  field and value of each grant
-- ARGV[4+2n ..]    fields to delete if their share expired
--
-- A value is "units:expiry_ms:demand:stamp"; the stamp is the global
-- store's time of the grant, in µs (0 when left out), so that of two
-- renewals of one key that crossed (sent by two daemons of the region,
-- answered out of order) the hash keeps the one the global ledger
-- holds. A value that does not parse counts as expired and stamp 0.
--
-- Returns the number of fields written or deleted.
local function stamp(v)
  return tonumber(string.match(v, '^%d+:%d+:%d+:(%d+)$') or '0')
end
local function expiry(v)
  return tonumber(string.match(v, '^%d+:(%d+)') or '0')
end

local hash = KEYS[1]
local now, n, changed = tonumber(ARGV[2]), tonumber(ARGV[3]), 0
for i = 4, 3 + 2 * n, 2 do
  local cur = redis.call('HGET', hash, ARGV[i])
  if not cur or stamp(cur) < stamp(ARGV[i + 1]) then
    redis.call('HSET', hash, ARGV[i], ARGV[i + 1])
    changed = changed + 1
  end
end
for i = 4 + 2 * n, #ARGV do
  local cur = redis.call('HGET', hash, ARGV[i])
  if cur and expiry(cur) <= now then
    redis.call('HDEL', hash, ARGV[i])
    changed = changed + 1
  end
end
if changed > 0 then
  redis.call('PUBLISH', ARGV[1], '1')
end
return changed
