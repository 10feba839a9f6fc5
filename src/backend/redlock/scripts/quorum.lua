-- Shared by the Redlock scripts (after the single-node helpers). Per lock key on each node:
--   lock     hash  o = owner token, f = fencing token; PX = lease
--   queue    zset  waiting owner -> priority (the waiter's own clock in µs when it first
--                  queued, the same on every node, so every node hands the lock to the same
--                  waiter: the lowest score, then the lowest token)
--   waiters  zset  waiting owner -> liveness deadline (server ms)
--   fence    string counter, long TTL; restarts at server time in microseconds
--   born     string the server ms at which this node first served the namespace (it has no
--                  expiry, so it is gone only if the node lost its data)

-- How many ms the node must still sit out: a node that lost its data may have forgotten a
-- grant, so it grants nothing until every lease it could have held has run out.
local function joining(born, rejoin_ms)
  local now = clock()
  local since = redis.call('GET', born)
  if not since then
    redis.call('SET', born, int(now))
    since = now
  end
  local left = tonumber(since) + rejoin_ms - now
  if left > 0 then
    return left
  end
  return 0
end

-- The waiting owner with the lowest priority whose liveness deadline has not passed; dead
-- ones are dropped.
local function live_head(queue, waiters)
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
      return nil
    end
    local deadline = redis.call('ZSCORE', waiters, head)
    if deadline and tonumber(deadline) > clock() then
      return head
    end
    redis.call('ZREM', queue, head)
    redis.call('ZREM', waiters, head)
  end
end

-- Gives the free lock to the live head of the queue under a provisional lease, announces it,
-- and tells the waiter next in line when that lease ends.
local function hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)
  local head = live_head(queue, waiters)
  if not head then
    return
  end
  redis.call('ZREM', queue, head)
  redis.call('ZREM', waiters, head)
  local f = grant(lock, fence, head, handoff_ttl, fence_ttl)
  announce(prefix, head, f, handoff_ttl)
  local next_in_line = live_head(queue, waiters)
  if next_in_line then
    redis.call('PUBLISH', channel_of(prefix, next_in_line),
      next_in_line .. ' ' .. int(clock()) .. ' ' .. handoff_ttl)
  end
end
