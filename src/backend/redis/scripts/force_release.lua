-- The operator's unlock: drop every holder of a lock and hand it on (see `force_release` in
-- shared_ops.lua).
-- KEYS: base, holders, queue, waiters, fence
-- ARGV: fence ttl ms, handoff ttl ms, channel prefix ("<lock>:c:"), the client's clock in µs
--       (see `next_fence`)
-- Returns {family, removed} (see `force_release`).
client_clock(ARGV[4])
return force_release(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], tonumber(ARGV[1]),
  tonumber(ARGV[2]), ARGV[3])
