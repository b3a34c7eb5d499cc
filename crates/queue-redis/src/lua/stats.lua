-- Per-lane statistics, one consistent snapshot (K-13).
-- KEYS[1..4]: lane ZSETs P0..P3. ARGV[1]: caller's now (ms).
-- Returns {depth, ready, oldest_due_score_or_empty} x 4.
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
end
return out
