-- once.lua: the guard of an op applied at most once (algo.Op.Once).
-- OnceSource builds the script: this file, then the algorithm's script
-- (lib.lua and its file) as the function body, then once_end.lua.
--
-- The last KEYS is the op's record, a string in KEYS[1]'s hash slot; the last
-- two ARGV are the mark to record (an integer) and how long to keep it,
-- in ms (>= 1). When the record exists, the op was applied already: the
-- script replies the error RLDAPPLIED (the same mark) or RLDCONFLICT
-- (another) and changes nothing. Else it runs the op, and records it
-- once the op has replied without an error: an op that failed may be
-- sent again.

-- The record's key and the last two ARGV are the guard's: the body sees
-- the op's own KEYS and ARGV, as without the guard.
local once_key, once_mark, once_life = KEYS[#KEYS], ARGV[#ARGV - 1], ARGV[#ARGV]
KEYS[#KEYS] = nil
ARGV[#ARGV] = nil
ARGV[#ARGV] = nil
local once_seen = redis.call('GET', once_key)
if once_seen then
  if once_seen == once_mark then
    return redis.error_reply('RLDAPPLIED rld: op applied already')
  end
  return redis.error_reply('RLDCONFLICT rld: op applied already, with mark ' .. once_seen)
end
local function body()
