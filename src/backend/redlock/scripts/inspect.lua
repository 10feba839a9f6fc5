-- Reads one node's view of a lock without changing it.
-- KEYS: lock, queue, waiters
-- Returns {holder, waiting}: holder {owner, fence, lease ms} or {} if nobody holds it here;
-- waiting a flat list of owner, priority for the live waiters, in priority order.
local lock, queue, waiters = KEYS[1], KEYS[2], KEYS[3]
local now = clock()
local holder = {}
local owner = redis.call('HGET', lock, 'o')
if owner then
  local left = redis.call('PTTL', lock)
  if left > 0 then
    holder = {owner, redis.call('HGET', lock, 'f') or '0', left}
  end
end
local waiting = {}
local queued = redis.call('ZRANGE', queue, 0, -1, 'WITHSCORES')
for i = 1, #queued, 2 do
  local deadline = redis.call('ZSCORE', waiters, queued[i])
  if deadline and tonumber(deadline) > now then
    table.insert(waiting, queued[i])
    table.insert(waiting, queued[i + 1])
  end
end
return {holder, waiting}
