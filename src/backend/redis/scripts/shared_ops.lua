-- The read-write lock and semaphore operations that the single-node scripts and Redlock's run
-- alike, each after reading its own KEYS and ARGV (Redlock's first gate the node's grants, see
-- `gate` in quorum.lua). Included, after shared.lua, only by the scripts that call them.

-- Removes every trace of a read-write lock or semaphore claim: its hold or its queue entry
-- (`entry`, "<kind>:<owner>"), then grants the waiters that now fit (a cancelled writer at the
-- head lets the readers behind it in). Idempotent. Returns 1 if the owner held the lock, 0
-- otherwise.
local function release_shared(base, holders, queue, waiters, fence, owner, fence_ttl,
                              handoff_ttl, prefix, entry)
  if not is_shared(base) then
    -- Not a read-write lock or semaphore (free now, or a mutex that refused this claim): only
    -- our own queue entry may be left, nothing else is ours to touch.
    if redis.call('ZREM', waiters, owner) == 1 then
      Q.remove(queue, entry)
    end
    return 0
  end
  local held = 0
  local deadline = redis.call('ZSCORE', holders, owner)
  if deadline then
    if tonumber(deadline) > clock() then
      held = 1
    end
    drop_holder(base, holders, owner)
  elseif redis.call('ZREM', waiters, owner) == 1 then
    Q.remove(queue, entry)
  end
  if redis.call('EXISTS', base) == 1 then
    purge(base, holders)
    grant_pass(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)
    forget_if_idle(base, holders, queue)
  end
  return held
end

-- Turns `owner`'s write hold into a read hold in one step: no writer can get in between;
-- readers queued behind are granted. The lease is renewed to `ttl` ms and the fencing token
-- kept. Returns {1, fence} on success, {0, 0} if the owner does not hold the lock. Idempotent:
-- a claim that already reads (a first run whose reply was lost downgraded it) is renewed and
-- told so, since a write claim's owner token reads only once it was downgraded.
local function downgrade(base, holders, queue, waiters, fence, owner, ttl, fence_ttl,
                         handoff_ttl, prefix)
  if not is_shared(base) then
    -- Free, or a mutex now (force-released, then taken): not ours.
    return {0, 0}
  end
  purge(base, holders)
  if redis.call('HGET', base, 'wr') ~= owner then
    if not redis.call('ZSCORE', holders, owner) then
      return {0, 0}
    end
    redis.call('ZADD', holders, clock() + ttl, owner)
    keep(base, 2 * ttl)
    keep(holders, 2 * ttl)
    return {1, tonumber(redis.call('HGET', base, 'f:' .. owner))}
  end
  -- A counter that is not ours, or one past 2^53, fails the call here, before it changed
  -- anything (the grant pass below draws from it).
  check_fence(fence)
  redis.call('HDEL', base, 'wr')
  redis.call('ZADD', holders, clock() + ttl, owner)
  keep(base, 2 * ttl)
  keep(holders, 2 * ttl)
  grant_pass(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)
  return {1, tonumber(redis.call('HGET', base, 'f:' .. owner))}
end

-- The operator's unlock: drops every holder of a lock, whoever they are (its mutex holder, or
-- every reader, writer and permit holder), and hands the lock on to the waiters as their
-- releases would. Waiters keep their places. The fencing counter is first set at least to
-- the highest token dropped, so every later grant's token is above all of theirs; the dropped
-- holders' renewals find nothing (their guards report lost).
-- Returns {family, removed}: family '' (free), 'mutex', 'election', 'rw' or 'sem:<permits>';
-- removed a flat list of owner, kind ('x', 'l' for a leader, 'r', 'w' or a permit count),
-- fencing token, lease ms left of every live holder dropped.
local function force_release(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl,
                             prefix)
  local now = clock()
  local family = family_of(base, queue) or ''
  local removed = {}
  local top = 0

  -- Keeps the counter at `top` at least: never below a token handed out, even if it expired.
  -- A counter that expired restarts as at a grant (at server time: a single server's counter
  -- serves every lock of the namespace, and the others' tokens may be above `top`), marked
  -- again for a mutex (`queued`: its waiters stay queued, see `draw`); a mark on it stays.
  local function lift_fence(queued)
    if top > draw(fence, fence_ttl, queued) then
      local _, mark = fence_parts(fence, redis.call('GET', fence))
      redis.call('SET', fence, int(top) .. mark, 'PX', fence_ttl)
    end
  end

  if family == 'mutex' or family == 'election' then
    local m = mutex_at(base)
    if m then
      local left = redis.call('PTTL', base)
      -- A token the hold did not record (see `mutex_of`) is reported as '', and the counter
      -- is above it already.
      removed = {m.o, m.t and 'l' or 'x', m.f or '', left}
      top = tonumber(m.f) or 0
      lift_fence(true)
      if not hand_off(base, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, told_of(m),
                      m.t) then
        redis.call('DEL', base)
      end
      if m.v then
        leader_moved(base)
      end
    end
  elseif family ~= '' then
    -- A counter that is not ours, or one past 2^53, fails the call here, before any holder
    -- is dropped (a mutex's fails at `lift_fence`, before it changed anything; a free key's
    -- needs no counter).
    check_fence(fence)
    local writer = redis.call('HGET', base, 'wr')
    local all = redis.call('ZRANGE', holders, 0, -1, 'WITHSCORES')
    for i = 1, #all, 2 do
      local owner, deadline = all[i], tonumber(all[i + 1])
      local f = redis.call('HGET', base, 'f:' .. owner) or '0'
      top = math.max(top, tonumber(f))
      if deadline > now then
        table.insert(removed, owner)
        table.insert(removed, holder_kind(base, family, writer, owner))
        table.insert(removed, f)
        table.insert(removed, int(deadline - now))
      end
      drop_holder(base, holders, owner)
    end
    lift_fence(false)
    if redis.call('EXISTS', base) == 1 then
      purge(base, holders)
      grant_pass(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)
      forget_if_idle(base, holders, queue)
    end
  end
  return {family, removed}
end
