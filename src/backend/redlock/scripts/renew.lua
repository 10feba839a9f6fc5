-- One node's part of a Redlock renewal, for many claims in one round trip; a claim whose keys
-- cannot be read fails alone (see renew_all).
-- KEYS: base, holders, waiters, queue for each claim
-- ARGV: owner, ttl ms, mode for each claim: 'h' a held mutex, 'H' a held read-write lock
--       (extend its lease); 'w' a waiter (keep its queue entry, never extend a lease it holds
--       here without a quorum)
-- Returns per claim: 1 lease extended, 2 queue entry kept, 0 neither, -1 error.
local function renew_one(base, holders, waiters, queue, owner, ttl, mode)
  ttl = tonumber(ttl)
  if mode == 'h' then
    -- A lead handed here that its client never settled (it missed this node then) is
    -- provisional: never reported, so it must not count towards the leader's quorum either.
    -- Left to its handoff lease; the leader's lease stands on the nodes that confirmed it.
    local m = mutex_at(base)
    if m and m.t and not m.v then
      return 0
    end
    return extend_mutex(base, owner, ttl) and 1 or 0
  elseif mode == 'H' then
    return extend_shared(base, holders, owner, ttl) and 1 or 0
  end
  return keep_waiting(base, waiters, queue, owner, ttl)
end

return renew_all(renew_one, 3, KEYS, ARGV)
