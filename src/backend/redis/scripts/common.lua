-- Shared by every distlock script. Per lock key (one hash tag, so one Cluster slot):
--   base     a mutex: a string "m <fence> <q> <owner>[ <w> <wq>]" while it is held, whose
--                  expiry is the holder's lease (see `mutex_value`): q = 1 once anyone may be
--                  queued behind this hold (0: its release need not look at the queue); w and
--                  wq as below. An election's leadership is held the same way, followed by
--                  "\n?" while the lead handed to a candidate is provisional (it leads once
--                  its client confirms it) or "\n=<value>" (its leader, proclaiming value)
--                  A hold taken by a single server's plain commands (`redis/fast.rs`) is the
--                  bare owner token: no token recorded, nobody queued behind it
--            hash  a read-write lock or semaphore: t = rw | sem, m = permits (sem),
--                  u = permits in use (sem), wr = the writer (rw), f:<owner> = each holder's
--                  fencing token, n:<owner> = each holder's permits (sem); w and wq as below
--            any:  w = the latest moment (server ms) a waiter was told to re-check at, if
--                  later than a provisional lease would end, and wq = the queue's last entry
--                  then (see `next_told`)
--   holders  zset  owner -> lease deadline (server ms): read-write locks and semaphores
--   queue    list  a mutex: owner tokens; the others: "<r|w|count>:<owner>", in arrival order
--                  (Redlock: a zset of the same entries by priority, see `Q`)
--   waiters  zset  owner token -> liveness deadline (server ms)
--   fence    string counter, long TTL; restarts at server time in microseconds. Per lock
--                  (`<lock>:fence`) on a Cluster, behind Sentinel and on Redlock nodes; on a
--                  single server one per namespace, `<ns>:fence`, outside the hash tag
--                  (`Q.fence_of`, plain.lua). Where `Q.marks`, a "q" after the number marks
--                  that a mutex waiter may be queued (see `mark_queued`): an uncontended mutex
--                  acquire then learns from its INCR alone that it need not look at the queue,
--                  and it takes the lock with one `SET NX PX`; where not (a single server), it
--                  looks at the queue instead.
-- Owner tokens are "<client id>.<claim id>" (no spaces). Every time is the server's TIME; no
-- client clock reaches a score (a client's clock only lifts fencing tokens: see `next_fence`).

-- How the queue is kept, whether the node may grant, how grants are announced, whether
-- tokens stay above the server's clock, and what else a call starts afresh. Here: a list in
-- arrival order, always, PUBLISH, yes, nothing. Redlock replaces the first two (a zset by
-- priority; a node that lost its data grants nothing for a while), the fence floor (its
-- tokens come from its quorum) and the last (its rejoin gate), Redis Cluster the publish
-- (sharded.lua), a single server whether counters are marked and which counter a lock draws
-- from (plain.lua). Looked up when called, so a file included later can replace them.
local Q = {
  first = function(queue) return redis.call('LINDEX', queue, 0) end,
  head = function(queue, n) return redis.call('LRANGE', queue, 0, n - 1) end,
  last = function(queue) return redis.call('LINDEX', queue, -1) end,
  pop = function(queue) redis.call('LPOP', queue) end,
  remove = function(queue, entry) redis.call('LREM', queue, 1, entry) end,
  len = function(queue) return redis.call('LLEN', queue) end,
  may_grant = function() return true end,
  publish = function(channel, message) return redis.call('PUBLISH', channel, message) end,
  -- A counter may come back behind the tokens it handed out: restored from a stale
  -- snapshot, lost with a restart without data, or missing the last increments on a promoted
  -- replica (replication is asynchronous). So no token is below server time in µs.
  fence_floor = true,
  hint_always = false,
  -- Whether mutex waiters mark the fence key (see `mark_queued`): Redlock's acquire always
  -- looks at its queue, and a single server's counter serves a whole namespace (see
  -- `plain.lua`), so neither keeps a mark; their acquires look at the queue instead.
  marks = true,
  -- The fencing counter of the lock named `lock` (`<ns>:{<key>}`): its own, here.
  fence_of = function(lock) return lock .. ':fence' end,
  fresh = function() end,
}

