-- fixed_window.lua: algo's FixedWindow. Source prepends lib.lua.
--
-- KEYS[1] is a hash:
--   start  the start of the counted window, unix µs (algo State.A)
--   count  the units admitted in that window (State.B)
-- A missing key has counted nothing.

local alg = {window = 1}

function alg.load(p, now)
  local v = redis.call('HMGET', key, 'start', 'count')
  return {a = num(v[1]), b = num(v[2])}
end

function alg.decide(p, st, now, cost, peek)
  local per, limit = p.per, p.limit
  local start = window_start(now, per)
  local count = 0
  if st.a == start then count = st.b end
  local reset = start + per - now
  local allowed, retry = false, 0
  if cost > limit then
    retry = -1
  elseif count + cost <= limit then
    count = count + cost
    allowed = true
    if not peek then st.a, st.b = start, count end
  else
    retry = reset
  end
  return allowed, math.max(limit - count, 0), reset, retry
end

function alg.save(p, st, now)
  redis.call('HSET', key, 'start', int(st.a), 'count', int(st.b))
end

function alg.refund(p, st, now, taken_at, cost)
  return refund_window(p, st, now, taken_at, cost, 'count')
end

-- charge counts n more units in the current window, up to 2×L
-- (algo.Charge).
function alg.charge(p, st, now, n)
  local start = window_start(now, p.per)
  local count = 0
  if st.a == start then count = st.b end
  st.a, st.b = start, math.min(count + n, 2 * p.limit)
  redis.call('HSET', key, 'start', int(st.a), 'count', int(st.b))
  return true
end

function alg.idle(p, st, now)
  if st.b == 0 then return 0 end
  return math.max(st.a + p.per - now, 0)
end

return run(alg)
