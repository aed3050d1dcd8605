-- concurrency.lua: algo's Concurrency. Source prepends lib.lua and
-- log.lua.
--
-- KEYS[1] is log.lua's sorted set of the admissions in flight, each
-- scored by the time it expires, At + P (P: the rule's timeout); a
-- member's cost is the slots its admissions hold. An acquire holds one
-- slot per id it is given, each its own member "<At>:<Slot>:1"; a
-- release names the member by At and Slot, and frees no other. An
-- admission is in flight while its score is after now; the expired ones
-- are dropped before every write. A missing key holds no slot.

local alg = new_log(function(p) return p.per end, true)

-- take_off removes cost slots from the entry en of st.log (index i) in
-- Redis and in st.
local function take_off(p, st, i, en, cost)
  redis.call('ZREM', key, en.m)
  local left = en.cost - cost
  if left > 0 then
    en.cost, en.m = left, member(en.at, left, en.slot)
    redis.call('ZADD', key, int(en.at + p.per), en.m)
  else
    table.remove(st.log, i)
  end
end

-- refund gives back cost slots of the last entry at taken_at, as the
-- undoing of a take when another rule of the check denied (algo.Refund).
function alg.refund(p, st, now, taken_at, cost)
  local ms = redis.call('ZRANGEBYSCORE', key, int(taken_at + p.per), int(taken_at + p.per))
  if #ms == 0 then return false end
  local m = ms[#ms]
  for i, en in ipairs(st.log) do
    if en.m == m then
      take_off(p, st, i, en, cost)
      return true
    end
  end
  -- Expired: not in st, as in Go's log until the next admission.
  local at, left, slot = parse(m)
  redis.call('ZREM', key, m)
  if left > cost then
    redis.call('ZADD', key, int(at + p.per), member(at, left - cost, slot))
  end
  return true
end

-- release gives back cost slots of the admission at at with the slot id
-- slot (ZERO: one with none), if it is still in flight (algo.Release),
-- and reports whether it was.
function alg.release(p, st, now, at, cost, slot)
  for i, en in ipairs(st.log) do
    if en.at == at and en.slot == slot then
      take_off(p, st, i, en, cost)
      return true
    end
  end
  return false
end

-- acquire holds one slot named slot at now when it fits (algo.Acquire):
-- at the newest entry's µs when that is later than now, in (At, Slot)
-- order. It returns the decision and the slot's time.
function alg.acquire(p, st, now, slot)
  local ok, rem, rst, ret = alg.decide(p, st, now, 1, true)
  if not ok then return false, rem, rst, ret, now end
  local log = st.log
  local n = #log
  local at = now
  if n > 0 and log[n].at > at then at = log[n].at end
  local i = n + 1
  while i > 1 and log[i - 1].at == at and log[i - 1].slot > slot do i = i - 1 end
  table.insert(log, i, {at = at, cost = 1, slot = slot})
  return true, rem, rst, 0, at
end

return run(alg)
