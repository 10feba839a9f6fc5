-- Take the lock, or join (or keep our place in) its FIFO queue.
-- KEYS: lock, queue, waiters, fence
-- ARGV: owner, ttl ms, wait (1|0), fence ttl ms, handoff ttl ms, channel prefix ("<lock>:c:"),
--       the client's clock in µs (see `next_fence`); for an election's candidate only, the
--       value it proclaims
-- Returns {1, fence, 0} when the lock is ours, {0, holder pttl, server ms} otherwise, and
-- {-1, family} if the key is in use as another kind of lock.
local lock, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl, wait = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local fence_ttl, handoff_ttl, prefix = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
client_clock(ARGV[7])
-- An election's candidate: the hold it takes says so, and carries its value once it leads.
local said = ARGV[8]
local leads = said and '=' .. said

-- The path most calls take, three commands on a single server (EXISTS, INCR, SET NX), four
-- where tokens are floored by the server's clock (INCR, TIME, SET on the counter, SET NX):
-- nobody may be queued (the counter carries
-- no mark, so it counts on, and did not restart: a new counter has lost any mark the old one
-- had; where counters carry no mark, `Q.marks`, the queue is looked at instead) and the key is
-- free (SET NX). A token drawn for a key that turns out busy is skipped: tokens only need to
-- increase.
local drawn, restarted
if Q.marks or redis.call('EXISTS', queue) == 0 then
  drawn, restarted = next_fence(fence, fence_ttl, true)
  restarted = restarted and Q.marks
end
if drawn and not restarted and redis.call('SET', lock, mutex_value(drawn, owner, false, nil, leads), 'NX', 'PX', ttl) then
  if said then
    leader_moved(lock)
  end
  return {1, drawn, 0}
end

local m = mutex_at(lock)
if m == false then
  return {-1, family_of(lock, queue)}
end
-- A hold of ours taken by the client's own SET NX PX (`redis/fast.rs`, no token recorded),
-- whose INCR found the counter marked (a waiter may be queued: that SET may have barged past
-- it) or new (below FENCE_LOW), or whose reply came too late or not at all, is settled as if
-- the key were free: handed to the live head of the queue if another claim is first (this one
-- then queues like any other), else ours, with a token drawn now.
local settling
if m and m.o == owner and not m.f then
  settling, m = m, nil
end
if m and m.o == owner then
  -- Ours already (handed to us, or asked again): confirm the full lease. A candidate handed
  -- the lead leads from here, and its election's observers are told.
  if said and not m.v then
    redis.call('SET', lock, mutex_value(m.f, m.o, m.q, told_of(m), leads), 'PX', ttl)
    leader_moved(lock)
  else
    redis.call('PEXPIRE', lock, ttl)
  end
  return {1, tonumber(m.f), 0}
elseif m and (m.t ~= nil) ~= (said ~= nil) then
  -- A mutex's hold, and we campaign, or the other way round.
  return {-1, family_of(lock, queue)}
end

if not m then
  -- Free, yet a waiter may be queued (the counter is marked).
  local head, head_owner = live_head(queue, waiters)
  if head and head ~= head_owner then
    -- A read-write lock's or semaphore's queue (its hash expired): not a mutex.
    return {-1, family_of(lock, queue)}
  end
  local told = told_of(settling)
  if head and head ~= owner and is_candidate(head) ~= (said ~= nil) then
    -- The first in line is the other kind (a candidate, and we ask for a mutex, or the other
    -- way round): the key is its kind, so it is handed the key and we are refused.
    hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, told, is_candidate(head))
    return {-1, family_of(lock, queue)}
  end
  if not head or head == owner then
    -- Queued ourselves (or others queued behind our unsettled hold): others may be queued
    -- behind us.
    local queued = head ~= nil or (settling ~= nil and settling.q)
    local f
    if head then
      -- Drawn before the claim leaves the queue (see `draw`).
      f = draw(fence, fence_ttl, queued)
      redis.call('LPOP', queue)
      redis.call('ZREM', waiters, owner)
    else
      unmark(fence, fence_ttl)
    end
    f = grant(lock, fence, owner, ttl, fence_ttl, told, queued, f, leads)
    if said then
      leader_moved(lock)
    end
    return {1, f, 0}
  end
  -- Free, but another live waiter is first (the last holder expired): it gets the lock.
  hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, told, said)
  m = mutex_at(lock)
end

local now = clock()
local left = redis.call('PTTL', lock)
if wait then
  -- New in the waiters set, so not queued yet (the two hold the same owners).
  local tail = nil
  if redis.call('ZADD', waiters, now + ttl, owner) == 1 then
    redis.call('RPUSH', queue, owner)
    tail = owner
    if drawn and Q.marks then
      -- Unmarked until now (else INCR refused).
      mark_queued(fence, drawn, fence_ttl)
    end
  end
  keep(queue, 2 * ttl)
  keep(waiters, 2 * ttl)
  if m and left > 0 then
    -- The hold we queue behind looks at the queue when it is released, and keeps what we
    -- were told.
    local told = next_told(m.w, queue, now, left, handoff_ttl, tail)
    if told or not m.q then
      redis.call('SET', lock, mutex_value(m.f, m.o, true, told or told_of(m), m.t), 'KEEPTTL')
    end
  end
end
return {0, left, now}
