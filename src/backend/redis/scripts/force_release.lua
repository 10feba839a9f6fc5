-- The operator's unlock: drop every holder of a lock, whoever they are (its mutex holder, or
-- every reader, writer and permit holder), and hand the lock on to the waiters as their
-- releases would. Waiters keep their places. The fencing counter is first set at least to
-- the highest token dropped, so every later grant's token is above all of theirs; the dropped
-- holders' renewals find nothing (their guards report lost).
-- KEYS: base, holders, queue, waiters, fence
-- ARGV: fence ttl ms, handoff ttl ms, channel prefix ("<lock>:c:"), the client's clock in µs
--       (see `next_fence`)
-- Returns {family, removed}: family '' (free), 'mutex', 'rw' or 'sem:<permits>'; removed a
-- flat list of owner, kind ('x', 'r', 'w' or a permit count), fencing token, lease ms left of
-- every live holder dropped.
-- Redlock runs it on every node after gated.lua's `gate` with the node's `born` key as KEYS[6]
-- and its rejoin delay in ms as ARGV[4] (it has no client clock: its tokens come from the
-- quorum, see settle.lua).
local base, holders, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local fence_ttl, handoff_ttl, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
client_clock(ARGV[4])

local now = clock()
local family = family_of(base, queue) or ''
local removed = {}
local top = 0

-- Keeps the counter at `top` at least: never below a token handed out, even if it expired.
local function lift_fence()
  local f = tonumber(redis.call('GET', fence) or '0')
  if top > f then
    redis.call('SET', fence, int(top), 'PX', fence_ttl)
  end
end

if family == 'mutex' then
  local owner, f, w, wq = unpack(redis.call('HMGET', base, 'o', 'f', 'w', 'wq'))
  if owner then
    local left = redis.call('PTTL', base)
    removed = {owner, 'x', f or '0', left}
    top = tonumber(f or '0')
    lift_fence()
    local told = nil
    if w then
      told = {w, wq}
    end
    if not hand_off(base, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, told, true) then
      redis.call('DEL', base)
    end
  end
elseif family ~= '' then
  local writer = redis.call('HGET', base, 'wr')
  local all = redis.call('ZRANGE', holders, 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    local owner, deadline = all[i], tonumber(all[i + 1])
    local f = redis.call('HGET', base, 'f:' .. owner) or '0'
    top = math.max(top, tonumber(f))
    if deadline > now then
      local kind = 'r'
      if owner == writer then
        kind = 'w'
      elseif family ~= 'rw' then
        kind = redis.call('HGET', base, 'n:' .. owner) or '0'
      end
      table.insert(removed, owner)
      table.insert(removed, kind)
      table.insert(removed, f)
      table.insert(removed, int(deadline - now))
    end
    drop_holder(base, holders, owner)
  end
  lift_fence()
  if redis.call('EXISTS', base) == 1 then
    purge(base, holders)
    grant_pass(base, holders, queue, waiters, fence, fence_ttl, handoff_ttl, prefix)
    forget_if_idle(base, holders, queue)
  end
end
return {family, removed}
