-- once.lua: the guard of an op applied at most once (algo.Op.Once).
-- OnceSource builds the script: this file, then the algorithm's script
-- (lib.lua and its file) as the function body, then once_end.lua.
--
-- KEYS[2] is the op's record, a string in KEYS[1]'s hash slot; the last
-- two ARGV are the mark to record (an integer) and how long to keep it,
-- in ms (>= 1). When the record exists, the op was applied already: the
-- script replies the error RLDAPPLIED (the same mark) or RLDCONFLICT
-- (another) and changes nothing. Else it runs the op, and records it
-- once the op has replied without an error: an op that failed may be
-- sent again.

local once_mark = ARGV[#ARGV - 1]
local once_seen = redis.call('GET', KEYS[2])
if once_seen then
  if once_seen == once_mark then
    return redis.error_reply('RLDAPPLIED rld: op applied already')
  end
  return redis.error_reply('RLDCONFLICT rld: op applied already, with mark ' .. once_seen)
end
local function body()
