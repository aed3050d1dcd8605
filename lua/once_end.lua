end
-- once_end.lua: the end of once.lua's guard: record the op that replied.
local reply = body()
if type(reply) ~= 'table' or not reply.err then
  redis.call('SET', KEYS[2], once_mark, 'PX', ARGV[#ARGV])
end
return reply
