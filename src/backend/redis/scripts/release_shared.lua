-- Remove every trace of a read-write lock or semaphore claim: its hold or its queue entry,
-- then grant the waiters that now fit (a cancelled writer at the head lets the readers behind
-- it in). Idempotent.
-- KEYS: base, holders, queue, waiters, fence
-- ARGV: owner, fence ttl ms, handoff ttl ms, channel prefix, queue entry ("<kind>:<owner>"), the
--       client's clock in µs (see `next_fence`)
-- Returns 1 if the owner held the lock, 0 otherwise.
local base, holders, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, fence_ttl, handoff_ttl, prefix, entry =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
client_clock(ARGV[6])

if redis.call('HEXISTS', base, 't') == 0 then
  -- Not a read-write lock or semaphore (free now, or a mutex that refused this claim): only
  -- our own queue entry may be left, nothing else is ours to touch.
  if redis.call('ZREM', waiters, owner) == 1 then
    Q.remove(queue, entry)
  end
  return 0
end
local held = 0
local deadline = redis.call('ZSCORE', holders, owner)
if deadline then
  if tonumber(deadline) > clock() then
    held = 1
  end
  drop_holder(base, holders, owner)
elseif redis.call('ZREM', waiters, owner) == 1 then
  Q.remove(queue, entry)
end
if redis.call('EXISTS', base) == 1 then
  purge(base, holders)
  grant_pass(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)
  forget_if_idle(base, holders, queue)
end
return held
