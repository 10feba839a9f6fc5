-- A read-write lock we hold on this node without a quorum (see yield.lua): if a waiter ahead of
-- us (better priority) waits here, leave, queue again in our place and grant the waiters that
-- fit; otherwise keep the hold, under the short handoff lease only.
-- KEYS: base, holders, queue, waiters, fence
-- ARGV: owner, priority, ttl ms, fence ttl ms, handoff ttl ms, channel prefix, queue entry
-- Returns 2 if handed on, 1 if kept, 0 if we do not hold it here.
local base, holders, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, priority, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fence_ttl, handoff_ttl, prefix, entry = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], ARGV[7]

local deadline = redis.call('ZSCORE', holders, owner)
if not deadline then
  return 0
end
if served_before_us(queue, waiters, priority, entry) then
  drop_holder(base, holders, owner)
  requeue(queue, waiters, priority, entry, owner, ttl)
  grant_pass(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)
  return 2
end
if tonumber(deadline) > clock() + handoff_ttl then
  redis.call('ZADD', holders, clock() + handoff_ttl, owner)
end
return 1
