-- Remove every trace of a read-write lock or semaphore claim (see `release_shared` in
-- shared_ops.lua). Idempotent.
-- KEYS: base, holders, queue, waiters, fence
-- ARGV: owner, fence ttl ms, handoff ttl ms, channel prefix, queue entry ("<kind>:<owner>"), the
--       client's clock in µs (see `next_fence`)
-- Returns 1 if the owner held the lock, 0 otherwise.
client_clock(ARGV[6])
return release_shared(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], tonumber(ARGV[2]),
  tonumber(ARGV[3]), ARGV[4], ARGV[5])
