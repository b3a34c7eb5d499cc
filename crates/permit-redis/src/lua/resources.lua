-- Resources with live limits or an unexpired holder (K-14), in name byte order.
-- KEYS[1]: resource index ZSET (member resource name, score 0), written by acquire.lua
-- and set_limits.lua. ARGV[1]: the key prefix of every resource ("<prefix>:permit:");
-- ARGV[2]: most names to return.
-- Each indexed name is checked against its own keys (the limits hash, the holders ZSET):
-- those keys share the index's prefix (on Redis Cluster, its hash tag), so they live on
-- the same node. A name with neither is dropped from the index, so the index stays as
-- large as the set of live resources plus those gone since the last call.
local function int(x)
  return string.format('%.0f', x)
end
local t = redis.call('TIME')
local now_ms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local max = tonumber(ARGV[2])
local out = {}
local from = '-'
while #out < max do
  local batch = redis.call('ZRANGEBYLEX', KEYS[1], from, '+', 'LIMIT', 0, 128)
  if #batch == 0 then
    break
  end
  for _, r in ipairs(batch) do
    local base = ARGV[1] .. r
    if redis.call('EXISTS', base .. ':limits') == 1
      or redis.call('ZCOUNT', base .. ':holders', '(' .. int(now_ms), '+inf') > 0 then
      if #out < max then
        out[#out + 1] = r
      end
    else
      redis.call('ZREM', KEYS[1], r)
    end
  end
  from = '(' .. batch[#batch]
end
return out
