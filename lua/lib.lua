-- lib.lua: the part shared by every rld script. Source prepends it to an
-- algorithm's file, which defines the table alg and ends with
-- `return run(alg)`. The calling convention is in doc.go.
--
-- Numbers are doubles. Every value of package algo is an integer of at
-- most 2^53, where doubles are exact integers, and these helpers keep it
-- so without any argument about rounding: math.fmod is exact,
-- a − fmod(a, b) is an exact multiple of b, and the quotient of an exact
-- multiple is exact. (math.floor(a/b) happens to be exact in that range
-- too, but the usual ceiling math.floor((a+b-1)/b) is not once a+b-1
-- exceeds 2^53; lib_test.go checks both claims.) Numbers go into commands
-- through int, never tostring.

local key = KEYS[1]

-- Lease accounting (algo.Op's Holder; docs/cache.md). KEYS[2], when
-- given, is a hash of the units each holder has out on lease of the key:
-- field = holder id, value = "<units>:<until µs>". ARGV[6..9] are then
-- the caller's holder id ('' for none), the units it spent from its
-- lease since its last call, when that lease was taken (µs), and its
-- leases' lifetime in µs; the op's own arguments follow them.
local lkey = KEYS[2]
local held_holder = ''
local held, held_total, held_dirty = {}, 0, false

-- quo returns Go's a / b (truncated) for integers a and b ~= 0.
local function quo(a, b)
  return (a - math.fmod(a, b)) / b
end

-- ceil_div returns ⌈a/b⌉ for a >= 0 and b > 0.
local function ceil_div(a, b)
  local r = math.fmod(a, b)
  local q = (a - r) / b
  if r > 0 then q = q + 1 end
  return q
end

-- window_start returns the start of the epoch-aligned window of length per
-- that holds t: Go's t - t%per.
local function window_start(t, per)
  return t - math.fmod(t, per)
end

-- int formats an integer for a command argument; tostring would switch to
-- exponent notation above 10^14.
local function int(x)
  return string.format('%d', x)
end

-- refund_window gives cost back to the current window's count, st.b,
-- stored in the hash field named count_field, when taken_at lies in that
-- window; once the window has moved on there is nothing left to refund.
-- It is the refund of fixed_window and sliding_counter alike.
local function refund_window(p, st, now, taken_at, cost, count_field)
  local start = window_start(now, p.per)
  if st.a ~= start or window_start(taken_at, p.per) ~= start then return false end
  st.b = math.max(st.b - cost, 0)
  redis.call('HSET', key, count_field, int(st.b))
  return true
end

-- ZERO is the slot id of the concurrency admissions that name no slot.
local ZERO = '0000000000000000'

-- slot_arg returns ARGV[i] when it is a slot id (16 lowercase hex
-- digits, not ZERO), else nil.
local function slot_arg(i)
  local s = ARGV[i]
  if type(s) ~= 'string' or #s ~= 16 or s == ZERO or not string.match(s, '^[0-9a-f]+$') then return nil end
  return s
end

-- num returns an integer from a reply or a stored field; nil is 0.
local function num(s)
  if not s then return 0 end
  return tonumber(s)
end

-- arg returns ARGV[i] as an integer, or nil when it is not one.
local function arg(i)
  local x = tonumber(ARGV[i])
  if not x or x ~= math.floor(x) then return nil end
  return x
end

-- expire sets the key's TTL to 2 × max(P, idle) µs, rounded up to ms: the
-- key outlives the time until its state is idle (equivalent to a missing
-- key), so expiry never changes a decision.
local function expire(p, idle)
  redis.call('PEXPIRE', key, int(ceil_div(2 * math.max(p.per, idle), 1000)))
end

-- held_load reads lkey's live entries into held at now, dropping those
-- that lapsed (algo's outsLive), and applies the holder's spent units
-- (spent 0 when they no longer count: algo.LeaseCounts).
local function held_load(now, holder, spent)
  held_holder = holder
  local v = redis.call('HGETALL', lkey)
  for i = 1, #v, 2 do
    local u, untl = string.match(v[i + 1], '^(%d+):(%d+)$')
    u, untl = tonumber(u), tonumber(untl)
    if u and u > 0 and untl > now then
      held[v[i]] = {u, untl}
      held_total = held_total + u
    else
      redis.call('HDEL', lkey, v[i])
    end
  end
  local own = held[holder]
  if holder ~= '' and spent ~= 0 and own then
    local u = math.max(own[1] - spent, 0)
    held_total, own[1], held_dirty = held_total - own[1] + u, u, true
  end
end

-- held_own returns the units holder has out.
local function held_own(holder)
  local own = held[holder]
  if own then return own[1] end
  return 0
end

-- held_add adds n units (n may be negative) to holder's entry, not below
-- 0, moving its until to untl when later (algo's outAdd).
local function held_add(holder, n, untl)
  local own = held[holder]
  if not own or own[1] == 0 then
    -- An entry left with nothing is gone: a grant starts a new one.
    if n <= 0 then return end
    own = {0, untl}
    held[holder] = own
  end
  own[1], own[2] = math.max(own[1] + n, 0), math.max(own[2], untl)
  held_dirty = true
end

-- held_save writes the holder's entry back when it changed: an op
-- changes no other entry (held_load has dropped those that lapsed). The
-- hash is kept until the entry lapses; its TTL is set to twice that when
-- it falls short, so that the following writes need no PEXPIRE. An entry
-- that lapsed counts as missing, so a longer TTL changes no decision.
local function held_save(now)
  if not held_dirty then return end
  local own = held[held_holder]
  if not own or own[1] <= 0 then
    redis.call('HDEL', lkey, held_holder)
    return
  end
  redis.call('HSET', lkey, held_holder, int(own[1]) .. ':' .. int(own[2]))
  local ttl = ceil_div(own[2] - now, 1000)
  if ttl > 0 and redis.call('PTTL', lkey) < ttl then
    redis.call('PEXPIRE', lkey, int(2 * ttl))
  end
end

-- grant leases the largest g <= want (want >= 1) that a take would allow
-- at now and consumes it from st, in memory (algo.Lease). It returns g,
-- remaining and reset after the grant, and retry 0; or, when nothing
-- fits, 0 and the reply of a take of cost 1 (st untouched).
local function grant(alg, p, st, now, want)
  local ok, rem, rst, ret = alg.decide(p, st, now, 1, true)
  if not ok then
    return 0, rem, rst, ret
  end
  -- Remaining is exact: after a cost of 1, rem more units fit.
  local g = math.min(want, rem + 1)
  ok, rem, rst = alg.decide(p, st, now, g, false)
  if not ok then
    error('rld: BUG: a lease within remaining was denied')
  end
  return g, rem, rst, 0
end

-- run executes ARGV's operation with the algorithm alg, which provides:
--   alg.burst                          true if ARGV[4] sets the capacity
--   alg.load(p, now) -> st             the key's state (missing: fresh)
--   alg.decide(p, st, now, cost, peek) -> allowed, remaining, reset, retry
--                                      algo.Decide; updates st (in memory)
--                                      when allowed and not peek; retry -1
--                                      is algo.Never
--   alg.save(p, st, now)               writes st after admissions
--   alg.refund(p, st, now, taken_at, cost) -> wrote
--                                      algo.Refund, written and applied to st
--   alg.grant(p, st, now, n) -> wrote
--                                      optional: algo.Grant, when it is not
--                                      alg.refund of n units taken at now
--   alg.charge(p, st, now, n) -> wrote  algo.Charge, written and applied to st
--   alg.release(p, st, now, at, cost, slot) -> released
--                                      optional (concurrency): algo.Release
--   alg.acquire(p, st, now, slot) -> allowed, remaining, reset, retry, at
--                                      optional (concurrency): algo.Acquire;
--                                      updates st (in memory) when allowed
--   alg.idle(p, st, now) -> µs         an upper bound of the time until st
--                                      is idle, for the TTL
local function run(alg)
  local op = ARGV[1]
  local limit, per, burst, now = arg(2), arg(3), arg(4), arg(5)
  if not (limit and per and burst and now) or limit < 1 or per < 1 or burst < 0 or now < 0 then
    return redis.error_reply('ERR rld: want ARGV limit >= 1, period_us >= 1, burst >= 0, now_us >= 0')
  end
  if now == 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local p = {limit = limit, per = per, cap = limit}
  if alg.burst and burst > 0 then p.cap = burst end
  -- lease_counts is algo.LeaseCounts: alg.window is how many windows a
  -- windowed algorithm's leased units count in.
  local function lease_counts(at)
    if alg.window == 1 then return window_start(at, per) == window_start(now, per) end
    if alg.window == 2 then return window_start(at, per) >= window_start(now, per) - per end
    return true
  end
  -- o: the op's arguments start at ARGV[o + 1].
  local o, holder, life = 5, '', 0
  if lkey then
    o, holder, life = 9, ARGV[6], arg(9)
    local spent, spent_at = arg(7), arg(8)
    if not (spent and spent_at and life and life >= 0) then
      return redis.error_reply('ERR rld: want ARGV spent, spent_at and lease life >= 0 with KEYS[2]')
    end
    if not lease_counts(spent_at) then spent = 0 end
    if holder ~= '' or op == 'reset' then held_load(now, holder, spent) end
  end
  -- lease_until is algo.LeaseUntil.
  local function lease_until()
    local untl = now + life
    if alg.window then untl = math.min(untl, window_start(now, per) + alg.window * per) end
    return untl
  end

  if op == 'take' or op == 'takelease' then
    -- takelease: ARGV[o + 1] is want, the costs follow.
    local first, want = o + 1, 0
    if op == 'takelease' then
      first, want = o + 2, arg(o + 1)
      if not want or want < 0 then
        return redis.error_reply('ERR rld: takelease wants want >= 0')
      end
    end
    if #ARGV < first then
      return redis.error_reply('ERR rld: ' .. op .. ' wants at least one cost')
    end
    local st = alg.load(p, now)
    local admitted, remaining, reset, retry = 0, 0, 0, 0
    for i = first, #ARGV do
      local cost = arg(i)
      if not cost then
        return redis.error_reply('ERR rld: bad cost ' .. tostring(ARGV[i]))
      end
      local ok, rem, rst, ret = alg.decide(p, st, now, math.max(cost, 1), false)
      if ok or admitted == 0 then remaining, reset = rem, rst end
      if not ok then
        retry = ret
        break
      end
      admitted = admitted + 1
    end
    local leased, parked = 0, 0
    if admitted == #ARGV - first + 1 and want > 0 then
      local g, rem, rst = grant(alg, p, st, now, want)
      if g > 0 then
        leased, remaining, reset = g, rem, rst
        if holder ~= '' then held_add(holder, g, lease_until()) end
      end
    end
    if admitted < #ARGV - first + 1 and holder ~= '' then
      -- The caller's own units count too: its return may be on its way.
      parked = held_total
    end
    if admitted > 0 then
      alg.save(p, st, now)
      expire(p, alg.idle(p, st, now))
    end
    held_save(now)
    if op == 'takelease' then
      return {admitted, remaining, reset, retry, now, leased, parked}
    end
    return {admitted, remaining, reset, retry, now}
  end

  if op == 'acquire' and alg.acquire then
    -- algo.AcquireBatch: ARGV[o + 1..] are the slot ids, one slot each.
    if #ARGV < o + 1 then
      return redis.error_reply('ERR rld: acquire wants at least one slot id')
    end
    for i = o + 1, #ARGV do
      if not slot_arg(i) then
        return redis.error_reply('ERR rld: bad slot id ' .. tostring(ARGV[i]) .. ' (want 16 lowercase hex digits, not all 0)')
      end
    end
    local st = alg.load(p, now)
    local admitted, remaining, reset, retry, at = 0, 0, 0, 0, now
    for i = o + 1, #ARGV do
      local ok, rem, rst, ret, a = alg.acquire(p, st, now, ARGV[i])
      if ok or admitted == 0 then remaining, reset = rem, rst end
      if not ok then
        retry = ret
        break
      end
      admitted, at = admitted + 1, a
    end
    if admitted > 0 then
      alg.save(p, st, now)
      expire(p, alg.idle(p, st, now))
    end
    held_save(now)
    return {admitted, remaining, reset, retry, at}
  end

  if op == 'reset' then
    -- A fresh key is a missing one, less what is out on lease.
    redis.call('DEL', key)
    local st = alg.load(p, now)
    if held_total > 0 and grant(alg, p, st, now, held_total) > 0 then
      alg.save(p, st, now)
      expire(p, alg.idle(p, st, now))
    end
    held_save(now)
    local _, rem, rst = alg.decide(p, st, now, 1, true)
    return {0, rem, rst, 0, now}
  end

  local x = arg(o + 1)
  if not x then
    return redis.error_reply('ERR rld: bad or missing ARGV[' .. (o + 1) .. ']')
  end
  x = math.max(x, 1)
  local st = alg.load(p, now)

  if op == 'peek' then
    local ok, rem, rst, ret = alg.decide(p, st, now, x, true)
    held_save(now)
    return {ok and 1 or 0, rem, rst, ret, now}
  elseif op == 'lease' then
    local granted, rem, rst, ret = grant(alg, p, st, now, x)
    if granted > 0 then
      alg.save(p, st, now)
      expire(p, alg.idle(p, st, now))
      if holder ~= '' then held_add(holder, granted, lease_until()) end
    end
    held_save(now)
    return {granted, rem, rst, ret, now}
  elseif op == 'refund' then
    local taken_at = arg(o + 2)
    if not taken_at then
      return redis.error_reply('ERR rld: bad or missing takenAt')
    end
    if holder ~= '' then
      -- A lease's return: no more than the holder has out, and nothing
      -- when its units no longer count.
      if lease_counts(taken_at) then
        x = math.min(x, held_own(holder))
        held_add(holder, -x, 0)
      else
        x = 0
      end
    end
    if x > 0 and alg.refund(p, st, now, taken_at, math.min(x, p.cap)) then
      expire(p, alg.idle(p, st, now))
    end
    held_save(now)
    local _, rem, rst = alg.decide(p, st, now, 1, true)
    return {0, rem, rst, 0, now}
  elseif op == 'grant' then
    -- algo.Grant: a refund of units taken now, unless the algorithm
    -- defines its own.
    local wrote
    if alg.grant then
      wrote = alg.grant(p, st, now, math.min(x, p.cap))
    else
      wrote = alg.refund(p, st, now, now, math.min(x, p.cap))
    end
    if wrote then
      expire(p, alg.idle(p, st, now))
    end
    held_save(now)
    local _, rem, rst = alg.decide(p, st, now, 1, true)
    return {0, rem, rst, 0, now}
  elseif op == 'charge' then
    -- algo.Charge: n units whatever they fit, at most the capacity; the
    -- reply's retry is that of a peek of cost 1 after it.
    if alg.charge(p, st, now, math.min(x, p.cap)) then
      expire(p, alg.idle(p, st, now))
    end
    held_save(now)
    local _, rem, rst, ret = alg.decide(p, st, now, 1, true)
    return {0, rem, rst, ret, now}
  elseif op == 'release' and alg.release then
    -- algo.Release: the op's second argument is the admission's time,
    -- the optional third its slot id (none: ZERO).
    local at = arg(o + 2)
    if not at then
      return redis.error_reply('ERR rld: bad or missing lease id')
    end
    local slot = ZERO
    if ARGV[o + 3] then
      slot = slot_arg(o + 3)
      if not slot then
        return redis.error_reply('ERR rld: bad slot id ' .. tostring(ARGV[o + 3]) .. ' (want 16 lowercase hex digits, not all 0)')
      end
    end
    local released = alg.release(p, st, now, at, x, slot)
    if released then
      expire(p, alg.idle(p, st, now))
    end
    held_save(now)
    local rem, rst = alg.free(p, st, now)
    return {released and 1 or 0, rem, rst, 0, now}
  end
  return redis.error_reply('ERR rld: unknown op ' .. tostring(op) .. ' (want take, takelease, peek, lease, refund, reset, grant, charge, or for concurrency acquire or release)')
end
