-- concurrency.lua: algo's Concurrency. Source prepends lib.lua and
-- log.lua.
--
-- KEYS[1] is log.lua's sorted set of the admissions in flight, each
-- scored by the time it expires, At + P (P: the rule's timeout); a
-- member's cost is the slots its admissions hold. At is the lease id that
-- a release names. An admission is in flight while its score is after
-- now; the expired ones are dropped before every write. A missing key
-- holds no slot.

local alg = new_log(function(p) return p.per end)

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

return run(alg)