-- Server time in ms and in µs, read once per script and only if needed.
local NOW, NOW_US
-- The wall clock in µs of the client whose call this is, as it sent it (`client_clock`), or
-- nil: a second floor for fencing tokens where the server's may be wrong (see `next_fence`).
local CLIENT_US
local function clock()
  if not NOW then
    local t = redis.call('TIME')
    local s, us = tonumber(t[1]), tonumber(t[2])
    NOW, NOW_US = s * 1000 + math.floor(us / 1000), s * 1000000 + us
  end
  return NOW, NOW_US
end

-- Forgets what the last call kept (the clock read, and `Q.fresh`'s). A script sent by EVALSHA
-- starts afresh at every call; a function of our library (FCALL) shares the library's state
-- with earlier calls, so it starts with this.
local function fresh()
  NOW, NOW_US, CLIENT_US = nil, nil, nil
  Q.fresh()
end

-- The path most releases take: a hold the client took with its own SET NX PX, that no waiter
-- has looked at since (its value is the bare owner token), is just deleted. A claim's keys and
-- arguments start after the `k`-th key and the `a`-th argument (the lock first, the owner
-- first). Returns 1 if it deleted the hold; else nothing, and the lock's value (or the error
-- reading it) for the caller to go on with.
local function release_plain(keys, argv, k, a)
  local lock = keys[k + 1]
  local v = redis.pcall('GET', lock)
  if v == argv[a + 1] and redis.pcall('DEL', lock) == 1 then
    return 1
  end
  return nil, v
end

-- The release's keys and own arguments rebuilt from the two its coalesced form sends for each
-- claim (`Part::sends`): the lock's name and the owner. The others' names are the lock's with
-- a suffix (`redis/keys.rs`): the queue, the waiters, and the prefix of the lock's channels,
-- the release's second argument; the fencing counter is `Q.fence_of`'s. `k` and `a` are
-- changed in place.
local function release_widen(k, a)
  local lock = k[1]
  k[2], k[3], k[4] = lock .. ':q', lock .. ':w', Q.fence_of(lock)
  table.insert(a, 2, lock .. ':c:')
end

-- Takes the calling client's clock (µs since 1970, as a string; anything else is ignored),
-- where tokens have a floor (`Q.fence_floor`) and nowhere else (Redlock's tokens come from its
-- quorum, and its scripts send no clock).
local function client_clock(arg)
  local us = tonumber(arg)
  if Q.fence_floor and us and us > 0 then
    CLIENT_US = us
  end
end

local function int(n)
  return string.format('%.0f', n)
end

-- Keeps a bookkeeping key alive for at least `ms` / 2 (callers pass twice what they need):
-- below that, its TTL goes up to `ms`, so a busy key pays for a PEXPIRE once per `ms` / 2, not
-- at every call. Never shortens a longer TTL.
local function keep(key, ms)
  if redis.call('PTTL', key) < ms / 2 then
    redis.call('PEXPIRE', key, ms)
  end
end

-- The counter in the fence key's value `v` (0 if there is none) and its mark ('q' or '').
-- Anything else there is not ours: reading it as a number raises the server's error.
local function fence_parts(fence, v)
  if not v then
    return 0, ''
  end
  local n, mark = string.match(v, '^(%d+)(q?)$')
  if not n then
    redis.call('INCR', fence)
  end
  return tonumber(n), mark
end

-- A counter below this (2^40, twelve days after 1970 in µs) was not started by `next_fence`:
-- made by an uncontended acquire's `INCR` on a key that had none (`redis/fast.rs`, which sends
-- such a grant here to be lifted), so it restarts at server time like a new one.
local FENCE_LOW = 1099511627776

-- A counter at or above this (2^53) is past the numbers Lua counts exactly (it has doubles
-- only): `f + 1` would give `f` again, or wrap in the reply. Only a counter set by hand gets
-- there (server time in µs, from which counters start, passes it in the year 2255).
local FENCE_HIGH = 9007199254740992

