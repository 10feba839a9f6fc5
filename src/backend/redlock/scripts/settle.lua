-- Sets the lease of a lock we hold on this node to the full TTL, and raises its fencing counter
-- to the quorum's token.
-- KEYS: lock, fence
-- ARGV: owner, lease ms, token, fence ttl ms
-- Returns 1 if the owner holds the lock here (and it was settled), 0 otherwise.
local lock, fence = KEYS[1], KEYS[2]
local owner, px, token, fence_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

if redis.call('HGET', lock, 'o') ~= owner then
  return 0
end
redis.call('PEXPIRE', lock, px)
-- Any later grant on this node, by anyone, gets a larger token than ours.
if tonumber(redis.call('GET', fence) or '0') < token then
  redis.call('SET', fence, int(token), 'PX', fence_ttl)
end
redis.call('HSET', lock, 'f', int(token))
return 1
