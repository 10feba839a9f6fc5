-- Replaces what an election's leader proclaims, if `owner` still leads; its observers are told.
-- KEYS: lock
-- ARGV: owner, the value
-- Returns 1 if it leads, 0 otherwise.
local lock, owner = KEYS[1], ARGV[1]
local m = mutex_at(lock)
if not (m and m.o == owner and m.v) then
  return 0
end
redis.call('SET', lock, mutex_value(m.f, m.o, m.q, told_of(m), '=' .. ARGV[2]), 'KEEPTTL')
leader_moved(lock)
return 1
