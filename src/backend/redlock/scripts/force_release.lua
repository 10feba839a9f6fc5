-- The single-node force_release.lua on a Redlock node, gated by the node's rejoin delay: its
-- `born` key is KEYS[6], the delay in ms ARGV[4] (where the single node takes the client's
-- clock, which Redlock's tokens do not use).
gate(KEYS[6], tonumber(ARGV[4]))
