-- gcra.lua: algo's GCRA. Source prepends lib.lua.
--
-- KEYS[1] is a string: the theoretical arrival time (TAT), unix µs
-- (algo State.A). A missing key is fresh (TAT 0).

local alg = {burst = true}

function alg.load(p, now)
  return {a = num(redis.call('GET', key))}
end

-- emission returns e = ⌈P/L⌉ µs.
local function emission(p)
  return ceil_div(p.per, p.limit)
end

-- decide compares durations, never absolute times plus durations, so that
-- no sum exceeds C×e.
function alg.decide(p, st, now, cost, peek)
  local cap, e = p.cap, emission(p)
  local burst = cap * e
  local tat = math.max(st.a, now)
  local allowed, retry = false, 0
  if cost > cap then
    retry = -1
  elseif cost * e <= burst - (tat - now) then
    tat = tat + cost * e
    allowed = true
    if not peek then st.a = tat end
  else
    retry = cost * e - (burst - (tat - now))
  end
  return allowed, quo(math.max(burst - (tat - now), 0), e), tat - now, retry
end

function alg.save(p, st, now)
  redis.call('SET', key, int(st.a))
end

function alg.refund(p, st, now, taken_at, cost)
  if st.a <= now then return false end
  st.a = math.max(st.a - cost * emission(p), now)
  redis.call('SET', key, int(st.a))
  return true
end

-- charge moves the TAT on by n×e, to now + 2×C×e at the latest
-- (algo.Charge).
function alg.charge(p, st, now, n)
  local e = emission(p)
  st.a = math.min(math.max(st.a, now) + n * e, now + 2 * p.cap * e)
  redis.call('SET', key, int(st.a))
  return true
end

function alg.idle(p, st, now)
  return math.max(st.a - now, 0)
end

return run(alg)
