-- One node's part of a Redlock downgrade: the single-node `downgrade` (shared_ops.lua), granting
-- the readers behind only if the node has sat out its rejoin delay.
-- KEYS: base, holders, queue, waiters, fence, born
-- ARGV: owner, ttl ms, fence ttl ms, handoff ttl ms, channel prefix, rejoin ms
-- Returns {1, fence} on success, {0, 0} if the owner does not hold the lock here. Idempotent.
gate(KEYS[6], tonumber(ARGV[6]))
return downgrade(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], tonumber(ARGV[2]),
  tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5])
