-- Sets the lease of a lock we hold on this node to the full TTL, and raises its fencing counter
-- to the quorum's token. An election's candidate leads from here: its hold carries its value,
-- and the election's observers are told.
-- KEYS: lock, fence, holders
-- ARGV: owner, lease ms, token, fence ttl ms, shared ('1' a read-write lock, '0' a mutex); for
--       an election's candidate only, the value it proclaims
-- Returns 1 if the owner holds the lock here (and it was settled), 0 otherwise.
local lock, fence, holders = KEYS[1], KEYS[2], KEYS[3]
local owner, px, token, fence_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

if ARGV[5] == '1' then
  local deadline = redis.call('ZSCORE', holders, owner)
  if not deadline or tonumber(deadline) <= clock() then
    return 0
  end
  redis.call('ZADD', holders, clock() + px, owner)
  keep(lock, 2 * px)
  keep(holders, 2 * px)
  redis.call('HSET', lock, 'f:' .. owner, int(token))
else
  local m = mutex_at(lock)
  if not (m and m.o == owner) then
    return 0
  end
  local said = ARGV[6]
  redis.call('SET', lock, mutex_value(token, owner, m.q, told_of(m), said and '=' .. said), 'PX', px)
  if said then
    leader_moved(lock)
  end
end
-- Any later grant on this node, by anyone, gets a larger token than ours.
if fence_parts(fence, redis.call('GET', fence)) < token then
  redis.call('SET', fence, int(token), 'PX', fence_ttl)
end
return 1
