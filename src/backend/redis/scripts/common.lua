-- Shared by every distlock script. Per lock key (one hash tag, so one Cluster slot):
--   lock     hash  o = owner token, f = fencing token          PX = lease
--   queue    list  owner tokens in arrival order
--   waiters  zset  owner token -> liveness deadline (server ms)
--   fence    string counter, long TTL; restarts at server time in microseconds
-- Every time is the server's TIME; no client clock reaches a score.

local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
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

-- The next fencing token: one more than the last, or server time in microseconds when the
-- counter has expired, so tokens keep increasing while the counter itself cannot leak.
local function next_fence(fence, now_us, fence_ttl)
  local f = redis.call('INCR', fence)
  if f == 1 then
    f = now_us
    redis.call('SET', fence, int(f))
  end
  redis.call('PEXPIRE', fence, fence_ttl)
  return f
end

local function grant(lock, fence, owner, px, now_us, fence_ttl)
  local f = next_fence(fence, now_us, fence_ttl)
  redis.call('HSET', lock, 'o', owner, 'f', int(f))
  redis.call('PEXPIRE', lock, px)
  return f
end

-- The first queued owner whose liveness deadline has not passed; dead ones are dropped.
local function live_head(queue, waiters, now)
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      return nil
    end
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

-- Gives the free lock to the live head of the queue, for a short unconfirmed lease, and
-- announces it: "<owner> <fence> <server ms> <px>".
local function hand_off(lock, queue, waiters, fence, now, now_us, fence_ttl, handoff_ttl, channel)
  local head = live_head(queue, waiters, now)
  if not head then
    return
  end
  redis.call('LPOP', queue)
  redis.call('ZREM', waiters, head)
  local f = grant(lock, fence, head, handoff_ttl, now_us, fence_ttl)
  redis.call('PUBLISH', channel, head .. ' ' .. int(f) .. ' ' .. int(now) .. ' ' .. handoff_ttl)
end
