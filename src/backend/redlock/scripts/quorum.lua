-- Shared by the Redlock scripts (after the single-node helpers). Per lock key on each node, the
-- single-node layout (common.lua), except:
--   queue    zset  queue entry (the owner for a mutex, "<r|w>:<owner>" for a read-write lock)
--                  -> priority (the waiter's own clock in µs when it first queued, the same
--                  on every node, so every node hands the lock to the same waiter: the lowest
--                  score, then the lowest entry)
--   waiters  zset  waiting owner -> liveness deadline (server ms)
--   fence    string counter, long TTL; restarts at server time in microseconds
--   born     string the server ms since which this node remembers every grant of the
--                  namespace: when its redis-server started (from INFO's uptime, read the first
--                  time it serves the namespace). It has no expiry, so it is gone only if the
--                  node lost its data; a node that kept it through a restart kept its data.

Q.first = function(queue) return redis.call('ZRANGE', queue, 0, 0)[1] end
Q.head = function(queue, n) return redis.call('ZRANGE', queue, 0, n - 1) end
Q.last = function(queue) return redis.call('ZRANGE', queue, -1, -1)[1] end
Q.pop = function(queue) redis.call('ZPOPMIN', queue) end
Q.remove = function(queue, entry) redis.call('ZREM', queue, entry) end
Q.len = function(queue) return redis.call('ZCARD', queue) end
-- A Redlock waiter re-checks at a moment merged from several nodes, which no node knows: the
-- waiter next in line always hears when a provisional lease ends.
Q.hint_always = true
-- Every acquire here looks at the queue: the fence key carries no mark.
Q.marks = false
-- Tokens come from the quorum (the highest of a majority's counters), and a node that lost its
-- data sits out until its leases could have run out: no node's clock lifts them.
Q.fence_floor = false

-- How many ms the node must still sit out: a node that lost its data (restarted) may have
-- forgotten a grant, so it grants nothing until every lease it could have held has run out,
-- `rejoin_ms` after its server started. A node up longer than that votes at once, whether or
-- not it served the namespace before: it has forgotten nothing.
local function joining(born, rejoin_ms)
  local now = clock()
  local since = redis.call('GET', born)
  if not since then
    -- Uptime counts whole seconds and may be up to one ahead: take one off, so the start we
    -- assume is never earlier than the real one. A server that keeps INFO from scripts (an
    -- ACL without +info) counts as just started: it sits out the whole delay from now.
    local info = redis.pcall('INFO', 'server')
    local up = 0
    if type(info) == 'string' then
      up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or 0
    end
    since = now - math.max(up - 1, 0) * 1000
    redis.call('SET', born, int(since))
  end
  local left = tonumber(since) + rejoin_ms - now
  if left > 0 then
    return left
  end
  return 0
end

-- Whether a live waiter queued here comes before our queue `entry` of `priority` (a lower
-- score, or the same score and a lower entry): then the node should have served it first.
local function served_before_us(queue, waiters, priority, entry)
  local head = live_head(queue, waiters)
  if not head then
    return false
  end
  local score = tonumber(redis.call('ZSCORE', queue, head))
  return score < priority or (score == priority and head < entry)
end

-- Puts our queue `entry` back in its place (same priority), alive for `ttl` ms.
local function requeue(queue, waiters, priority, entry, owner, ttl)
  redis.call('ZADD', queue, priority, entry)
  redis.call('ZADD', waiters, clock() + ttl, owner)
end

-- The rejoin gate of this call (see `gate`): the node's `born` key and its rejoin delay in ms,
-- or nil while the call grants as it goes.
local GATE

-- From here on, this call grants (hands on, grant passes) only if the node has sat out its
-- rejoin delay.
local function gate(born, rejoin_ms)
  GATE = {born, rejoin_ms}
end

Q.may_grant = function() return GATE == nil or joining(GATE[1], GATE[2]) == 0 end
-- A function call starts ungated, whatever the call before it gated.
Q.fresh = function() GATE = nil end
