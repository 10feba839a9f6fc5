-- Reads one node's view of a lock without changing it.
-- KEYS: lock, holders, queue, waiters
-- Returns {family, holders, waiting}: family '' (free), 'mutex', 'election' or 'rw'; holders a
-- flat list of owner, kind ('x', 'l', 'r' or 'w'), fence, lease ms for the live holders here; waiting a flat
-- list of queue entry, priority for the live waiters, in priority order.
local lock, holders, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = clock()
local family = family_of(lock, queue) or ''
local held = {}
if family == 'mutex' or family == 'election' then
  local m = mutex_at(lock)
  local left = redis.call('PTTL', lock)
  if m and left > 0 then
    held = {m.o, m.t and 'l' or 'x', m.f, left}
  end
elseif family == 'rw' then
  local writer = redis.call('HGET', lock, 'wr')
  local live = redis.call('ZRANGEBYSCORE', holders, '(' .. int(now), '+inf', 'WITHSCORES')
  for i = 1, #live, 2 do
    local owner = live[i]
    local kind = holder_kind(lock, family, writer, owner)
    for _, v in ipairs({owner, kind, redis.call('HGET', lock, 'f:' .. owner) or '0',
        int(tonumber(live[i + 1]) - now)}) do
      table.insert(held, v)
    end
  end
end
local waiting = {}
local queued = redis.call('ZRANGE', queue, 0, -1, 'WITHSCORES')
for i = 1, #queued, 2 do
  local _, owner = parse_entry(queued[i])
  local deadline = redis.call('ZSCORE', waiters, owner)
  if deadline and tonumber(deadline) > now then
    table.insert(waiting, queued[i])
    table.insert(waiting, queued[i + 1])
  end
end
return {family, held, waiting}
