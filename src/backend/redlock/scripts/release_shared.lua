-- One node's part of a Redlock read-write lock release: the single-node `release_shared`
-- (shared_ops.lua), granting the waiters that now fit only if the node has sat out its rejoin
-- delay. Idempotent.
-- KEYS: base, holders, queue, waiters, fence, born
-- ARGV: owner, fence ttl ms, handoff ttl ms, channel prefix, queue entry ("<r|w>:<owner>"),
--       rejoin ms
-- Returns 1 if the owner held the lock here, 0 otherwise.
gate(KEYS[6], tonumber(ARGV[6]))
return release_shared(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], tonumber(ARGV[2]),
  tonumber(ARGV[3]), ARGV[4], ARGV[5])
