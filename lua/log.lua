-- log.lua: the sorted-set log of sliding_log.lua and concurrency.lua.
-- Source puts it between lib.lua and their file.
--
-- KEYS[1] is a sorted set, one member per admission time (algo State.Log):
--   member  "<At>:<Cost>", the units admitted at that µs
--   score   At + shift(p): the admission time (sliding log) or the time
--           it expires (concurrency: At + P)
-- An entry is live while At > now − P. As in Go, admissions at the newest
-- entry's µs (or before it, if the clock stepped back) join that entry.

local function member(at, cost)
  return int(at) .. ':' .. int(cost)
end

local function parse(m)
  local at, cost = string.match(m, '^(%-?%d+):(%d+)$')
  return tonumber(at), tonumber(cost)
end

-- new_log returns the table alg of a log scored At + shift(p), with
-- everything but refund (and release). alg.score(p, at) is an entry's
-- score.
local function new_log(shift)
  local alg = {}

  function alg.score(p, at) return at + shift(p) end

  -- dead returns the highest score of an entry no longer live at now.
  local function dead(p, now) return now - p.per + shift(p) end

  -- load reads the live entries, oldest first; each keeps its stored
  -- member in m so that save can replace it.
  function alg.load(p, now)
    local ms = redis.call('ZRANGEBYSCORE', key, '(' .. int(dead(p, now)), '+inf')
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
      -- Wait until the oldest entries whose costs free enough room have
      -- left the window (or, in flight, expired).
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

  -- save drops the dead entries, as Go does on an admission, and writes
  -- the newest entry, the only one admissions change.
  function alg.save(p, st, now)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(dead(p, now)))
    local last = st.log[#st.log]
    if last.m then redis.call('ZREM', key, last.m) end
    last.m = member(last.at, last.cost)
    redis.call('ZADD', key, int(alg.score(p, last.at)), last.m)
  end

  -- grant removes n units from the live entries, oldest first
  -- (algo.Grant); the dead ones go too.
  function alg.grant(p, st, now, n)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(dead(p, now)))
    local log, i = st.log, 1
    while i <= #log and n > 0 do
      local en = log[i]
      local k = math.min(n, en.cost)
      n = n - k
      redis.call('ZREM', key, en.m)
      if en.cost > k then
        en.cost = en.cost - k
        en.m = member(en.at, en.cost)
        redis.call('ZADD', key, int(alg.score(p, en.at)), en.m)
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

  -- free returns the units free and the reset after a release
  -- (algo.freed): the limit less the live entries' costs, and when the
  -- newest of them expires (0 with none). st.log holds the live entries.
  function alg.free(p, st, now)
    local sum, newest = 0, 0
    for i = 1, #st.log do
      sum = sum + st.log[i].cost
      if st.log[i].at > newest then newest = st.log[i].at end
    end
    local rst = 0
    if sum > 0 then rst = newest + p.per - now end
    return math.max(p.limit - sum, 0), rst
  end

  function alg.idle(p, st, now)
    local n = #st.log
    if n == 0 then return 0 end
    return math.max(st.log[n].at + p.per - now, 0)
  end

  return alg
end
