-- Give a permit back (K-14); purges expired holders like every call.
-- KEYS[1]: holders ZSET. ARGV[1]: owner key.
-- Returns 1 when the owner held a live permit, else 0.
local t = redis.call('TIME')
local now_ms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now_ms))
return redis.call('ZREM', KEYS[1], ARGV[1])
