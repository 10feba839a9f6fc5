-- Extend many leases and queue entries in one round trip.
-- KEYS: lock, waiters, queue for each claim
-- ARGV: owner, ttl ms for each claim
-- Returns per claim: 1 lease extended, 2 queue entry extended, 0 neither (not ours).
local out = {}
for i = 1, #ARGV / 2 do
  local lock, waiters, queue = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local owner, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  if redis.call('HGET', lock, 'o') == owner then
    redis.call('PEXPIRE', lock, ttl)
    out[i] = 1
  elseif redis.call('ZSCORE', waiters, owner) then
    redis.call('ZADD', waiters, clock() + ttl, owner)
    keep(queue, 2 * ttl)
    keep(waiters, 2 * ttl)
    out[i] = 2
  else
    out[i] = 0
  end
end
return out
