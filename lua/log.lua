-- log.lua: the sorted-set log of sliding_log.lua and concurrency.lua.
-- Source puts it between lib.lua and their file.
--
-- KEYS[1] is a sorted set, one member per entry of algo State.Log:
--   member  "<At>:<Cost>", the units admitted at that µs (sliding log);
--           "<At>:<Slot>:<Cost>" for concurrency (new_log's slotted):
--           Slot is the 16 hex digits of an acquired slot's id, whose
--           entry is its own, or ZERO for the entry of the admissions
--           with none at that µs (a take, a charge). A concurrency
--           member "<At>:<Cost>" reads as Slot ZERO.
--   score   At + shift(p): the admission time (sliding log) or the time
--           it expires (concurrency: At + P)
-- An entry is live while At > now − P. As in Go, admissions with no slot
-- at the newest entry's µs (or before it, if the clock stepped back) join
-- that µs's entry with no slot; the members of one score sort by Slot,
-- the entries' order in Go.

-- slotted: the members name their slot (concurrency.lua).
local slotted = false

local function member(at, cost, slot)
  if slotted then
    return int(at) .. ':' .. (slot or ZERO) .. ':' .. int(cost)
  end
  return int(at) .. ':' .. int(cost)
end

-- parse returns a member's At, Cost and Slot (ZERO for none).
local function parse(m)
  local at, slot, cost = string.match(m, '^(%-?%d+):(%x+):(%d+)$')
  if at then return tonumber(at), tonumber(cost), slot end
  at, cost = string.match(m, '^(%-?%d+):(%d+)$')
  return tonumber(at), tonumber(cost), ZERO
end

-- join records cost units with no slot at now in log (algo's appendLog):
-- at the newest entry's µs when it is not before now, in that µs's entry
-- with no slot, the first of the µs.
local function join(log, now, cost)
  local n = #log
  if n == 0 or log[n].at < now then
    log[n + 1] = {at = now, cost = cost, slot = ZERO}
    return
  end
  local at, i = log[n].at, n
  while i > 1 and log[i - 1].at == at do i = i - 1 end
  if log[i].slot == ZERO then
    log[i].cost, log[i].dirty = log[i].cost + cost, true
  else
    table.insert(log, i, {at = at, cost = cost, slot = ZERO})
  end
end

-- new_log returns the table alg of a log scored At + shift(p), with
-- everything but refund (and release, acquire); its members name their
-- slots when slots is true. alg.score(p, at) is an entry's score.
local function new_log(shift, slots)
  local alg = {}
  slotted = slots or false

  function alg.score(p, at) return at + shift(p) end

  -- dead returns the highest score of an entry no longer live at now.
  local function dead(p, now) return now - p.per + shift(p) end

  -- load reads the live entries, oldest first; each keeps its stored
  -- member in m so that save can replace it.
  function alg.load(p, now)
    local ms = redis.call('ZRANGEBYSCORE', key, '(' .. int(dead(p, now)), '+inf')
    local log = {}
    for i, m in ipairs(ms) do
      local at, cost, slot = parse(m)
      log[i] = {at = at, cost = cost, slot = slot, m = m}
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
      if not peek then join(log, now, cost) end
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
  -- the entries of the newest µs that are new or changed: the only ones
  -- admissions change.
  function alg.save(p, st, now)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(dead(p, now)))
    local log = st.log
    local n = #log
    local i = n
    while i >= 1 and log[i].at == log[n].at do
      local en = log[i]
      if not en.m or en.dirty then
        if en.m then redis.call('ZREM', key, en.m) end
        en.m, en.dirty = member(en.at, en.cost, en.slot), nil
        redis.call('ZADD', key, int(alg.score(p, en.at)), en.m)
      end
      i = i - 1
    end
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
        en.m = member(en.at, en.cost, en.slot)
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
    join(log, now, add)
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
