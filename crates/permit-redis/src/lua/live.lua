-- Whether a resource is live (K-14): it has live limits or an unexpired holder.
-- KEYS[1]: live limits hash; KEYS[2]: holders ZSET; KEYS[3]: index marker.
-- ARGV[1]: '1' to forget the index marker when the resource is not live (the caller has
-- dropped it from the index, so the next holder must list it again), '0' to only read.
-- Returns 1 when live, else 0.
local t = redis.call('TIME')
local now_ms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
if redis.call('EXISTS', KEYS[1]) == 1
  or redis.call('ZCOUNT', KEYS[2], '(' .. string.format('%.0f', now_ms), '+inf') > 0 then
  return 1
end
if ARGV[1] == '1' then
  redis.call('DEL', KEYS[3])
end
return 0
