-- concurrency.lua: algo's Concurrency. Source prepends lib.lua.
--
-- KEYS[1] is a sorted set of the admissions in flight (algo State.Log), one
-- member per admission time:
--   score   the time the admission expires: At + P (P: the rule's timeout)
--   member  "<At>:<Cost>", the slots held by the admissions at that µs
-- At is the lease id that a release names. As in Go, admissions at the
-- newest entry's µs (or before it, if the clock stepped back) join that
-- entry. An admission is in flight while its score is after now; the
-- expired ones are dropped before every write. A missing key holds no
-- slot.

local alg = {}

local function member(at, cost)
  return int(at) .. ':' .. int(cost)
end

local function parse(m)
  local at, cost = string.match(m, '^(%-?%d+):(%d+)$')
  return tonumber(at), tonumber(cost)
end

-- load reads the admissions in flight, oldest first; each keeps its
-- stored member in m so that a write can replace it.
function alg.load(p, now)
  local ms = redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf')
  local log = {}
  for i, m in ipairs(ms) do
    local at, cost = parse(m)
    log[i] = {at = at, cost = cost, m = m}
  end
  return {log = log}
end

function alg.decide(p, st, now, cost, peek)
  local per, limit, log = p.per, p.limit, st.log
  local n, sum = #log, 0
  for i = 1, n do sum = sum + log[i].cost end
  local newest = 0
  if n > 0 then newest = log[n].at end
  local allowed, retry = false, 0
  if cost > limit then
    retry = -1
  elseif sum + cost <= limit then
    sum = sum + cost
    allowed = true
    if n == 0 or newest < now then newest = now end
    if not peek then
      if n > 0 and log[n].at >= now then
        log[n].cost = log[n].cost + cost
      else
        log[n + 1] = {at = now, cost = cost}
      end
    end
  else
    -- Wait until the oldest admissions whose slots free enough room
    -- have expired.
    local need = sum + cost - limit
    for i = 1, n do
      need = need - log[i].cost
      if need <= 0 then
        retry = log[i].at + per - now
        break
      end
    end
  end
  local reset = 0
  if sum > 0 then reset = newest + per - now end
  return allowed, math.max(limit - sum, 0), reset, retry
end

-- save drops the expired admissions and writes the newest entry, the only
-- one an acquire changes.
function alg.save(p, st, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  local last = st.log[#st.log]
  if last.m then redis.call('ZREM', key, last.m) end
  last.m = member(last.at, last.cost)
  redis.call('ZADD', key, int(last.at + p.per), last.m)
end

-- take_off removes cost slots from the entry en of st.log (index i) in
-- Redis and in st.
local function take_off(p, st, i, en, cost)
  redis.call('ZREM', key, en.m)
  local left = en.cost - cost
  if left > 0 then
    en.cost, en.m = left, member(en.at, left)
    redis.call('ZADD', key, int(en.at + p.per), en.m)
  else
    table.remove(st.log, i)
  end
end

-- refund gives back cost slots of the admission at taken_at, as the
-- undoing of a take when another rule of the check denied (algo.Refund).
function alg.refund(p, st, now, taken_at, cost)
  local ms = redis.call('ZRANGEBYSCORE', key, int(taken_at + p.per), int(taken_at + p.per))
  if #ms == 0 then return false end
  local at, left = parse(ms[1])
  for i, en in ipairs(st.log) do
    if en.at == at then
      take_off(p, st, i, en, cost)
      return true
    end
  end
  -- Expired: not in st, as in Go's log until the next admission.
  redis.call('ZREM', key, ms[1])
  if left > cost then
    redis.call('ZADD', key, int(at + p.per), member(at, left - cost))
  end
  return true
end

-- release gives back cost slots of the admission at at, its lease id, if
-- it is still in flight (algo.Release), and reports whether it was.
function alg.release(p, st, now, at, cost)
  for i, en in ipairs(st.log) do
    if en.at == at then
      take_off(p, st, i, en, cost)
      return true
    end
  end
  return false
end

-- grant frees n slots, oldest first (algo.Grant); the expired ones go too.
function alg.grant(p, st, now, n)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  local log, i = st.log, 1
  while i <= #log and n > 0 do
    local en = log[i]
    local k = math.min(n, en.cost)
    n = n - k
    redis.call('ZREM', key, en.m)
    if en.cost > k then
      en.cost = en.cost - k
      en.m = member(en.at, en.cost)
      redis.call('ZADD', key, int(en.at + p.per), en.m)
      break
    end
    i = i + 1
  end
  local rest = {}
  for j = i, #log do
    if log[j].cost > 0 then rest[#rest + 1] = log[j] end
  end
  st.log = rest
  return true
end

-- charge logs n units at now, as an admission would, up to 2×L live
-- units (algo.Charge). st.log holds the live entries.
function alg.charge(p, st, now, n)
  local sum, log = 0, st.log
  for i = 1, #log do sum = sum + log[i].cost end
  local add = math.min(n, 2 * p.limit - sum)
  if add <= 0 then return false end
  if #log > 0 and log[#log].at >= now then
    log[#log].cost = log[#log].cost + add
  else
    log[#log + 1] = {at = now, cost = add}
  end
  alg.save(p, st, now)
  return true
end

function alg.idle(p, st, now)
  local n = #st.log
  if n == 0 then return 0 end
  return math.max(st.log[n].at + p.per - now, 0)
end

return run(alg)
