-- Live holders of a resource after purging expired ones (a diagnostic).
-- KEYS[1]: holders ZSET. Returns the owner keys.
local t = redis.call('TIME')
local now_ms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now_ms))
return redis.call('ZRANGE', KEYS[1], 0, -1)
