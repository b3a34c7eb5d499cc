-- Write a resource's live limits (K-14). The caller then lists the resource in the index
-- (index.lua with ARGV[2] = 'persist'): another key, in another hash slot on a cluster.
-- KEYS[1]: live limits hash. ARGV[1], ARGV[2]: max_concurrency, max_starts_per_second
-- (0 = unlimited). Returns 1.
local mc = tonumber(ARGV[1])
local ms = tonumber(ARGV[2])
if not mc or not ms or mc < 0 or ms < 0 or mc ~= math.floor(mc) or ms ~= math.floor(ms) then
  return redis.error_reply('ERR invalid permit limits for ' .. KEYS[1])
end
redis.call('HSET', KEYS[1], 'max_concurrency', ARGV[1], 'max_starts_per_second', ARGV[2])
return 1
