-- What an operator sees of one resource (K-14), read-only, timed by Redis TIME.
-- KEYS[1]: live limits hash; KEYS[2]: holders ZSET (owner key -> lease end ms);
-- KEYS[3]: starts ZSET (score start time in µs).
-- ARGV[1], ARGV[2]: the application's configured max_concurrency and
-- max_starts_per_second, used per field when the hash lacks it (as acquire.lua does);
-- ARGV[3]: most holders to list (one more is fetched to tell whether the list is cut).
-- Returns {max_concurrency, max_starts_per_second, overridden 1|0, Redis time in ms,
-- starts in the current 1 s window, {owner key, lease end ms, ...}} with the unexpired
-- holders soonest lease end first, at most ARGV[3] + 1 of them.
local function int(x)
  return string.format('%.0f', x)
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local lim = redis.call('HMGET', KEYS[1], 'max_concurrency', 'max_starts_per_second')
local overridden = 0
if lim[1] or lim[2] then
  overridden = 1
end
local max_concurrency = tonumber(lim[1] or ARGV[1])
local max_starts = tonumber(lim[2] or ARGV[2])
if not max_concurrency or not max_starts or max_concurrency < 0 or max_starts < 0 then
  return redis.error_reply('ERR invalid permit limits in ' .. KEYS[1])
end
-- Unexpired: a lease that ends at now_ms has ended (acquire.lua purges it).
local held = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. int(now_ms), '+inf', 'WITHSCORES', 'LIMIT', 0,
  tonumber(ARGV[3]) + 1)
local starts = redis.call('ZCOUNT', KEYS[3], '(' .. int(now_us - 1000000), '+inf')
return {max_concurrency, max_starts, overridden, now_ms, starts, held}
