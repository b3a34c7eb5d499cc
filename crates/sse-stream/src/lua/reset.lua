-- Clear frames and terminal reference, bump the generation (K-16).
-- KEYS[1] frames list, KEYS[2] terminal reference, KEYS[3] generation
-- ARGV[1] generation TTL (ms)
-- Returns the new generation.
redis.call('DEL', KEYS[1], KEYS[2])
local gen = redis.call('INCR', KEYS[3])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return gen
