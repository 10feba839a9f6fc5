-- Remove every trace of an owner: its grant (handing the lock to the next live waiter) or its
-- queue entry. Idempotent.
-- KEYS: lock, queue, waiters, fence
-- ARGV: owner, fence ttl ms, handoff ttl ms, channel prefix ("<lock>:c:")
-- Returns 1 if the owner held the lock, 0 otherwise.
local lock, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, fence_ttl, handoff_ttl, prefix = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]

local holder, family, w, wq = unpack(redis.call('HMGET', lock, 'o', 't', 'w', 'wq'))
if family then
  -- A read-write lock or semaphore: a mutex claim was refused there and left nothing.
  return 0
end
local held = 0
if holder == owner then
  redis.call('DEL', lock)
  held = 1
else
  if redis.call('ZREM', waiters, owner) == 1 then
    redis.call('LREM', queue, 1, owner)
  end
end
if held == 1 or not holder then
  local told = nil
  if holder and w then
    told = {w, wq}
  end
  hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, told)
end
return held
