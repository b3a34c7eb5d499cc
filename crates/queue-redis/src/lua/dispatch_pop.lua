-- Remove and return up to ARGV[2] dispatch candidates due at ARGV[1] (K-11.3).
-- KEYS[1]: candidate ZSET.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then
  redis.call('ZREM', KEYS[1], unpack(due))
end
return due
