-- Extend many leases and queue entries in one round trip; a claim whose keys cannot be read
-- (e.g. WRONGTYPE) fails alone (see renew_all).
-- KEYS: base, holders, waiters, queue for each claim
-- ARGV: owner, ttl ms for each claim
-- Returns per claim: 1 lease extended, 2 queue entry extended, 0 neither (not ours), -1 error.
local function renew_one(base, holders, waiters, queue, owner, ttl)
  ttl = tonumber(ttl)
  if extend_mutex(base, owner, ttl) or extend_shared(base, holders, owner, ttl) then
    return 1
  end
  return keep_waiting(base, waiters, queue, owner, ttl)
end

return renew_all(renew_one, 2, KEYS, ARGV)
