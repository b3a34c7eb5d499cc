-- Write a resource's live limits (K-14) and register it in the resource index, atomically.
-- KEYS[1]: live limits hash; KEYS[2]: resource index ZSET (member resource name, score 0).
-- ARGV[1], ARGV[2]: max_concurrency, max_starts_per_second (0 = unlimited); ARGV[3]: the
-- resource name. Returns 1.
local mc = tonumber(ARGV[1])
local ms = tonumber(ARGV[2])
if not mc or not ms or mc < 0 or ms < 0 or mc ~= math.floor(mc) or ms ~= math.floor(ms) then
  return redis.error_reply('ERR invalid permit limits for ' .. KEYS[1])
end
redis.call('HSET', KEYS[1], 'max_concurrency', ARGV[1], 'max_starts_per_second', ARGV[2])
redis.call('ZADD', KEYS[2], 'NX', 0, ARGV[3])
-- Live limits never expire, so neither does the index that lists them.
redis.call('PERSIST', KEYS[2])
return 1
