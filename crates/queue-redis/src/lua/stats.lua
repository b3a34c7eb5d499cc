-- Per-lane statistics, one consistent snapshot (K-13).
-- KEYS[1..4]: lane ZSETs P0..P3; KEYS[5]: rotation hash (its pops0..pops3 counters).
-- ARGV[1]: caller's now (ms).
-- Returns {depth, ready, oldest_due_score_or_empty, pops} x 4.
local pops = redis.call('HMGET', KEYS[5], 'pops0', 'pops1', 'pops2', 'pops3')
local out = {}
for i = 1, 4 do
  local depth = redis.call('ZCARD', KEYS[i])
  local ready = redis.call('ZCOUNT', KEYS[i], '-inf', ARGV[1])
  local oldest = ''
  if ready > 0 then
    oldest = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')[2]
  end
  table.insert(out, depth)
  table.insert(out, ready)
  table.insert(out, oldest)
  -- A missing or damaged counter reads as 0; returned as the stored decimal string.
  local n = pops[i]
  if not n or not string.match(n, '^%d+$') then
    n = '0'
  end
  table.insert(out, n)
end
return out
