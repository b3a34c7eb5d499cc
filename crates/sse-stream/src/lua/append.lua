-- Append frames to a stream unless it is terminal or a newer owner wrote (K-16).
-- KEYS[1] frames list, KEYS[2] terminal reference, KEYS[3] generation, KEYS[4] owner
-- ARGV[1] frames TTL (ms), ARGV[2] generation TTL (ms), ARGV[3] owner (its lease end, ms),
-- ARGV[4] most frames of one generation, ARGV[5..] encoded records
-- Returns {offset of the first appended frame, generation}; offset -1 when terminal, -2
-- when the stream's owner is newer than ARGV[3] (a zombie's append: nothing written), -3
-- when the records would take the generation beyond ARGV[4] frames (nothing written).
local gen = tonumber(redis.call('GET', KEYS[3]) or '0')
local owner = redis.call('GET', KEYS[4])
if owner and tonumber(owner) > tonumber(ARGV[3]) then
  return {-2, gen}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {-1, gen}
end
local count = #ARGV - 4
if redis.call('LLEN', KEYS[1]) + count > tonumber(ARGV[4]) then
  return {-3, gen}
end
local len = redis.call('RPUSH', KEYS[1], unpack(ARGV, 5))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
redis.call('SET', KEYS[4], ARGV[3], 'PX', ARGV[2])
return {len - count, gen}
