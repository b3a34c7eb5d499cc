-- Store one result-cache entry and its expiry score, atomically.
-- KEYS[1] entry key, KEYS[2] expiry ZSET
-- ARGV[1] entry JSON, ARGV[2] PX in ms ('' = no server expiry), ARGV[3] expires_at, ARGV[4] key hex
if ARGV[2] == '' then
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return 1
