-- List a resource in the resource index (K-14), written apart from the resource's own keys.
-- KEYS[1]: resource index ZSET (member resource name, score 0, read in name order).
-- ARGV[1]: the resource name; ARGV[2]: 'persist' (live limits were set: the index never
-- expires again), or the Redis time (ms) until which a holder needs the resource listed.
-- An index only holders keep (no expiry set: -2 before it exists, a TTL after) lives until
-- the last such time it was given; one made persistent (-1) stays so. Returns 1.
local ttl = redis.call('PTTL', KEYS[1])
redis.call('ZADD', KEYS[1], 'NX', 0, ARGV[1])
if ARGV[2] == 'persist' then
  redis.call('PERSIST', KEYS[1])
  return 1
end
if ttl ~= -1 then
  local t = redis.call('TIME')
  local now_ms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
  local want = tonumber(ARGV[2]) - now_ms
  if want > 0 and ttl < want then
    redis.call('PEXPIRE', KEYS[1], string.format('%.0f', want))
  end
end
return 1
