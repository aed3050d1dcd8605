-- once.lua: the guard of an op applied at most once (algo.Op.Once).
-- OnceSource prepends it to lib.lua and an algorithm's file.
--
-- KEYS[2] is the op's record, a string in KEYS[1]'s hash slot; the last
-- ARGV is how long to keep it, in ms (>= 1). When the record exists, the
-- op was applied already: the script replies the error RLDAPPLIED and
-- changes nothing; else it writes the record and runs the op.

if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[#ARGV]) then
  return redis.error_reply('RLDAPPLIED rld: op applied already')
end
