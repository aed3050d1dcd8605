-- once.lua: the guard of an op applied at most once (algo.Op.Once).
-- OnceSource prepends it to lib.lua and an algorithm's file.
--
-- KEYS[2] is the op's record, a string in KEYS[1]'s hash slot; the last
-- two ARGV are the mark to record (an integer) and how long to keep it,
-- in ms (>= 1). When the record exists, the op was applied already: the
-- script replies the error RLDAPPLIED (the same mark) or RLDCONFLICT
-- (another) and changes nothing; else it writes the record and runs the
-- op.

local mark = ARGV[#ARGV - 1]
local seen = redis.call('GET', KEYS[2])
if seen then
  if seen == mark then
    return redis.error_reply('RLDAPPLIED rld: op applied already')
  end
  return redis.error_reply('RLDCONFLICT rld: op applied already, with mark ' .. seen)
end
redis.call('SET', KEYS[2], mark, 'PX', ARGV[#ARGV])
