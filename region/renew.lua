-- renew: one region's renewal of its share of one global key's limit.
--
-- KEYS[1]  the key's ledger (a hash on the global store)
-- ARGV[1]  region: the caller's name
-- ARGV[2]  demand: units the region was asked for per period, lately
-- ARGV[3]  lease: lease length, ms
-- ARGV[4]  L: the rule's limit
-- ARGV[5]  f: the fallback share of a region that holds no lease
-- ARGV[6]  floor: the least share a busy region is targeted
-- ARGV[7]  ttl: the ledger's TTL, ms
-- ARGV[8..] every configured region's name
--
-- Fields per region r: s:r (share), e:r (lease expiry, ms of this
-- server's TIME), d:r (last demand). The clock is the global store's own.
--
-- Returns {share, lease ms left, units reclaimed from expired regions,
-- target (the share before the cap by the free units), the live
-- regions' demand (this one's included), the grant's stamp (this
-- server's TIME in µs: it orders the grants of one key, as scripts run
-- one at a time)}.
local key = KEYS[1]
local me = ARGV[1]
local demand = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local L = tonumber(ARGV[4])
local f = tonumber(ARGV[5])
local floor = tonumber(ARGV[6])
local ttl = tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if redis.call('EXISTS', key) == 0 then
  -- First sight: a region that never renewed may be deciding on its
  -- fallback share, so every region is held at f until now + lease.
  for i = 8, #ARGV do
    redis.call('HSET', key, 's:' .. ARGV[i], f, 'e:' .. ARGV[i], now + lease, 'd:' .. ARGV[i], 0)
  end
end

local h = redis.call('HGETALL', key)
local others, sumd, reclaimed, live = 0, demand, 0, 1
-- The demand this region sent at its last renewal, while its lease is
-- live: below it, the region's demand is falling.
local prev = -1
if tonumber(redis.call('HGET', key, 'e:' .. me) or '0') > now then
  prev = tonumber(redis.call('HGET', key, 'd:' .. me) or '-1')
end
for i = 1, #h, 2 do
  local field = h[i]
  if string.sub(field, 1, 2) == 's:' then
    local r = string.sub(field, 3)
    if r ~= me then
      local s = tonumber(h[i + 1])
      local e = tonumber(redis.call('HGET', key, 'e:' .. r) or '0')
      if e > now then
        others = others + s
        live = live + 1
        sumd = sumd + tonumber(redis.call('HGET', key, 'd:' .. r) or '0')
      elseif s > 0 then
        -- An expired lease holds nothing: its units go to the others.
        reclaimed = reclaimed + s
        redis.call('HSET', key, field, 0)
      end
    end
  end
end

local target
if sumd <= L then
  -- The slack is split evenly among the live regions (an expired
  -- region's part goes to the others; a small region, the likeliest to
  -- rise, holds as much as a big one), but a region's headroom is at
  -- most a quarter of its demand plus m/4 (m = L/2R): the rest stays
  -- free, for a region whose demand rises to take at its next (or early)
  -- renewal without waiting for the others to return units. A region
  -- whose demand falls keeps less (a sixteenth of its demand plus m/8):
  -- the units it gives up are free for a rising region at once, not one
  -- renewal later.
  local m = math.max(math.floor(L / (2 * (#ARGV - 7))), 1)
  local part = math.floor((L - sumd) / live)
  local room = math.floor(demand / 4) + math.floor(m / 4)
  if demand < prev then room = math.floor(demand / 16) + math.floor(m / 8) end
  target = demand + math.min(part, room)
else
  target = math.max(floor, math.floor(L * demand / sumd))
end
-- A decrease is granted at once; an increase only up to what is free.
local wanted = target
local free = L - others
if target > free then target = free end
if target < 0 then target = 0 end

redis.call('HSET', key, 's:' .. me, target, 'e:' .. me, now + lease, 'd:' .. me, demand)
redis.call('PEXPIRE', key, ttl)
return {target, lease, reclaimed, wanted, sumd, tonumber(t[1]) * 1000000 + tonumber(t[2])}
