-- Check and take (or renew) one permit (K-14), timed by Redis TIME.
-- KEYS[1]: live limits hash (max_concurrency, max_starts_per_second)
-- KEYS[2]: holders ZSET (member owner key, score lease end in ms)
-- KEYS[3]: starts ZSET (member "<start µs>|<owner key>", score start time in µs)
-- KEYS[4]: index marker (string): the index `<prefix>:permits` lists the resource until at
-- least this Redis time (ms). The index is another key, in another hash slot on a cluster,
-- so this script never writes it: it returns when the caller must.
-- ARGV[1]: owner key; ARGV[2]: lease ms;
-- ARGV[3], ARGV[4]: the application's configured max_concurrency and max_starts_per_second,
-- used per field when the hash lacks it (0 = unlimited).
-- ARGV[5]: "1" for a renewal by a running activity: a lost permit (expired, flushed) is
-- re-registered without a limit check and without counting a start (K-14).
-- Returns {granted 1|0, lease ms | retry-after ms, Redis time in µs, renewed 1|0, index due}:
-- index due is 0, or the Redis time (ms) until which the caller must have the index list the
-- resource (index.lua): once per lease or so per resource, and at once after a flush.
local function int(x)
  return string.format('%.0f', x)
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local owner = ARGV[1]
local lease = tonumber(ARGV[2])

-- Purge first: expired holders, and starts older than the 1 s window.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', int(now_ms))
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', int(now_us - 1000000))

-- Keep the holders' key a second past its last lease; say whether the index is due.
local function keep_holders()
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]
  if not last then
    return 0
  end
  local want = tonumber(last) + 1000
  redis.call('PEXPIREAT', KEYS[2], int(want))
  local have = tonumber(redis.call('GET', KEYS[4]) or '0') or 0
  if have >= want then
    return 0
  end
  -- A lease of headroom, so that renewals rarely write the index.
  local until_ms = want + lease
  redis.call('SET', KEYS[4], int(until_ms), 'PXAT', int(until_ms))
  return until_ms
end

-- Renewal: never revoked, even above a lowered limit; not a new start.
if redis.call('ZSCORE', KEYS[2], owner) then
  redis.call('ZADD', KEYS[2], int(now_ms + lease), owner)
  return {1, lease, now_us, 1, keep_holders()}
end

-- A running activity's renewal re-registers a lost permit; the overshoot is bounded by one
-- renewal interval.
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[2], int(now_ms + lease), owner)
  return {1, lease, now_us, 1, keep_holders()}
end

local lim = redis.call('HMGET', KEYS[1], 'max_concurrency', 'max_starts_per_second')
local max_concurrency = tonumber(lim[1] or ARGV[3])
local max_starts = tonumber(lim[2] or ARGV[4])
if not max_concurrency or not max_starts or max_concurrency < 0 or max_starts < 0 then
  return redis.error_reply('ERR invalid permit limits in ' .. KEYS[1])
end

if max_concurrency > 0 and redis.call('ZCARD', KEYS[2]) >= max_concurrency then
  local soonest = tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2])
  return {0, math.min(math.max(soonest - now_ms, 1), lease), now_us, 0, 0}
end
if max_starts > 0 and redis.call('ZCARD', KEYS[3]) >= max_starts then
  local oldest = tonumber(redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')[2])
  return {0, math.max(math.ceil((oldest + 1000000 - now_us) / 1000), 1), now_us, 0, 0}
end

redis.call('ZADD', KEYS[2], int(now_ms + lease), owner)
local index_due = keep_holders()
redis.call('ZADD', KEYS[3], int(now_us), int(now_us) .. '|' .. owner)
redis.call('PEXPIRE', KEYS[3], 2000)
return {1, lease, now_us, 0, index_due}
