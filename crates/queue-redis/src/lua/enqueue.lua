-- Promote-only enqueue into the ready lanes (K-13).
-- KEYS[1..4]: lane ZSETs P0..P3.
-- ARGV[1]: member (workflow id), ARGV[2]: target lane index 0..3, ARGV[3]: score (ms).
-- Returns 1 when the member now sits in the target lane with the given score, 0 when it
-- stays in a more urgent lane untouched.
local member = ARGV[1]
local target = tonumber(ARGV[2]) + 1
for i = 1, target - 1 do
  if redis.call('ZSCORE', KEYS[i], member) then
    return 0
  end
end
for i = target + 1, 4 do
  redis.call('ZREM', KEYS[i], member)
end
redis.call('ZADD', KEYS[target], ARGV[3], member)
return 1
