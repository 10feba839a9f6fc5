-- One node's part of a Redlock release: drop our grant (handing the lock to the next live
-- waiter) or our queue entry. Idempotent.
-- KEYS: lock, queue, waiters, fence, born
-- ARGV: owner, fence ttl ms, handoff ttl ms, channel prefix, rejoin ms; 'l' for an election's
--       candidate only (a lead it hands on is provisional)
-- Returns 1 if the owner held the lock here, 0 otherwise.
local lock, queue, waiters, fence, born = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, fence_ttl, handoff_ttl, prefix = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local rejoin_ms = tonumber(ARGV[5])
local election = ARGV[6] == 'l'

local m = mutex_at(lock)
local holder = m and m.o
local held = 0
if holder == owner then
  redis.call('DEL', lock)
  held = 1
  if m.v then
    -- A leader's hold here: its election's observers are told.
    leader_moved(lock)
  end
else
  redis.call('ZREM', queue, owner)
  redis.call('ZREM', waiters, owner)
end
if (held == 1 or not holder) and joining(born, rejoin_ms) == 0 then
  hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, nil, election)
end
return held
