-- Reads a lock without changing it: its family, its live holders and its live waiters.
-- KEYS: base, holders, queue, waiters (fence is not read)
-- Returns {family, holders, waiters}: family '' (free), 'mutex', 'election', 'rw' or
-- 'sem:<permits>';
-- holders a flat list of kind, fencing token, lease ms left; waiters a flat list of kinds, in
-- queue order. Kinds: 'x' (mutex), 'l' (election), 'r', 'w', or a permit count. Expired holders and dead
-- waiters are left out (the next script that writes purges them).
local base, holders, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = clock()
local family = family_of(base, queue) or ''
local held, waiting = {}, {}

if family == 'mutex' or family == 'election' then
  local m = mutex_at(base)
  local left = redis.call('PTTL', base)
  if m and left > 0 then
    -- A token the hold did not record (see `mutex_of`) is reported as ''.
    held = {m.t and 'l' or 'x', m.f or '', left}
  end
elseif family ~= '' then
  local writer = redis.call('HGET', base, 'wr')
  local live = redis.call('ZRANGEBYSCORE', holders, '(' .. int(now), '+inf', 'WITHSCORES')
  for i = 1, #live, 2 do
    local owner, deadline = live[i], tonumber(live[i + 1])
    local f = redis.call('HGET', base, 'f:' .. owner) or '0'
    table.insert(held, holder_kind(base, family, writer, owner))
    table.insert(held, f)
    table.insert(held, int(deadline - now))
  end
end

for _, entry in ipairs(redis.call('LRANGE', queue, 0, -1)) do
  local kind, owner = parse_entry(entry)
  local deadline = redis.call('ZSCORE', waiters, owner)
  if deadline and tonumber(deadline) > now then
    table.insert(waiting, kind or (family == 'election' and 'l') or 'x')
  end
end
return {family, held, waiting}
