-- token_bucket.lua: algo's TokenBucket. Source prepends lib.lua.
--
-- KEYS[1] is a hash:
--   level  the level in token × µs-of-period units, 0 … C×P (algo State.A)
--   at     the time of the last update, unix µs (State.B)
-- A missing key is a fresh, full bucket.

local alg = {burst = true}

function alg.load(p, now)
  local v = redis.call('HMGET', key, 'level', 'at')
  return {a = num(v[1]), b = num(v[2])}
end

-- level returns the bucket's level at now, refilled by L units per µs and
-- capped at full without forming a product above full.
local function level(p, st, now, full)
  if st.b == 0 or st.a >= full then return full end
  local elapsed = now - st.b
  if elapsed <= 0 then return st.a end
  if elapsed >= ceil_div(full - st.a, p.limit) then return full end
  return st.a + elapsed * p.limit
end

function alg.decide(p, st, now, cost, peek)
  local per, cap = p.per, p.cap
  local full = cap * per
  local lv = level(p, st, now, full)
  local allowed, retry = false, 0
  if cost > cap then
    retry = -1
  elseif lv >= cost * per then
    lv = lv - cost * per
    allowed = true
    if not peek then
      -- max: a clock that steps back must not refill twice.
      st.a, st.b = lv, math.max(st.b, now)
    end
  else
    retry = ceil_div(cost * per - lv, p.limit)
  end
  -- max: a charge may leave a debt.
  return allowed, quo(math.max(lv, 0), per), ceil_div(full - lv, p.limit), retry
end

function alg.save(p, st, now)
  redis.call('HSET', key, 'level', int(st.a), 'at', int(st.b))
end

function alg.refund(p, st, now, taken_at, cost)
  if st.b == 0 then return false end -- fresh: already full
  local full = p.cap * p.per
  -- The sum may round above 2^53, but never below full when it exceeds it.
  st.a = math.min(st.a + cost * p.per, full)
  redis.call('HSET', key, 'level', int(st.a))
  return true
end

-- charge takes n units whatever the level, down to -C×P (algo.Charge).
function alg.charge(p, st, now, n)
  local per, full = p.per, p.cap * p.per
  local lv = level(p, st, now, full)
  st.a, st.b = math.max(lv - n * per, -full), math.max(st.b, now)
  redis.call('HSET', key, 'level', int(st.a), 'at', int(st.b))
  return true
end

function alg.idle(p, st, now)
  local full = p.cap * p.per
  if st.b == 0 or st.a >= full then return 0 end
  -- The refill runs from at, which a stepped-back clock leaves ahead of now.
  return math.max(st.b - now + ceil_div(full - st.a, p.limit), 0)
end

return run(alg)
