-- sliding_counter.lua: algo's SlidingCounter. Source prepends lib.lua.
--
-- KEYS[1] is a hash; both windows live in the one key:
--   start  the start of the window that cur counts, unix µs (algo State.A)
--   cur    the units admitted in that window (State.B)
--   prev   the units admitted in the window before it (State.C)
-- A missing key has counted nothing.

local alg = {window = 2}

function alg.load(p, now)
  local v = redis.call('HMGET', key, 'start', 'cur', 'prev')
  return {a = num(v[1]), b = num(v[2]), c = num(v[3])}
end

-- counts returns the counts of the window that starts at start and of the
-- one before it.
local function counts(st, start, per)
  if st.a == start then return st.b, st.c end
  if st.a == start - per then return 0, st.b end
  return 0, 0
end

-- decide tests prev×(P−e) + (cur+cost)×P ≤ L×P as two comparisons, so
-- that no side exceeds L×P.
function alg.decide(p, st, now, cost, peek)
  local per, limit = p.per, p.limit
  local start = window_start(now, per)
  local e = now - start
  local cur, prev = counts(st, start, per)
  local weighted = prev * (per - e)
  local allowed, retry = false, 0
  if cost > limit then
    retry = -1
  elseif cur + cost <= limit and weighted <= (limit - cur - cost) * per then
    cur = cur + cost
    allowed = true
    if not peek then st.a, st.b, st.c = start, cur, prev end
  elseif cur + cost <= limit then
    -- The previous window's weight must shrink; prev > 0 here.
    retry = per - e - quo((limit - cur - cost) * per, prev)
  else
    -- It fits in the next window; cur > 0 here.
    retry = per - e + per - quo((limit - cost) * per, cur)
  end
  local reset = 0
  if cur > 0 then
    reset = start + 2 * per - now
  elseif prev > 0 then
    reset = start + per - now
  end
  return allowed, math.max(limit - cur - ceil_div(weighted, per), 0), reset, retry
end

function alg.save(p, st, now)
  redis.call('HSET', key, 'start', int(st.a), 'cur', int(st.b), 'prev', int(st.c))
end

-- refund: the current window's count, or the previous window's, which
-- still weighs on the estimate (algo's refundWindow).
function alg.refund(p, st, now, taken_at, cost)
  local start = window_start(now, p.per)
  if window_start(taken_at, p.per) == start - p.per then
    if st.a == start then
      st.c = math.max(st.c - cost, 0)
      redis.call('HSET', key, 'prev', int(st.c))
      return true
    elseif st.a == start - p.per then
      st.b = math.max(st.b - cost, 0)
      redis.call('HSET', key, 'cur', int(st.b))
      return true
    end
    return false
  end
  return refund_window(p, st, now, taken_at, cost, 'cur')
end

-- charge counts n more units in the current window, up to 2×L
-- (algo.Charge).
function alg.charge(p, st, now, n)
  local start = window_start(now, p.per)
  local cur, prev = counts(st, start, p.per)
  st.a, st.b, st.c = start, math.min(cur + n, 2 * p.limit), prev
  redis.call('HSET', key, 'start', int(st.a), 'cur', int(st.b), 'prev', int(st.c))
  return true
end

-- idle: cur counts until two windows after start, prev until one after.
function alg.idle(p, st, now)
  if st.b > 0 then return math.max(st.a + 2 * p.per - now, 0) end
  if st.c > 0 then return math.max(st.a + p.per - now, 0) end
  return 0
end

return run(alg)
