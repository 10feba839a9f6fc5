-- Read-write locks and semaphores: what their scripts add to common.lua (the layout is
-- described there). Included only by the scripts that use it, since every helper defined costs
-- every call of the script that includes it.

-- The {w, wq} that `tell` kept in `key`, or nil.
local function told_in(key)
  local w, wq = unpack(redis.call('HMGET', key, 'w', 'wq'))
  if w then
    return {w, wq}
  end
  return nil
end

-- Forgets a holder: its lease, its token, its permits, its write hold.
local function drop_holder(base, holders, owner)
  redis.call('ZREM', holders, owner)
  local n = redis.call('HGET', base, 'n:' .. owner)
  if n then
    redis.call('HINCRBY', base, 'u', -tonumber(n))
  end
  if redis.call('HGET', base, 'wr') == owner then
    redis.call('HDEL', base, 'wr')
  end
  redis.call('HDEL', base, 'f:' .. owner, 'n:' .. owner)
end

-- Drops every holder whose lease has run out. With no holder left, no holder state may be
-- left either: the holders set expires on its own (twice its longest lease after the last
-- renewal) while a queued waiter keeps the hash alive, and the permits, write mark and tokens
-- of holders that died with it would otherwise block the key for as long as anyone waits.
local function purge(base, holders)
  local now = clock()
  local dead = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
  for _, owner in ipairs(dead) do
    drop_holder(base, holders, owner)
  end
  if redis.call('ZCARD', holders) > 0 then
    return
  end
  -- Fields that are not holder state: t, m, u, w, wq (see common.lua).
  local t, m, u, w, wq, wr = unpack(redis.call('HMGET', base, 't', 'm', 'u', 'w', 'wq', 'wr'))
  local kept = 0
  for _, v in ipairs({t or false, m or false, u or false, w or false, wq or false}) do
    if v then
      kept = kept + 1
    end
  end
  if not wr and (u == nil or u == '0') and redis.call('HLEN', base) == kept then
    return
  end
  for _, field in ipairs(redis.call('HKEYS', base)) do
    if field == 'wr' or string.sub(field, 1, 2) == 'f:' or string.sub(field, 1, 2) == 'n:' then
      redis.call('HDEL', base, field)
    end
  end
  if u then
    redis.call('HSET', base, 'u', 0)
  end
end

-- Whether a claim of `kind` ('r', 'w', or a permit count) fits beside the current holders: a
-- writer alone, a reader with readers, permits while enough are free.
local function fits(base, holders, kind)
  if kind == 'w' then
    return redis.call('ZCARD', holders) == 0
  elseif kind == 'r' then
    return not redis.call('HGET', base, 'wr')
  end
  local used = tonumber(redis.call('HGET', base, 'u') or '0')
  return used + tonumber(kind) <= tonumber(redis.call('HGET', base, 'm'))
end

-- Makes `owner` a holder of `kind` with a lease of `px` ms, with token `f` if the caller drew
-- one (else the next); returns its fencing token.
local function add_holder(base, holders, fence, fence_ttl, owner, kind, px, f)
  f = f or next_fence(fence, fence_ttl)
  redis.call('HSET', base, 'f:' .. owner, int(f))
  if kind == 'w' then
    redis.call('HSET', base, 'wr', owner)
  elseif kind ~= 'r' then
    redis.call('HSET', base, 'n:' .. owner, kind)
    redis.call('HINCRBY', base, 'u', tonumber(kind))
  end
  redis.call('ZADD', holders, clock() + px, owner)
  -- Never a key without expiry: if nobody confirms this hold, the bookkeeping goes with it.
  keep(base, 2 * px)
  keep(holders, 2 * px)
  return f
end

-- Grants the queue from its head while the head fits (readers queued together go together; a
-- request that does not fit stops the pass, so nothing overtakes it) and announces each grant.
local function grant_pass(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)
  if not Q.may_grant() then
    return
  end
  local granted = false
  local told = told_in(base)
  local served_last = false
  while true do
    local head, owner = live_head(queue, waiters)
    if not head then
      break
    end
    local kind = parse_entry(head)
    if not fits(base, holders, kind) then
      break
    end
    -- Drawn before the waiter leaves the queue: a counter that is not ours fails the call
    -- before it changed anything.
    local f = next_fence(fence, fence_ttl)
    Q.pop(queue)
    redis.call('ZREM', waiters, owner)
    add_holder(base, holders, fence, fence_ttl, owner, kind, handoff_ttl, f)
    announce(prefix, owner, f, handoff_ttl)
    granted = true
    served_last = served_last or (told ~= nil and told[2] == head)
  end
  if granted then
    if needs_hint(told, served_last, handoff_ttl) then
      hint_next(prefix, queue, handoff_ttl)
    elseif told then
      redis.call('HDEL', base, 'w', 'wq')
    end
  end
end

-- Ms from `now` until the first holder's lease ends; -2 if nobody holds the lock.
local function first_lease_end(holders, now)
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2]) - now
  end
  return -2
end

-- A read-write lock or semaphore nobody holds or waits for keeps nothing but its fence counter.
local function forget_if_idle(base, holders, queue)
  if redis.call('ZCARD', holders) == 0 and Q.len(queue) == 0 then
    redis.call('DEL', base, holders)
  end
end
