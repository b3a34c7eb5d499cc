-- Delete up to ARGV[3] result-cache entries whose expiry score is <= ARGV[2], earliest
-- first; returns how many entries were still held (an entry Redis already expired is only
-- dropped from the ZSET).
-- KEYS[1] expiry ZSET
-- ARGV[1] entry key prefix (`<prefix>:{<prefix>:cache}:e:`, the slot of KEYS[1]), ARGV[2] now,
-- ARGV[3] limit
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local deleted = 0
for _, m in ipairs(members) do
  deleted = deleted + redis.call('DEL', ARGV[1] .. m)
  redis.call('ZREM', KEYS[1], m)
end
return deleted
