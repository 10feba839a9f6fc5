-- Runs a single-node read-write lock script on a Redlock node: the same KEYS and ARGV, then the
-- node's `born` key and its rejoin delay in ms, so it grants nothing while the node sits out.
gate(KEYS[6], tonumber(ARGV[6]))
