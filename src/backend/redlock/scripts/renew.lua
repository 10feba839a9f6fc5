-- One node's part of a Redlock renewal, for many claims in one round trip. Each claim is renewed
-- on its own (pcall), so a key of a foreign type fails that claim only.
-- KEYS: lock, waiters, queue, holders for each claim
-- ARGV: owner, ttl ms, mode for each claim: 'h' a held mutex, 'H' a held read-write lock
--       (extend its lease); 'w' a waiter (keep its queue entry, never extend a lease it holds
--       here without a quorum)
-- Returns per claim: 1 lease extended, 2 queue entry kept, 0 neither, -1 error.
local function renew_one(lock, waiters, queue, holders, owner, ttl, mode)
  if mode == 'h' then
    if redis.call('HGET', lock, 'o') == owner then
      redis.call('PEXPIRE', lock, ttl)
      return 1
    end
    return 0
  elseif mode == 'H' then
    local deadline = redis.call('ZSCORE', holders, owner)
    if deadline and tonumber(deadline) > clock() then
      redis.call('ZADD', holders, clock() + ttl, owner)
      keep(lock, 2 * ttl)
      keep(holders, 2 * ttl)
      return 1
    end
    return 0
  end
  if redis.call('ZSCORE', waiters, owner) then
    redis.call('ZADD', waiters, clock() + ttl, owner)
    keep(queue, 2 * ttl)
    keep(waiters, 2 * ttl)
    if redis.call('HEXISTS', lock, 't') == 1 then
      keep(lock, 2 * ttl)
    end
    return 2
  end
  return 0
end

local out = {}
for i = 1, #ARGV / 3 do
  local ok, r = pcall(renew_one, KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i],
    ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]), ARGV[3 * i])
  if ok then
    out[i] = r
  else
    out[i] = -1
  end
end
return out
