-- Turn a write hold into a read hold in one step: no writer can get in between; readers queued
-- behind are granted. The lease is renewed and the fencing token kept.
-- KEYS: base, holders, queue, waiters, fence
-- ARGV: owner, ttl ms, fence ttl ms, handoff ttl ms, channel prefix, the client's clock in µs
--       (see `next_fence`)
-- Returns {1, fence} on success, {0, 0} if the owner does not hold the lock. Idempotent: a
-- claim that already reads (a first run whose reply was lost downgraded it) is renewed and
-- told so, since a write claim's owner token reads only once it was downgraded.
local base, holders, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, ttl, fence_ttl, handoff_ttl, prefix =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
client_clock(ARGV[6])

purge(base, holders)
if redis.call('HGET', base, 'wr') ~= owner then
  if not redis.call('ZSCORE', holders, owner) then
    return {0, 0}
  end
  redis.call('ZADD', holders, clock() + ttl, owner)
  keep(base, 2 * ttl)
  keep(holders, 2 * ttl)
  return {1, tonumber(redis.call('HGET', base, 'f:' .. owner))}
end
redis.call('HDEL', base, 'wr')
redis.call('ZADD', holders, clock() + ttl, owner)
keep(base, 2 * ttl)
keep(holders, 2 * ttl)
grant_pass(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)
return {1, tonumber(redis.call('HGET', base, 'f:' .. owner))}
