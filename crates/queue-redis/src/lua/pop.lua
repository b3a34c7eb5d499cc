-- Weighted round-robin pop of one due member (K-13).
-- KEYS[1..4]: lane ZSETs P0..P3; KEYS[5]: rotation hash (current, served, burst_left).
-- ARGV[1]: caller's now (ms); ARGV[2..5]: block weights P0..P3; ARGV[6]: burst length.
-- Returns the member, or false when nothing is due.
local now = ARGV[1]
local function first_due(i)
  return redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', now, 'LIMIT', 0, 1)[1]
end
local function pop(i)
  local m = first_due(i)
  if m then
    redis.call('ZREM', KEYS[i], m)
  end
  return m
end
local st = redis.call('HMGET', KEYS[5], 'current', 'served', 'burst_left')
local cur = tonumber(st[1]) or 0
local served = tonumber(st[2]) or 0
local burst_left = tonumber(st[3]) or 0
if cur ~= math.floor(cur) or cur < 0 or cur > 3 then
  cur = 0
end

-- Burst window: P0 first, ending early the first time P0 has nothing due. Burst pops do
-- not touch the rotation.
if burst_left > 0 then
  local m = pop(1)
  if m then
    redis.call('HSET', KEYS[5], 'burst_left', burst_left - 1)
    return m
  end
  burst_left = 0
end

-- Five steps: every lane once, plus the starting lane again with a fresh block.
for _ = 1, 5 do
  local w = tonumber(ARGV[2 + cur])
  if served < w then
    local m = pop(cur + 1)
    if m then
      served = served + 1
      if served >= w then
        cur = (cur + 1) % 4
        served = 0
      end
      redis.call('HSET', KEYS[5], 'current', cur, 'served', served, 'burst_left', burst_left)
      return m
    end
  end
  -- Nothing due (or block used up): skip at once, forfeiting the rest of the block.
  cur = (cur + 1) % 4
  served = 0
end

local any_due = false
for i = 1, 4 do
  if first_due(i) then
    any_due = true
  end
end
if not any_due then
  burst_left = tonumber(ARGV[6])
end
redis.call('HSET', KEYS[5], 'current', cur, 'served', served, 'burst_left', burst_left)
return false
