-- Renewal: what the renewal scripts add to common.lua.
--
-- A renewal never shortens a lease: it sets the lease to end `ttl` ms from now or leaves it
-- where it ends later. Renewals of one claim sent on different connections (a pool) may reach
-- the server out of order; an older one asking for a shorter TTL (before the guard extended
-- its lease) must not cut short the lease the client was told of.

-- Extends `owner`'s mutex lease to at least `ttl` ms if it holds the mutex.
local function extend_mutex(base, owner, ttl)
  local m = mutex_at(base)
  if m and m.o == owner then
    if redis.call('PTTL', base) < ttl then
      redis.call('PEXPIRE', base, ttl)
    end
    return true
  end
  return false
end

-- Extends `owner`'s read-write lock or semaphore hold to at least `ttl` ms if it holds one; a
-- lease already run out is not revived.
local function extend_shared(base, holders, owner, ttl)
  local now = clock()
  local deadline = redis.call('ZSCORE', holders, owner)
  if deadline and tonumber(deadline) > now then
    if now + ttl > tonumber(deadline) then
      redis.call('ZADD', holders, 'XX', now + ttl, owner)
    end
    keep(base, 2 * ttl)
    keep(holders, 2 * ttl)
    return true
  end
  return false
end

-- Keeps `owner`'s place in the queue for `ttl` ms if it waits: 2, else 0.
local function keep_waiting(base, waiters, queue, owner, ttl)
  if redis.call('ZSCORE', waiters, owner) then
    redis.call('ZADD', waiters, clock() + ttl, owner)
    keep(queue, 2 * ttl)
    keep(waiters, 2 * ttl)
    -- A read-write lock's or semaphore's hash lives while anyone waits. (A mutex's value's TTL
    -- is its holder's lease: a waiter must never touch it.)
    if is_shared(base) then
      keep(base, 2 * ttl)
    end
    return 2
  end
  return 0
end

-- Runs `renew_one(base, holders, waiters, queue, args...)` for every claim of a renewal call
-- (four of `keys` and `nargs` of `argv` each), each on its own (pcall): a key of a foreign
-- type, or any other error, fails that claim only (-1).
local function renew_all(renew_one, nargs, keys, argv)
  local out = {}
  for i = 1, #argv / nargs do
    local args = {}
    for j = 1, nargs do
      args[j] = argv[nargs * (i - 1) + j]
    end
    local ok, r = pcall(renew_one, keys[4 * i - 3], keys[4 * i - 2], keys[4 * i - 1],
      keys[4 * i], unpack(args))
    if ok then
      out[i] = r
    else
      out[i] = -1
    end
  end
  return out
end