-- Fails the call: counter `fence` is at or past `FENCE_HIGH`.
local function past_high(fence)
  error({err = 'distlock: the fencing counter ' .. fence .. ' is past 2^53, where tokens '
    .. 'cannot grow by one any more (it was set by hand?); delete it to restart it at '
    .. 'server time'})
end

-- The next fencing token: one more than the last; a new counter (the old one expired, which
-- it does `fence_ttl` after it was created, or one below `FENCE_LOW`) starts at server time in
-- microseconds. Grants come
-- far less often than once a microsecond, so that is above every token handed out before, and
-- the counter itself cannot leak. With `unmarked`, a counter marked (see `mark_queued`) is
-- left alone and nil is returned: the caller looks at the queue instead.
--
-- With `Q.fence_floor` no token is below server time in µs, nor below the calling client's
-- clock in µs (`client_clock`), at all: a counter that came back behind (restored from a
-- snapshot older than the last grants, or set back by a failover whose promoted replica
-- missed the last increments) still goes on above every token issued before, unless both
-- clocks read earlier than the clock that issued it did (one server's clock alone, stepped
-- back by more than the outage took, no longer sends tokens back). A client's clock
-- lifts a token at most `fence_ttl` / 2 above the server's: a token set there is below server
-- time by the time its counter expires (it lives `fence_ttl` from that write), so the restart
-- at server time stays above it; and a wild client clock cannot push tokens out of the range
-- a Lua number holds exactly.
--
-- Also says whether the counter restarted (it was missing, or below `FENCE_LOW`): whatever
-- mark it carried is gone with it, so a caller that may grant past a queue must look at the
-- queue. A counter written here (lifted, or marked) lives `fence_ttl` from then.
--
-- `marked` says the counter is likely marked (a grant with waiters still queued behind it):
-- then it is read first, since `INCR` would be refused (two commands, not three).
local function next_fence(fence, fence_ttl, unmarked, marked)
  local f, mark
  if marked then
    local v = redis.call('GET', fence)
    if v and string.byte(v, -1) == 113 then
      f, mark = fence_parts(fence, v)
      f = f + 1
    end
  end
  if not f then
    f, mark = redis.pcall('INCR', fence), ''
    if type(f) ~= 'number' then
      if unmarked then
        return nil
      end
      f, mark = fence_parts(fence, redis.call('GET', fence))
      f = f + 1
    end
  end
  if f >= FENCE_HIGH then
    past_high(fence)
  end
  local restarted = f < FENCE_LOW
  local lifted = false
  if f < FENCE_LOW or Q.fence_floor then
    local _, now_us = clock()
    local floor = now_us
    if CLIENT_US then
      floor = math.max(floor, math.min(CLIENT_US, now_us + fence_ttl * 500))
    end
    if f < floor then
      f, lifted = floor, true
    end
  end
  if lifted or mark ~= '' then
    redis.call('SET', fence, int(f) .. mark, 'PX', fence_ttl)
  end
  return f, restarted
end

-- Fails the call as a draw from counter `fence` would (a value that is not a counter, or one
-- at `FENCE_HIGH`), for a script that must fail before it changes anything and draws later.
local function check_fence(fence)
  local n = fence_parts(fence, redis.call('GET', fence))
  if n + 1 >= FENCE_HIGH then
    past_high(fence)
  end
end

-- Marks the fence key while a mutex waiter may be queued: its value `f`, as `next_fence` just
-- drew it unmarked (or what it holds now, if more: a token drawn since), becomes "<f>q", which
-- INCR refuses, so every acquire looks at the queue (a holder whose lease ran out must not be
-- barged past). A busy key's counter so lives `fence_ttl` past its last mark.
local function mark_queued(fence, f, fence_ttl)
  local now = fence_parts(fence, redis.call('GET', fence))
  redis.call('SET', fence, int(math.max(f, now)) .. 'q', 'PX', fence_ttl)
end

-- Takes the mark off once the queue was seen empty.
local function unmark(fence, fence_ttl)
  if not Q.marks then
    return
  end
  local v = redis.call('GET', fence)
  local f, mark = fence_parts(fence, v)
  if mark ~= '' then
    redis.call('SET', fence, int(f), 'PX', fence_ttl)
  end
