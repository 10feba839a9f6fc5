-- Shared by every distlock script. Per lock key (one hash tag, so one Cluster slot):
--   lock     hash  o = owner token, f = fencing token          PX = lease
--   queue    list  owner tokens in arrival order
--   waiters  zset  owner token -> liveness deadline (server ms)
--   fence    string counter, long TTL; restarts at server time in microseconds
-- Every time is the server's TIME; no client clock reaches a score.

-- Server time in ms and in µs, read once per script and only if needed.
local NOW, NOW_US
local function clock()
  if not NOW then
    local t = redis.call('TIME')
    local s, us = tonumber(t[1]), tonumber(t[2])
    NOW, NOW_US = s * 1000 + math.floor(us / 1000), s * 1000000 + us
  end
  return NOW, NOW_US
end

local function int(n)
  return string.format('%.0f', n)
end

-- Sets a TTL of at least `ms` on a bookkeeping key, never shortening a longer one.
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- The next fencing token: one more than the last; a new counter (the old one expired, which
-- it does `fence_ttl` after it was created) starts at server time in microseconds. Grants come
-- far less often than once a microsecond, so that is above every token handed out before, and
-- the counter itself cannot leak.
local function next_fence(fence, fence_ttl)
  local f = redis.call('INCR', fence)
  if f == 1 then
    local _, now_us = clock()
    f = now_us
    redis.call('SET', fence, int(f), 'PX', fence_ttl)
  end
  return f
end

local function grant(lock, fence, owner, px, fence_ttl)
  local f = next_fence(fence, fence_ttl)
  redis.call('HSET', lock, 'o', owner, 'f', int(f))
  redis.call('PEXPIRE', lock, px)
  return f
end

-- The first queued owner whose liveness deadline has not passed; dead ones are dropped.
local function live_head(queue, waiters)
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      return nil
    end
    local now = clock()
    local deadline = redis.call('ZSCORE', waiters, head)
    if deadline and tonumber(deadline) > now then
      return head
    end
    redis.call('LPOP', queue)
    if deadline then
      redis.call('ZREM', waiters, head)
    end
  end
end

-- Owner tokens are "<client id>.<claim id>"; each client listens on its own channel per lock,
-- "<lock>:c:<client id>", so a message reaches only the client it names.
local function channel_of(prefix, owner)
  return prefix .. string.match(owner, '^[^.]*')
end

-- Gives the free lock to the live head of the queue, for a short unconfirmed lease, and
-- announces it to that owner's client: "<owner> <fence> <server ms> <px>". The waiter now first
-- in line is told when that lease ends ("<owner> <server ms> <px>"): if the new owner died
-- before confirming it, that waiter takes over then instead of at the old holder's deadline.
local function hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)
  local head = live_head(queue, waiters)
  if not head then
    return
  end
  redis.call('LPOP', queue)
  redis.call('ZREM', waiters, head)
  local f = grant(lock, fence, head, handoff_ttl, fence_ttl)
  local now = int(clock())
  redis.call('PUBLISH', channel_of(prefix, head), head .. ' ' .. int(f) .. ' ' .. now .. ' ' .. handoff_ttl)
  local next_in_line = redis.call('LINDEX', queue, 0)
  if next_in_line then
    redis.call('PUBLISH', channel_of(prefix, next_in_line), next_in_line .. ' ' .. now .. ' ' .. handoff_ttl)
  end
end
