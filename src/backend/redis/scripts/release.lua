-- Remove every trace of an owner: its grant (handing the lock to the next live waiter) or its
-- queue entry. Idempotent.
-- KEYS: lock, queue, waiters, fence
-- ARGV: owner, channel prefix ("<lock>:c:"), fence ttl ms, handoff ttl ms, the client's clock
--       in µs (see `next_fence`); 'l' for an election's candidate only
-- Returns 1 if the owner held the lock, 0 otherwise.
local lock, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner = ARGV[1]

-- The path most releases take (see `release_plain`).
local plain, v = release_plain(KEYS, ARGV, 0, 0)
if plain then
  return plain
end

local prefix, fence_ttl, handoff_ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
client_clock(ARGV[5])
local m = mutex_of(lock, v)
if m == false then
  -- A read-write lock or semaphore: a mutex claim was refused there and left nothing.
  return 0
end
if m and m.o == owner then
  -- Handed on in place (overwritten), or deleted if nobody waits (nobody queued behind this
  -- hold if it is not marked: then the queue is not even looked at). The fencing counter
  -- outlives it in its own key.
  if not (m.q and hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix,
                           told_of(m), m.t)) then
    redis.call('DEL', lock)
  end
  if m.v then
    -- An election's leader stepped down.
    leader_moved(lock)
  end
  return 1
end
if redis.call('ZREM', waiters, owner) == 1 then
  redis.call('LREM', queue, 1, owner)
end
if not m then
  hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, nil, ARGV[6] == 'l')
end
return 0