end

-- A mutex hold's value (see the layout above): fencing token `f` (a number, the string kept,
-- or nil where none was recorded: written '-'), `owner`, whether anyone may be queued behind it, and `told` ({w, wq}, or nil).
-- `tail` (nil for a mutex) makes it an election's: '?' (provisional) or '=<value>'.
local function mutex_value(f, owner, queued, told, tail)
  if type(f) == 'number' then
    f = int(f)
  elseif not f then
    f = '-'
  end
  local q = '0'
  if queued then
    q = '1'
  end
  local v = 'm ' .. f .. ' ' .. q .. ' ' .. owner
  if told then
    v = v .. ' ' .. told[1] .. ' ' .. told[2]
  end
  if tail then
    v = v .. '\n' .. tail
  end
  return v
end

-- The mutex hold a lock key's value `v` (as `GET` answered it, by `pcall`) describes:
-- {o = owner, f = token (a string, nil if not recorded), q = anyone may be queued, w, wq (nil
-- unless told), t = an election's tail ('?' or '=<value>', nil for a mutex), v = the value
-- its leader proclaims (nil unless confirmed)}; nil if the key is missing (nobody holds a mutex there), false if it is no
-- string (a read-write lock or semaphore). A bare owner token (it holds no space) is a hold the
-- client took with its own `SET NX PX` (the uncontended acquire, `redis/fast.rs`): its token
-- is not recorded, and nobody was queued behind it then. A string that is not a hold raises
-- the server's WRONGTYPE error: the key is not ours.
local function mutex_of(lock, v)
  if type(v) == 'table' then
    return false
  elseif not v then
    return nil
  elseif not string.find(v, ' ', 1, true) then
    return {o = v, q = false}
  end
  local nl, t, said = string.find(v, '\n', 1, true), nil, nil
  if nl then
    t = string.sub(v, nl + 1)
    v = string.sub(v, 1, nl - 1)
    if string.byte(t, 1) == 61 then
      said = string.sub(t, 2)
    end
  end
  local f, q, o, rest = string.match(v, '^m ([%d-]+) ([01]) (%S+)(.*)$')
  if not f then
    redis.call('HGET', lock, 'o')
  end
  local w, wq = string.match(rest, '^ (%d+) (%S+)$')
  if f == '-' then
    f = nil
  end
  return {o = o, f = f, q = q == '1', w = w, wq = wq, t = t, v = said}
end

-- The mutex hold at `lock` (see `mutex_of`).
local function mutex_at(lock)
  return mutex_of(lock, redis.pcall('GET', lock))
end

-- What `mutex_at` read as {w, wq}, or nil.
local function told_of(m)
  if m and m.w then
    return {m.w, m.wq}
  end
  return nil
end

-- Whether `base` is a read-write lock's or semaphore's hash.
local function is_shared(base)
  return redis.pcall('HEXISTS', base, 't') == 1
end

-- The token of a mutex grant with waiters maybe `queued` behind it. A caller that takes its
-- grantee off the queue draws it first: a counter that is not ours (not a number) then fails
-- the call before it changed anything, and the waiter keeps its place.
local function draw(fence, fence_ttl, queued)
  local f, restarted = next_fence(fence, fence_ttl, false, queued and Q.marks)
  if restarted and queued and Q.marks then
    -- The counter's mark went with it; others may still wait behind this holder.
    mark_queued(fence, f, fence_ttl)
  end
  return f
end

-- Makes `owner` the mutex's holder for `px` ms, with token `f` if the caller drew one (else
-- the next, see `draw`); `told` (if any: the w and wq of `next_told`) is kept on the hold, and
-- `queued` marks it as having waiters behind it. `tail` makes it an election's (see
-- `mutex_value`).
local function grant(lock, fence, owner, px, fence_ttl, told, queued, f, tail)
  if not f then
    f = draw(fence, fence_ttl, queued)
  end
  redis.call('SET', lock, mutex_value(f, owner, queued, told, tail), 'PX', px)
  return f
