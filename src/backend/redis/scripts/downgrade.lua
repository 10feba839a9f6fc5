-- Turn a write hold into a read hold in one step (see `downgrade` in shared_ops.lua).
-- KEYS: base, holders, queue, waiters, fence
-- ARGV: owner, ttl ms, fence ttl ms, handoff ttl ms, channel prefix, the client's clock in µs
--       (see `next_fence`)
-- Returns {1, fence} on success, {0, 0} if the owner does not hold the lock. Idempotent.
client_clock(ARGV[6])
return downgrade(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], tonumber(ARGV[2]),
  tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5])
