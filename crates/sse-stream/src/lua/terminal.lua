-- Terminal frame + terminal reference (K-16), once per generation.
-- KEYS[1] frames list, KEYS[2] terminal reference, KEYS[3] generation
-- ARGV[1] terminal record, ARGV[2] frames read-out TTL (ms), ARGV[3] reconnect TTL (ms),
-- ARGV[4..] records to flush before the terminal frame (pending text)
-- Returns the terminal frame's offset, or -1 when the stream already was terminal.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return -1
end
local len
if #ARGV > 3 then
  redis.call('RPUSH', KEYS[1], unpack(ARGV, 4))
end
len = redis.call('RPUSH', KEYS[1], ARGV[1])
-- Only the frames get the short read-out window; the reference and the generation keep
-- the reconnect TTL so a late client still gets the final result.
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
else
  redis.call('SET', KEYS[3], '0', 'PX', ARGV[3])
end
return len - 1
