-- One node's part of a Redlock read-write lock acquisition: hold it here as a reader or as the
-- writer, or (with wait) keep our place in its queue by priority.
-- KEYS: base, holders, queue, waiters, fence, born
-- ARGV: owner, ttl ms, wait (1|0), priority, fence ttl ms, handoff ttl ms, channel prefix,
--       rejoin ms, kind ('r' | 'w')
-- Returns {1, fence, lease ms} when we hold it here (a fresh grant has the full ttl; one handed
-- to us, or granted earlier, what is left of its lease), otherwise {0, ms until the first
-- holder's lease ends or the node joins (-2 if nobody holds it), server ms}, or
-- {-1, family, 0} if the key is in use as a mutex.
local base, holders, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local born = KEYS[6]
local owner, ttl, wait, priority = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1', ARGV[4]
local fence_ttl, handoff_ttl, prefix = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local rejoin_ms, kind = tonumber(ARGV[8]), ARGV[9]
gate(born, rejoin_ms)

local family = family_of(base, queue)
if family and family ~= 'rw' then
  return {-1, family, 0}
end
if not family then
  redis.call('HSET', base, 't', 'rw')
end
purge(base, holders)
local now = clock()
local deadline = redis.call('ZSCORE', holders, owner)
if deadline then
  -- Ours already (handed to us, or asked again): never queue a holder. Its entry would outlive
  -- its hold, and its release would hand the lock straight back to it, a grant nobody
  -- confirms that blocks every waiter for the handoff lease.
  return {1, tonumber(redis.call('HGET', base, 'f:' .. owner)), tonumber(deadline) - now}
end
if wait then
  redis.call('ZADD', queue, 'NX', priority, kind .. ':' .. owner)
  redis.call('ZADD', waiters, now + ttl, owner)
  keep(queue, 2 * ttl)
  keep(waiters, 2 * ttl)
end
keep(base, 2 * ttl)
-- Waiters that fit now are granted in priority order (we may be one of them).
grant_pass(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)

deadline = redis.call('ZSCORE', holders, owner)
if deadline then
  return {1, tonumber(redis.call('HGET', base, 'f:' .. owner)), tonumber(deadline) - now}
end
if not wait then
  if Q.may_grant() and not live_head(queue, waiters) and fits(base, holders, kind) then
    local f = add_holder(base, holders, fence, fence_ttl, owner, kind, ttl)
    keep(holders, 2 * ttl)
    return {1, f, ttl}
  end
  forget_if_idle(base, holders, queue)
end
local left = joining(born, rejoin_ms)
if left > 0 then
  return {0, left, now}
end
-- Check again when the first holder's lease ends, should it not be renewed.
return {0, first_lease_end(holders, now), now}
