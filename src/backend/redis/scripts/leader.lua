-- Who leads an election: its holder, once its client confirmed the lead (a lead handed to a
-- candidate is provisional until then, and not reported).
-- KEYS: lock, queue
-- Returns {1, term, lease ms left, value, owner} for the leader, {0} while nobody leads, and
-- {-1, family} if the key is in use as another kind of lock.
local lock, queue = KEYS[1], KEYS[2]
local m = mutex_at(lock)
if m == false or (m and not m.t) then
  return {-1, family_of(lock, queue)}
elseif not m or not m.v then
  return {0}
end
return {1, m.f or '0', redis.call('PTTL', lock), m.v, m.o}
