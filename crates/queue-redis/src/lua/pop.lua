-- Weighted round-robin pop of up to ARGV[7] due members (K-13), in one script call.
-- KEYS[1..4]: lane ZSETs P0..P3; KEYS[5]: rotation hash (current, served, burst_left, and
-- the per-lane pop counters pops0..pops3).
-- ARGV[1]: caller's now (ms); ARGV[2..5]: block weights P0..P3; ARGV[6]: burst length;
-- ARGV[7]: most members to pop (the adapter checks 1..=1000).
-- The batch is exactly that many single pops in a row, stopped by the first that finds
-- nothing due (that empty pop arms the burst window as a single one does). Returns the
-- members in pop order (an empty array when nothing is due). Every member taken adds one
-- to its lane's counter, written once per lane for the batch.
local now = ARGV[1]
local max = tonumber(ARGV[7])
local popped = {0, 0, 0, 0}
local function first_due(i)
  return redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', now, 'LIMIT', 0, 1)[1]
end
local function take(i)
  local m = first_due(i)
  if m then
    redis.call('ZREM', KEYS[i], m)
    popped[i] = popped[i] + 1
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

-- One single pop over the local rotation state; false when nothing is due.
local function pop()
  -- Burst window: P0 first, ending early the first time P0 has nothing due. Burst pops
  -- do not touch the rotation.
  if burst_left > 0 then
    local m = take(1)
    if m then
      burst_left = burst_left - 1
      return m
    end
    burst_left = 0
  end
  -- Five steps: every lane once, plus the starting lane again with a fresh block.
  for _ = 1, 5 do
    local w = tonumber(ARGV[2 + cur])
    if served < w then
      local m = take(cur + 1)
      if m then
        served = served + 1
        if served >= w then
          cur = (cur + 1) % 4
          served = 0
        end
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
  return false
end

local out = {}
while #out < max do
  local m = pop()
  if not m then
    break
  end
  out[#out + 1] = m
end
-- The state is written once for the batch, as the pops left it.
redis.call('HSET', KEYS[5], 'current', cur, 'served', served, 'burst_left', burst_left)
for i = 1, 4 do
  if popped[i] > 0 then
    local field = 'pops' .. (i - 1)
    -- A damaged counter (not an integer) restarts from this batch instead of failing the
    -- pop after its members were taken.
    local r = redis.pcall('HINCRBY', KEYS[5], field, popped[i])
    if type(r) == 'table' and r.err then
      redis.call('HSET', KEYS[5], field, popped[i])
    end
  end
end
return out
