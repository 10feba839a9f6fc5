-- Take a read-write lock or semaphore claim, or join (or keep our place in) its FIFO queue.
-- KEYS: base, holders, queue, waiters, fence
-- ARGV: owner, ttl ms, wait (1|0), fence ttl ms, handoff ttl ms, channel prefix ("<lock>:c:"),
--       kind ('r', 'w', or the permit count), permits of the semaphore (0 for a read-write lock),
--       the client's clock in µs (see `next_fence`)
-- Returns {1, fence, 0} when the claim holds the lock, {0, ms to the earliest holder deadline,
-- server ms} when it waits, {-1, family} if the key is in use as another kind of lock.
local base, holders, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, ttl, wait = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local fence_ttl, handoff_ttl, prefix = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local kind, max = ARGV[7], ARGV[8]
client_clock(ARGV[9])

local ours = 'rw'
if kind ~= 'r' and kind ~= 'w' then
  ours = 'sem:' .. max
end
local family = family_of(base, queue)
if family and family ~= ours then
  return {-1, family}
end
if not family then
  if ours == 'rw' then
    redis.call('HSET', base, 't', 'rw')
  else
    redis.call('HSET', base, 't', 'sem', 'm', max, 'u', 0)
  end
end

-- Holders whose lease ran out make room; waiters that now fit are granted first (FIFO).
purge(base, holders)
grant_pass(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)

local now = clock()
if redis.call('ZSCORE', holders, owner) then
  -- Ours already (handed to us, or asked again): confirm the full lease.
  redis.call('ZADD', holders, now + ttl, owner)
  keep(base, 2 * ttl)
  keep(holders, 2 * ttl)
  return {1, tonumber(redis.call('HGET', base, 'f:' .. owner)), 0}
end

if not live_head(queue, waiters) and fits(base, holders, kind) then
  local f = add_holder(base, holders, fence, fence_ttl, owner, kind, ttl)
  keep(base, 2 * ttl)
  keep(holders, 2 * ttl)
  return {1, f, 0}
end

-- Check again when the first holder's lease ends, should it not be renewed.
local left = first_lease_end(holders, now)
if wait then
  -- New in the waiters set, so not queued yet (the two hold the same owners).
  if redis.call('ZADD', waiters, now + ttl, owner) == 1 then
    redis.call('RPUSH', queue, kind .. ':' .. owner)
  end
  keep(queue, 2 * ttl)
  keep(waiters, 2 * ttl)
  keep(base, 2 * ttl)
  tell(base, queue, now, left, handoff_ttl)
else
  forget_if_idle(base, holders, queue)
end
return {0, left, now}
