-- sliding_log.lua: algo's SlidingLog. Source prepends lib.lua and
-- log.lua: KEYS[1] is log.lua's sorted set, scored by the admission time
-- At, unix µs. A missing key has admitted nothing.

local alg = new_log(function(p) return 0 end)

-- refund gives back cost units of the entry at taken_at (algo.Refund).
function alg.refund(p, st, now, taken_at, cost)
  local ms = redis.call('ZRANGEBYSCORE', key, int(taken_at), int(taken_at))
  if #ms == 0 then return false end
  local at, left = parse(ms[1])
  left = left - cost
  redis.call('ZREM', key, ms[1])
  local m
  if left > 0 then
    m = member(at, left)
    redis.call('ZADD', key, int(at), m)
  end
  for i, en in ipairs(st.log) do
    if en.at == at then
      if left > 0 then
        en.cost, en.m = left, m
      else
        table.remove(st.log, i)
      end
      break
    end
  end
  return true
end

return run(alg)
