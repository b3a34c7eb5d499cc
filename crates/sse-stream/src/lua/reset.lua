-- Clear frames and terminal reference, bump the generation (K-16), unless a newer owner
-- wrote: a zombie's reset must not wipe its successor's frames or terminal reference.
-- KEYS[1] frames list, KEYS[2] terminal reference, KEYS[3] generation, KEYS[4] owner
-- ARGV[1] generation TTL (ms), ARGV[2] owner (its lease end, ms)
-- Returns the new generation (>= 1), or -1 when refused (nothing changed).
local owner = redis.call('GET', KEYS[4])
if owner and tonumber(owner) > tonumber(ARGV[2]) then
  return -1
end
redis.call('DEL', KEYS[1], KEYS[2])
local gen = redis.call('INCR', KEYS[3])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
redis.call('SET', KEYS[4], ARGV[2], 'PX', ARGV[1])
return gen
