-- A lock we hold on this node without a quorum: if a waiter ahead of us (better priority)
-- waits here, the node should have handed the lock to it (it queued here too late, or the call
-- that queued it was slow), so hand it on and queue again in our place; otherwise keep it, under
-- the short handoff lease only.
-- KEYS: lock, queue, waiters, fence
-- ARGV: owner, priority, ttl ms, fence ttl ms, handoff ttl ms, channel prefix
-- Returns 2 if handed on, 1 if kept, 0 if we do not hold it here.
local lock, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, priority, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fence_ttl, handoff_ttl, prefix = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]

local m = mutex_at(lock)
if not (m and m.o == owner) then
  return 0
end
if served_before_us(queue, waiters, priority, owner) then
  redis.call('DEL', lock)
  requeue(queue, waiters, priority, owner, owner, ttl)
  hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, nil, m.t)
  return 2
end
if redis.call('PTTL', lock) > handoff_ttl then
  redis.call('PEXPIRE', lock, handoff_ttl)
end
return 1
