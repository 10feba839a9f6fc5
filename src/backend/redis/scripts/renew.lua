-- Extend many leases and queue entries in one round trip. Each claim is renewed on its own
-- (pcall): a key of a foreign type, or any other error, fails that claim only.
-- KEYS: base, holders, waiters, queue for each claim
-- ARGV: owner, ttl ms for each claim
-- Returns per claim: 1 lease extended, 2 queue entry extended, 0 neither (not ours),
-- -1 the claim's keys could not be read (e.g. WRONGTYPE).
local function renew_one(base, holders, waiters, queue, owner, ttl)
  if redis.call('HGET', base, 'o') == owner then
    redis.call('PEXPIRE', base, ttl)
    return 1
  end
  local now = clock()
  local deadline = redis.call('ZSCORE', holders, owner)
  if deadline and tonumber(deadline) > now then
    -- A read-write lock or semaphore hold; a lease already run out is not revived.
    redis.call('ZADD', holders, 'XX', now + ttl, owner)
    keep(base, 2 * ttl)
    keep(holders, 2 * ttl)
    return 1
  end
  if redis.call('ZSCORE', waiters, owner) then
    redis.call('ZADD', waiters, now + ttl, owner)
    keep(queue, 2 * ttl)
    keep(waiters, 2 * ttl)
    -- A read-write lock's or semaphore's hash lives while anyone waits. (A mutex's hash TTL
    -- is its holder's lease: a waiter must never touch it.)
    if redis.call('HEXISTS', base, 't') == 1 then
      keep(base, 2 * ttl)
    end
    return 2
  end
  return 0
end

local out = {}
for i = 1, #ARGV / 2 do
  local ok, r = pcall(renew_one, KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i],
    ARGV[2 * i - 1], tonumber(ARGV[2 * i]))
  if ok then
    out[i] = r
  else
    out[i] = -1
  end
end
return out
