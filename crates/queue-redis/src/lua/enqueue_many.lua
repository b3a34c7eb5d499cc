-- Promote-only enqueue of several members into the ready lanes (K-13), in one script call.
-- KEYS[1..4]: lane ZSETs P0..P3.
-- ARGV: triples member (workflow id), target lane index 0..3, score (ms), in order; the
-- adapter checks the batch (at most 1000 triples, valid ids).
-- Each triple is applied exactly as enqueue.lua applies one, in order. Returns how many
-- triples left their member in the target lane with the given score.
-- Every triple is checked before the first write: Redis does not undo a script's earlier
-- writes when it fails midway, and the port refuses a bad batch as a whole.
if #ARGV % 3 ~= 0 then
  return redis.error_reply('enqueue_many: arguments are not member/lane/score triples')
end
for j = 1, #ARGV, 3 do
  local lane = tonumber(ARGV[j + 1])
  if ARGV[j] == '' or lane == nil or lane ~= math.floor(lane) or lane < 0 or lane > 3
      or tonumber(ARGV[j + 2]) == nil then
    return redis.error_reply('enqueue_many: bad triple at argument ' .. j)
  end
end
local placed = 0
for j = 1, #ARGV, 3 do
  local member = ARGV[j]
  local target = tonumber(ARGV[j + 1]) + 1
  local stays = false
  for i = 1, target - 1 do
    if redis.call('ZSCORE', KEYS[i], member) then
      stays = true
      break
    end
  end
  if not stays then
    for i = target + 1, 4 do
      redis.call('ZREM', KEYS[i], member)
    end
    redis.call('ZADD', KEYS[target], ARGV[j + 2], member)
    placed = placed + 1
  end
end
return placed
