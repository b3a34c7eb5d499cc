-- Append frames to a stream unless it is terminal (K-16).
-- KEYS[1] frames list, KEYS[2] terminal reference, KEYS[3] generation
-- ARGV[1] frames TTL (ms), ARGV[2] generation TTL (ms), ARGV[3..] encoded records
-- Returns {offset of the first appended frame, generation}; offset -1 when terminal.
local gen = tonumber(redis.call('GET', KEYS[3]) or '0')
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {-1, gen}
end
local count = #ARGV - 2
local len = redis.call('RPUSH', KEYS[1], unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return {len - count, gen}
