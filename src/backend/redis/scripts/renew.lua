-- Extend many leases and queue entries in one round trip. Each claim is renewed on its own
-- (pcall): a key of a foreign type, or any other error, fails that claim only.
-- KEYS: lock, waiters, queue for each claim
-- ARGV: owner, ttl ms for each claim
-- Returns per claim: 1 lease extended, 2 queue entry extended, 0 neither (not ours),
-- -1 the claim's keys could not be read (e.g. WRONGTYPE).
local function renew_one(lock, waiters, queue, owner, ttl)
  if redis.call('HGET', lock, 'o') == owner then
    redis.call('PEXPIRE', lock, ttl)
    return 1
  end
  if redis.call('ZSCORE', waiters, owner) then
    redis.call('ZADD', waiters, clock() + ttl, owner)
    keep(queue, 2 * ttl)
    keep(waiters, 2 * ttl)
    return 2
  end
  return 0
end

local out = {}
for i = 1, #ARGV / 2 do
  local ok, r = pcall(renew_one, KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i],
    ARGV[2 * i - 1], tonumber(ARGV[2 * i]))
  if ok then
    out[i] = r
  else
    out[i] = -1
  end
end
return out
