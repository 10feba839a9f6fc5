-- Sets the lease of a lock we hold on this node, and raises its fencing counter.
-- KEYS: lock, fence
-- ARGV: owner, lease ms, token (0: leave the counter), fence ttl ms, shorten only (1|0)
-- Returns 1 if the owner holds the lock here (and it was settled), 0 otherwise.
local lock, fence = KEYS[1], KEYS[2]
local owner, px, token, fence_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local shorten_only = ARGV[5] == '1'

if redis.call('HGET', lock, 'o') ~= owner then
  return 0
end
if not shorten_only or redis.call('PTTL', lock) > px then
  redis.call('PEXPIRE', lock, px)
end
if token > 0 then
  -- Any later grant on this node, by anyone, gets a larger token than ours.
  if tonumber(redis.call('GET', fence) or '0') < token then
    redis.call('SET', fence, int(token), 'PX', fence_ttl)
  end
  redis.call('HSET', lock, 'f', int(token))
end
return 1
