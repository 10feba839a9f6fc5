-- One node's part of a Redlock acquisition: take the lock here, or (with wait) keep our place
-- in its queue by priority.
-- KEYS: lock, queue, waiters, fence, born
-- ARGV: owner, ttl ms, wait (1|0), priority, fence ttl ms, handoff ttl ms, channel prefix,
--       rejoin ms; for an election's candidate only, the value it proclaims
-- Returns {1, fence, lease ms} when the lock is ours here (a fresh grant has the full ttl; a
-- lock handed to us, or granted earlier, what is left of its lease), otherwise
-- {0, ms until the holder's lease ends (or the node joins), server ms}, or {-1, family, 0} if
-- the key is in use as another kind of lock. A candidate's fresh grant here carries its value
-- (it leads once a majority of nodes hold it so under one token); a lead handed to it is
-- provisional here until its client settles it (settle.lua).
local lock, queue, waiters, fence, born = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, ttl, wait, priority = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1', ARGV[4]
local fence_ttl, handoff_ttl, prefix = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local rejoin_ms = tonumber(ARGV[8])
local said = ARGV[9]
gate(born, rejoin_ms)

local m = mutex_at(lock)
if m == false or (m and (m.t ~= nil) ~= (said ~= nil)) then
  -- A read-write lock; or a mutex's hold, and we campaign, or the other way round.
  return {-1, family_of(lock, queue), 0}
end
local holder = m and m.o
if holder == owner then
  return {1, tonumber(m.f), redis.call('PTTL', lock)}
end
if not holder then
  local head, head_owner = live_head(queue, waiters)
  if head and head ~= head_owner then
    -- A read-write lock's queue: not a mutex.
    return {-1, family_of(lock, queue), 0}
  end
  if head and head ~= owner and is_candidate(head) ~= (said ~= nil) then
    -- The first in line is the other kind (a candidate, and we ask for a mutex, or the other
    -- way round): the key is its kind, so it is handed the key (once this node may grant:
    -- the gate above) and we are refused.
    hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, nil, is_candidate(head))
    return {-1, family_of(lock, queue), 0}
  end
end
local now = clock()
if wait then
  redis.call('ZADD', queue, 'NX', priority, owner)
  redis.call('ZADD', waiters, now + ttl, owner)
  keep(queue, 2 * ttl)
  keep(waiters, 2 * ttl)
end
local left = joining(born, rejoin_ms)
if left > 0 then
  return {0, left, now}
end
if not holder then
  local head = live_head(queue, waiters)
  if not head or head == owner then
    if head then
      redis.call('ZREM', queue, owner)
      redis.call('ZREM', waiters, owner)
    end
    local f = grant(lock, fence, owner, ttl, fence_ttl, nil, nil, nil, said and '=' .. said)
    if said then
      leader_moved(lock)
    end
    return {1, f, ttl}
  end
  -- Free, but a waiter with an earlier priority is first: it gets the lock.
  hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, nil, said)
end
return {0, redis.call('PTTL', lock), now}
