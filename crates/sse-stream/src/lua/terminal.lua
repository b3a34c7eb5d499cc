-- Terminal frame + terminal reference (K-16), once per generation, unless a newer owner
-- wrote.
-- KEYS[1] frames list, KEYS[2] terminal reference, KEYS[3] generation, KEYS[4] owner
-- ARGV[1] terminal record, ARGV[2] frames read-out TTL (ms), ARGV[3] reconnect TTL (ms),
-- ARGV[4] owner (its lease end, ms), ARGV[5..] records to flush before the terminal frame
-- (pending text)
-- Returns the terminal frame's offset, -1 when the stream already was terminal, -2 when
-- the stream's owner is newer than ARGV[4].
local owner = redis.call('GET', KEYS[4])
if owner and tonumber(owner) > tonumber(ARGV[4]) then
  return -2
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return -1
end
local len
if #ARGV > 4 then
  redis.call('RPUSH', KEYS[1], unpack(ARGV, 5))
end
len = redis.call('RPUSH', KEYS[1], ARGV[1])
-- Only the frames get the short read-out window; the reference, the generation and the
-- owner keep the reconnect TTL so a late client still gets the final result.
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
else
  redis.call('SET', KEYS[3], '0', 'PX', ARGV[3])
end
redis.call('SET', KEYS[4], ARGV[4], 'PX', ARGV[3])
return len - 1
