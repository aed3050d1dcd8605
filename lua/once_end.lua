end
-- once_end.lua: the end of once.lua's guard: record the op that replied.
local reply = body()
if type(reply) ~= 'table' or not reply.err then
  redis.call('SET', once_key, once_mark, 'PX', once_life)
end
return reply
