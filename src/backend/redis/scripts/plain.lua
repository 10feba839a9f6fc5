-- A single server: one fencing counter per namespace, `<ns>:fence`, not one per lock. Tokens
-- only need to increase per lock, and one counter that every lock of a namespace draws from
-- does that: its draws are ordered by the server, and each lock's grants draw in the order
-- they are made. The counter is one hot key where a counter per lock was one more key per lock
-- locked in the last hour, and an uncontended acquire needs no PEXPIRE for it (it lives
-- `fence_ttl` from the last draw that lifted it to server time, then starts again there). No waiter
-- marks it (it is every lock's): an acquire looks at its lock's queue instead.
-- Namespaces hold no ':' (`core/rules.rs`), so the lock's name starts with `<ns>:`.
Q.marks = false
Q.fence_of = function(lock) return string.match(lock, '^[^:]*') .. ':fence' end