end

-- Tells an election's observers (on "<lock>:e") that its leader may have changed.
local function leader_moved(lock)
  Q.publish(lock .. ':e', 'leader')
end

-- A waiter re-checks on its own at the moment it was told (when the lease it queued behind
-- ends, `ms` from `now`). A provisional lease handed out later may end sooner: the waiter then
-- next in line must hear of it (`hint_next`) in case its new holder died before confirming
-- it, but only if it was told a moment later than that lease ends. So the lock keeps the latest
-- such moment told (w) and the queue's last entry then (wq): no waiter behind that entry was
-- told one, so once it is served, no hint is needed. Returns the new {w, wq} given the last w
-- kept (or nil), or nil if nothing need be kept. `tail`, if the caller knows it (it just
-- queued that entry), is the queue's last entry.
local function next_told(last, queue, now, ms, handoff_ttl, tail)
  if ms <= handoff_ttl then
    return nil
  end
  if last and tonumber(last) > now + ms then
    now, ms = tonumber(last), 0
  end
  return {int(now + ms), tail or Q.last(queue)}
end

-- `next_told` kept in a read-write lock's or semaphore's hash `key`.
local function tell(key, queue, now, ms, handoff_ttl)
  local told = next_told(redis.call('HGET', key, 'w'), queue, now, ms, handoff_ttl)
  if told then
    redis.call('HSET', key, 'w', told[1], 'wq', told[2])
  end
end

-- Whether the waiter now next in line may have been told to re-check later than a provisional
-- lease handed out now ends: `told` is the {w, wq} kept by `tell` (or nil), `served_last`
-- whether the entry 'wq' names was just granted.
local function needs_hint(told, served_last, handoff_ttl)
  if Q.hint_always then
    return true
  end
  return told ~= nil and not served_last and tonumber(told[1]) > clock() + handoff_ttl
end

