-- The single-node operator's unlock (`force_release` in the single-node shared_ops.lua) on one
-- Redlock node, granting nothing while the node sits out its rejoin delay. Tokens come from the
-- quorum (see settle.lua), so no client clock is sent.
-- KEYS: base, holders, queue, waiters, fence, born
-- ARGV: fence ttl ms, handoff ttl ms, channel prefix, rejoin ms
-- Returns {family, removed} (see `force_release`).
gate(KEYS[6], tonumber(ARGV[4]))
return force_release(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], tonumber(ARGV[1]),
  tonumber(ARGV[2]), ARGV[3])