-- Whether a mutex queue's entry (an owner token) is an election's candidate: its claim part
-- starts with 'l' ("<client id>.l<claim id>"; a mutex's claim id is a UUID in hex). Mutex
-- waiters and candidates queue alike, so a free key with a queue is the first entry's kind.
local function is_candidate(owner)
  return string.find(owner, '.l', 1, true) ~= nil
end

-- A queue entry's kind and owner: "<kind>:<owner>" for read-write locks and semaphores, the
-- bare owner (kind nil) for a mutex. Owner tokens hold no ':'.
local function parse_entry(entry)
  local kind, owner = string.match(entry, '^([^:]*):(.*)$')
  if kind then
    return kind, owner
  end
  return nil, entry
end

-- The first queued entry whose owner's liveness deadline has not passed, and that owner; dead
-- ones are dropped.
local function live_head(queue, waiters)
  while true do
    local head = Q.first(queue)
    if not head then
      return nil
    end
    local _, owner = parse_entry(head)
    local now = clock()
    local deadline = redis.call('ZSCORE', waiters, owner)
    if deadline and tonumber(deadline) > now then
      return head, owner
    end
    Q.pop(queue)
    if deadline then
      redis.call('ZREM', waiters, owner)
    end
  end
end

-- What the key is while anyone holds or waits for it: 'mutex', 'rw' or 'sem:<permits>'; nil
-- when it is free. (A read-write lock's or semaphore's hash lives while anyone waits; a
-- mutex's value only while it is held, so a free mutex with waiters is known by its queue.)
-- A key of any other kind raises the server's WRONGTYPE error.
local function family_of(base, queue)
  local fields = redis.pcall('HMGET', base, 't', 'o', 'm')
  if fields.err then
    -- No hash: a mutex's or an election's hold, or not ours.
    local m = mutex_at(base)
    if m and m.t then
      return 'election'
    elseif m then
      return 'mutex'
    end
    redis.call('HMGET', base, 't')
  end
  local t, o, m = unpack(fields)
  if t == 'rw' then
    return 'rw'
  elseif t == 'sem' then
    return 'sem:' .. m
  elseif o then
    -- A mutex hold as an older version of distlock kept it.
    return 'mutex'
  end
  local head = Q.first(queue)
  if not head then
    return nil
  end
  local kind = parse_entry(head)
  if not kind then
    if is_candidate(head) then
      return 'election'
    end
    return 'mutex'
  elseif kind == 'r' or kind == 'w' then
    return 'rw'
  end
  return 'sem:?'
end

-- A read-write lock's or semaphore's holder's kind, as inspections report it: 'w' for the
-- writer (`writer`), 'r' for a reader, a semaphore holder's permit count.
local function holder_kind(base, family, writer, owner)
  if owner == writer then
    return 'w'
  elseif family == 'rw' then
    return 'r'
  end
  return redis.call('HGET', base, 'n:' .. owner) or '0'
end

-- Owner tokens are "<client id>.<claim id>"; each client listens on its own channel per lock,
-- "<lock>:c:<client id>", so a message reaches only the client it names.
local function channel_of(prefix, owner)
  return prefix .. string.match(owner, '^[^.]*')
end

-- Tells `owner` the lock is its, under a provisional lease: "<owner> <fence> <server ms> <px>".
local function announce(prefix, owner, f, px)
  Q.publish(channel_of(prefix, owner),
    owner .. ' ' .. int(f) .. ' ' .. int(clock()) .. ' ' .. px)
end

-- How far down the queue a hint looks for a waiter whose client is there to hear it, and how
-- many waiters at least it tells.
local HINT_SCAN = 32
local HINT_MIN = 3

-- Tells waiters in line when the provisional leases just handed out end ("<owner> <server ms>
-- <px>"): if their owners died before confirming them, a live waiter told re-checks then
-- instead of at the old holders' deadlines, hands the lock to the next in line and, told that
-- one's provisional lease, re-checks again when it ends. So dead waiters in a row cost one
-- provisional lease each, not a TTL. Waiters are told until `HINT_MIN` whose clients are
-- subscribed heard it (PUBLISH counts them; a dead client's subscription is gone once the
-- server saw its connection close, but a crashed host's stays until TCP keepalive gives up on
-- it, so up to `HINT_MIN` - 1 of those may stand before a live one), at most `HINT_SCAN`. Those
-- that heard nothing are told all the same (a client whose pub/sub link is reconnecting may
-- hear nothing now and still be alive).
local function hint_next(prefix, queue, px)
  local heard = 0
  for _, entry in ipairs(Q.head(queue, HINT_SCAN)) do
    if heard >= HINT_MIN then
      return
    end
    local _, owner = parse_entry(entry)
    local n = Q.publish(channel_of(prefix, owner), owner .. ' ' .. int(clock()) .. ' ' .. px)
    if (tonumber(n) or 0) > 0 then
      heard = heard + 1
    end
  end
end

-- Gives the mutex to the live head of the queue, for a short unconfirmed lease, and announces
-- it; says whether it did. `told` is what the released hold kept of `next_told` (or nil),
-- passed on while it matters. The released hold's value, if any, is overwritten. A queue found
-- empty loses its mark (see `mark_queued`). `election`: the lock is an election's, so the new
-- holder's lead is provisional ('?') until its client confirms it.
local function hand_off(lock, queue, waiters, fence, fence_ttl, handoff_ttl, prefix, told,
                        election)
  if not Q.may_grant() then
    return false
  end
  local head, owner = live_head(queue, waiters)
  if not head then
    unmark(fence, fence_ttl)
    return false
  elseif head ~= owner then
    -- Another kind of lock's queue.
    return false
  end
  local f = draw(fence, fence_ttl, true)
  Q.pop(queue)
  redis.call('ZREM', waiters, head)
  local hint = needs_hint(told, told and told[2] == head, handoff_ttl)
  -- Others may still wait behind the new holder (not counted: its release looks).
  local tail = nil
  if election or is_candidate(head) then
    tail = '?'
  end
  grant(lock, fence, head, handoff_ttl, fence_ttl, hint and told or nil, true, f, tail)
  announce(prefix, head, f, handoff_ttl)
  if hint then
    hint_next(prefix, queue, handoff_ttl)
  end
  return true
end
