-- distlock's PostgreSQL schema, version 3. Applied by the library on first use (or by you,
-- from `PgBackend::schema_sql()`), in one transaction, under an advisory lock so concurrent
-- first uses do not race.
--
-- keys    one row per lock key in use (and for an hour after): its family and fence counter.
-- claims  one row per holder or waiter: FIFO by `seq`, `fence` NULL while queued, `deadline`
--         the lease (holders) or liveness (waiters) on the server's clock, `value` what a
--         candidate of an election proclaims, `provisional` an election's lead handed to a
--         candidate that has not confirmed it yet.
--
-- An election's leader is its holder whose grant is confirmed: taken directly, or handed on
-- (`provisional`) and then confirmed by the candidate's client asking again (`acquire`). A
-- candidate whose host died in line is handed the lead and never confirms it: it is not
-- reported, and the next one in line leads once its provisional lease ends.
-- A change of an election's leader (a confirmed grant, a leader's release, its lease run out,
-- a new value) is NOTIFYed on `distlock_elections` as '<ns>:<key>', for observers.
--
-- Every function serialises on the key's row, so each is one short transaction in one round
-- trip: nothing is kept on a connection between calls (PgBouncer in transaction mode works).
-- Claim rows are locked in (ns, key, seq) order wherever several are locked, the order the
-- batched renewal uses too, so two calls never wait on each other in a cycle.

CREATE SCHEMA IF NOT EXISTS distlock;

CREATE TABLE IF NOT EXISTS distlock.meta (
  version integer NOT NULL
);

CREATE TABLE distlock.keys (
  ns          text        NOT NULL,
  key         text        NOT NULL,
  family      text        NOT NULL,                -- 'mutex' | 'rw' | 'sem' | 'election'
  max_permits integer     NOT NULL DEFAULT 0,      -- semaphores
  last_fence  bigint      NOT NULL DEFAULT 0,
  touched     timestamptz NOT NULL,                -- last acquire or release (to the minute)
  PRIMARY KEY (ns, key)
);
CREATE INDEX keys_touched ON distlock.keys (touched);

CREATE TABLE distlock.claims (
  ns       text        NOT NULL,
  key      text        NOT NULL,
  owner    text        NOT NULL,                   -- '<client id>.<claim uuid>'
  seq      bigint      GENERATED ALWAYS AS IDENTITY,
  mode     text        NOT NULL,                   -- 'x' mutex, 'r' read, 'w' write, 'p' permits,
                                                   -- 'l' leadership
  permits  integer     NOT NULL DEFAULT 1,
  fence    bigint,                                 -- NULL while queued
  deadline timestamptz NOT NULL,
  value    bytea,                                  -- what a candidate proclaims ('l')
  provisional boolean NOT NULL DEFAULT false,      -- 'l' handed on, not confirmed yet
  PRIMARY KEY (ns, key, owner),
  FOREIGN KEY (ns, key) REFERENCES distlock.keys (ns, key)
);
CREATE INDEX claims_order ON distlock.claims (ns, key, seq);

-- Server time as integer milliseconds / microseconds since the epoch.
CREATE FUNCTION distlock.ms(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT floor(extract(epoch FROM t) * 1000)::bigint $$;

CREATE FUNCTION distlock.us(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT floor(extract(epoch FROM t) * 1000000)::bigint $$;

-- Each client listens on one channel, named after the client id that starts its owner tokens,
-- so a message reaches only the client it names.
CREATE FUNCTION distlock.channel(owner text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'distlock_' || split_part(owner, '.', 1) $$;

-- Tells observers of elections that the leader of `p_key` may have changed.
CREATE FUNCTION distlock.announce(p_ns text, p_key text) RETURNS void
LANGUAGE sql AS $$ SELECT pg_notify('distlock_elections', p_ns || ':' || p_key) $$;

-- The next fencing token of a key (its row is locked): one more than the last, and never below
-- server time in microseconds, so a counter lost with its row (collected after an hour idle, or
-- a crash that lost the last commits with synchronous_commit off) starts above every token
-- handed out before it.
CREATE FUNCTION distlock.next_fence(p_ns text, p_key text, p_now timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  f bigint;
BEGIN
  UPDATE distlock.keys SET last_fence = greatest(last_fence + 1, distlock.us(p_now))
    WHERE ns = p_ns AND key = p_key
    RETURNING last_fence INTO f;
  RETURN f;
END $$;

-- Drops the key's claims whose lease or liveness deadline has passed.
-- Rows are locked in `seq` order first, and a row a renewal extended meanwhile is skipped.
-- (Functions that run statements are PL/pgSQL, whose plans are kept per connection; a
-- LANGUAGE sql one would be planned again at every call.)
CREATE FUNCTION distlock.purge(p_ns text, p_key text, p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  leader boolean;
BEGIN
  PERFORM 1 FROM distlock.claims
    WHERE ns = p_ns AND key = p_key AND deadline <= p_now ORDER BY seq FOR UPDATE;
  IF FOUND THEN
    WITH gone AS (
      DELETE FROM distlock.claims WHERE ns = p_ns AND key = p_key AND deadline <= p_now
        RETURNING mode, fence, provisional)
    SELECT bool_or(mode = 'l' AND fence IS NOT NULL AND NOT provisional) INTO leader FROM gone;
    IF leader THEN
      PERFORM distlock.announce(p_ns, p_key);
    END IF;
  END IF;
END $$;

-- The advisory lock key that marks a client's LISTEN connection as open: the connection holds
-- it (exclusive, for its session) once it listens, so the lock goes when the connection does.
CREATE FUNCTION distlock.listener(owner text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtextextended(distlock.channel(owner), 0) $$;

-- Tells waiters in line, from the head, when the provisional leases just handed out end
-- ('<owner> <server ms> <px>'): a waiter told re-checks then, in case the new holders died
-- before confirming, hands the lock on and is told the next lease's end in turn. So dead
-- waiters in a row cost a provisional lease each, not a TTL. Waiters are told until
-- three whose clients look there to hear it were (a LISTEN connection holds its client's
-- `listener` lock; `p_quiet`, the caller, hears its reply), at most 32: a host that crashed
-- leaves its LISTEN connection open, and so looks alive until TCP keepalive gives up on it, so
-- up to two of those may stand before a live waiter, among any number whose connections
-- closed. A client reconnecting its LISTEN connection re-checks when it is back.
CREATE FUNCTION distlock.hint_next(
  p_ns text, p_key text, p_now timestamptz, p_handoff_ms integer, p_quiet text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  c record;
  open_ integer := 0;
BEGIN
  FOR c IN SELECT owner FROM distlock.claims
           WHERE ns = p_ns AND key = p_key AND fence IS NULL ORDER BY seq LIMIT 32 LOOP
    IF open_ >= 3 THEN
      RETURN;
    END IF;
    IF c.owner = p_quiet THEN
      open_ := open_ + 1;
      CONTINUE;
    END IF;
    PERFORM pg_notify(distlock.channel(c.owner),
      c.owner || ' ' || distlock.ms(p_now) || ' ' || p_handoff_ms);
    -- A shared try fails only while the client's LISTEN connection holds the lock.
    IF NOT pg_try_advisory_xact_lock_shared(distlock.listener(c.owner)) THEN
      open_ := open_ + 1;
    END IF;
  END LOOP;
END $$;

-- Grants the queue from its head while the head fits beside the holders (readers queued
-- together go together; a claim that does not fit stops the pass, so nothing overtakes it).
-- Each grant gets a provisional lease of `p_handoff_ms` and a message to its client:
-- '<owner> <fence> <server ms> <px>'. An election's grant is `provisional` (not its leader, and
-- not announced) until the candidate confirms it (`acquire`). If anything was granted, the claims now in line are told
-- when those leases end (`hint_next`). `p_quiet` (the caller) gets no
-- message. Says whether `p_quiet` was granted, whether anyone still waits, and what the holders
-- hold now.
CREATE FUNCTION distlock.grant_pass(
  p_ns text, p_key text, p_now timestamptz, p_handoff_ms integer, p_max integer, p_quiet text,
  OUT quiet_granted boolean, OUT waiting boolean,
  OUT n_held integer, OUT writer boolean, OUT used bigint)
LANGUAGE plpgsql AS $$
DECLARE
  c record;
  f bigint;
  granted boolean := false;
BEGIN
  quiet_granted := false;
  waiting := false;
  SELECT count(*), coalesce(bool_or(mode IN ('x', 'w', 'l')), false), coalesce(sum(permits), 0)
    INTO n_held, writer, used
    FROM distlock.claims WHERE ns = p_ns AND key = p_key AND fence IS NOT NULL;
  LOOP
    -- The head of the queue. Only calls holding the key's row change the queue, so nothing
    -- moves under us; rows are updated head first, in `seq` order.
    SELECT owner, mode, permits INTO c FROM distlock.claims
      WHERE ns = p_ns AND key = p_key AND fence IS NULL ORDER BY seq LIMIT 1;
    EXIT WHEN NOT FOUND;
    IF NOT (CASE c.mode
              WHEN 'r' THEN NOT writer
              WHEN 'p' THEN used + c.permits <= p_max
              ELSE n_held = 0 END) THEN
      waiting := true;
      IF granted THEN
        PERFORM distlock.hint_next(p_ns, p_key, p_now, p_handoff_ms, p_quiet);
      END IF;
      EXIT;
    END IF;
    f := distlock.next_fence(p_ns, p_key, p_now);
    UPDATE distlock.claims
      SET fence = f, deadline = p_now + p_handoff_ms * interval '1 millisecond',
          provisional = c.mode = 'l'
      WHERE ns = p_ns AND key = p_key AND owner = c.owner;
    n_held := n_held + 1;
    writer := writer OR c.mode IN ('x', 'w', 'l');
    used := used + c.permits;
    granted := true;
    IF c.owner = p_quiet THEN
      quiet_granted := true;
    ELSE
      PERFORM pg_notify(distlock.channel(c.owner),
        c.owner || ' ' || f || ' ' || distlock.ms(p_now) || ' ' || p_handoff_ms);
    END IF;
  END LOOP;
END $$;

-- Locks the key's row for this transaction, and notes the use at most once a minute (a new
-- row version each time would cost an index entry on `touched`). NULL if the key has no row.
CREATE FUNCTION distlock.lock_key(p_ns text, p_key text, p_now timestamptz)
RETURNS distlock.keys
LANGUAGE plpgsql AS $$
DECLARE
  k distlock.keys;
BEGIN
  SELECT * INTO k FROM distlock.keys WHERE ns = p_ns AND key = p_key FOR UPDATE;
  IF FOUND AND k.touched < p_now - interval '1 minute' THEN
    UPDATE distlock.keys SET touched = p_now WHERE ns = p_ns AND key = p_key;
  END IF;
  RETURN k;
END $$;

-- Deletes up to `p_limit` keys nobody acquired or released for an hour and nobody holds or
-- waits for (claims of dead clients go with them), skipping keys in use right now. Called when
-- a key row is created, so rows never pile up beyond the keys used in the last hour.
CREATE FUNCTION distlock.collect(p_now timestamptz, p_limit integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  k record;
BEGIN
  FOR k IN SELECT ns, key FROM distlock.keys
           WHERE touched < p_now - interval '1 hour'
           ORDER BY touched LIMIT p_limit FOR UPDATE SKIP LOCKED LOOP
    PERFORM distlock.purge(k.ns, k.key, p_now);
    IF NOT EXISTS (SELECT 1 FROM distlock.claims WHERE ns = k.ns AND key = k.key) THEN
      DELETE FROM distlock.keys WHERE ns = k.ns AND key = k.key;
    END IF;
  END LOOP;
END $$;

-- Makes a new claim a holder at once, with the next fencing token and a full lease.
CREATE FUNCTION distlock.add_holder(
  p_ns text, p_key text, p_owner text, p_mode text, p_count integer, p_now timestamptz,
  p_ttl interval, p_value bytea)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  f bigint := distlock.next_fence(p_ns, p_key, p_now);
BEGIN
  INSERT INTO distlock.claims (ns, key, owner, mode, permits, fence, deadline, value)
    VALUES (p_ns, p_key, p_owner, p_mode, p_count, f, p_now + p_ttl, p_value);
  IF p_mode = 'l' THEN
    PERFORM distlock.announce(p_ns, p_key);
  END IF;
  RETURN f;
END $$;

-- Takes the lock, or (with p_wait) joins or keeps the claim's place in the FIFO queue.
-- p_mode: 'x' mutex, 'r' read, 'w' write, 'p' p_count of p_max permits, 'l' leadership of an
-- election proclaiming p_value.
-- Returns (1, fence, server ms, NULL) when the lock is ours (a grant handed to us is confirmed
-- with a full lease, and an election's leader so confirmed is announced); (0, ms until the earliest holder's lease ends or -1, server ms, NULL)
-- when queued or busy; (-1, 0, server ms, '<family>[:<max>]') when the key is another family.
CREATE FUNCTION distlock.acquire(
  p_ns text, p_key text, p_owner text, p_mode text, p_count integer, p_max integer,
  p_ttl_ms integer, p_wait boolean, p_handoff_ms integer, p_value bytea)
RETURNS TABLE (code integer, value bigint, server_ms bigint, family text)
LANGUAGE plpgsql SET lock_timeout = '4s' AS $$
DECLARE
  now_ timestamptz := clock_timestamp();
  ttl interval := p_ttl_ms * interval '1 millisecond';
  fam text := CASE p_mode WHEN 'x' THEN 'mutex' WHEN 'p' THEN 'sem' WHEN 'l' THEN 'election'
                 ELSE 'rw' END;
  k record;
  g record;
  f bigint;
  queued boolean;
  ours boolean;
  pending boolean;
  left_ms bigint;
BEGIN
  SELECT t.family, t.max_permits INTO k FROM distlock.lock_key(p_ns, p_key, now_) t;
  IF k.family IS NULL THEN
    INSERT INTO distlock.keys AS t (ns, key, family, max_permits, touched)
      VALUES (p_ns, p_key, fam, p_max, now_)
      ON CONFLICT (ns, key) DO UPDATE SET touched = excluded.touched
      RETURNING t.family, t.max_permits INTO k;
    PERFORM distlock.collect(now_, 2);
  END IF;

  IF NOT EXISTS (SELECT 1 FROM distlock.claims c WHERE c.ns = p_ns AND c.key = p_key) THEN
    -- Nobody holds or waits (the uncontended case): ours at once.
    IF k.family <> fam OR k.max_permits <> p_max THEN
      UPDATE distlock.keys SET family = fam, max_permits = p_max
        WHERE ns = p_ns AND key = p_key;
    END IF;
    RETURN QUERY SELECT 1, distlock.add_holder(p_ns, p_key, p_owner, p_mode, p_count, now_, ttl, p_value),
      distlock.ms(now_), NULL::text;
    RETURN;
  END IF;

  PERFORM distlock.purge(p_ns, p_key, now_);

  IF k.family <> fam OR (fam = 'sem' AND k.max_permits <> p_max) THEN
    IF EXISTS (SELECT 1 FROM distlock.claims c WHERE c.ns = p_ns AND c.key = p_key) THEN
      RETURN QUERY SELECT -1, 0::bigint, distlock.ms(now_),
        k.family || CASE WHEN k.family = 'sem' THEN ':' || k.max_permits ELSE '' END;
      RETURN;
    END IF;
    UPDATE distlock.keys SET family = fam, max_permits = p_max
      WHERE ns = p_ns AND key = p_key;
  END IF;

  SELECT c.fence, c.provisional INTO f, pending FROM distlock.claims c
    WHERE c.ns = p_ns AND c.key = p_key AND c.owner = p_owner;
  queued := FOUND AND f IS NULL;
  ours := f IS NOT NULL;
  IF NOT ours THEN
    SELECT * INTO g FROM distlock.grant_pass(p_ns, p_key, now_, p_handoff_ms, p_max, p_owner);
    ours := g.quiet_granted;
    pending := ours AND p_mode = 'l';
  END IF;
  IF ours THEN
    -- Ours (handed to us, now or before, or asked again): confirm the full lease. An
    -- election's candidate leads from here, and observers are told.
    UPDATE distlock.claims c SET deadline = now_ + ttl, provisional = false
      WHERE c.ns = p_ns AND c.key = p_key AND c.owner = p_owner
      RETURNING c.fence INTO f;
    IF pending THEN
      PERFORM distlock.announce(p_ns, p_key);
    END IF;
    RETURN QUERY SELECT 1, f, distlock.ms(now_), NULL::text;
    RETURN;
  END IF;

  IF NOT queued THEN
    -- New: granted if nobody waits and it fits beside the holders.
    IF NOT g.waiting AND (CASE p_mode
                            WHEN 'r' THEN NOT g.writer
                            WHEN 'p' THEN g.used + p_count <= p_max
                            ELSE g.n_held = 0 END) THEN
      RETURN QUERY SELECT 1, distlock.add_holder(p_ns, p_key, p_owner, p_mode, p_count, now_, ttl, p_value),
        distlock.ms(now_), NULL::text;
      RETURN;
    END IF;
    IF p_wait THEN
      INSERT INTO distlock.claims (ns, key, owner, mode, permits, deadline, value)
        VALUES (p_ns, p_key, p_owner, p_mode, p_count, now_ + ttl, p_value);
    END IF;
  ELSIF p_wait THEN
    UPDATE distlock.claims c SET deadline = now_ + ttl
      WHERE c.ns = p_ns AND c.key = p_key AND c.owner = p_owner;
  ELSE
    DELETE FROM distlock.claims c WHERE c.ns = p_ns AND c.key = p_key AND c.owner = p_owner;
  END IF;

  SELECT distlock.ms(min(c.deadline)) - distlock.ms(now_) INTO left_ms
    FROM distlock.claims c WHERE c.ns = p_ns AND c.key = p_key AND c.fence IS NOT NULL;
  RETURN QUERY SELECT 0, coalesce(left_ms, -1), distlock.ms(now_), NULL::text;
END $$;

-- Removes every trace of a claim: its grant (handing the lock on) or its queue entry.
-- Returns 1 if it held the lock (with a lease not yet run out), 0 otherwise. Idempotent.
CREATE FUNCTION distlock.release(p_ns text, p_key text, p_owner text, p_handoff_ms integer)
RETURNS integer
LANGUAGE plpgsql SET lock_timeout = '4s' AS $$
DECLARE
  now_ timestamptz := clock_timestamp();
  k distlock.keys;
  held boolean;
  leader boolean;
BEGIN
  k := distlock.lock_key(p_ns, p_key, now_);
  IF k.ns IS NULL THEN
    RETURN 0;
  END IF;
  DELETE FROM distlock.claims c WHERE c.ns = p_ns AND c.key = p_key AND c.owner = p_owner
    RETURNING c.fence IS NOT NULL AND c.deadline > now_,
              c.fence IS NOT NULL AND c.mode = 'l' AND NOT c.provisional
    INTO held, leader;
  IF leader THEN
    PERFORM distlock.announce(p_ns, p_key);
  END IF;
  PERFORM distlock.purge(p_ns, p_key, now_);
  PERFORM distlock.grant_pass(p_ns, p_key, now_, p_handoff_ms, k.max_permits, NULL);
  RETURN CASE WHEN held THEN 1 ELSE 0 END;
END $$;

-- Turns a held write lock into a read lock in one step; readers queued behind it may then be
-- granted. Returns (1, fence) or (0, 0) if the claim does not hold a write lock.
CREATE FUNCTION distlock.downgrade(
  p_ns text, p_key text, p_owner text, p_ttl_ms integer, p_handoff_ms integer)
RETURNS TABLE (code integer, fence bigint)
LANGUAGE plpgsql SET lock_timeout = '4s' AS $$
DECLARE
  now_ timestamptz := clock_timestamp();
  f bigint;
BEGIN
  PERFORM distlock.lock_key(p_ns, p_key, now_);
  PERFORM distlock.purge(p_ns, p_key, now_);
  UPDATE distlock.claims c SET mode = 'r', deadline = now_ + p_ttl_ms * interval '1 millisecond'
    WHERE c.ns = p_ns AND c.key = p_key AND c.owner = p_owner
      AND c.mode = 'w' AND c.fence IS NOT NULL
    RETURNING c.fence INTO f;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 0, 0::bigint;
    RETURN;
  END IF;
  PERFORM distlock.grant_pass(p_ns, p_key, now_, p_handoff_ms, 0, NULL);
  RETURN QUERY SELECT 1, f;
END $$;

-- Extends many leases and queue entries in one statement. Returns, for each input position
-- (1-based) whose claim is still alive, whether it holds the lock; positions missing from the
-- result are not owners any more.
CREATE FUNCTION distlock.renew(p_ns text[], p_key text[], p_owner text[], p_ttl_ms integer[])
RETURNS TABLE (i bigint, held boolean)
LANGUAGE sql SET lock_timeout = '4s' AS $$
  WITH want AS (
    SELECT * FROM unnest(p_ns, p_key, p_owner, p_ttl_ms) WITH ORDINALITY
      AS u(ns, key, owner, ttl_ms, i)
  ), locked AS (
    SELECT c.ns, c.key, c.owner, w.i, w.ttl_ms
      FROM distlock.claims c JOIN want w USING (ns, key, owner)
      WHERE c.deadline > clock_timestamp()
      ORDER BY c.ns, c.key, c.seq
      FOR UPDATE OF c
  )
  -- Never shortens a lease: renewals of one claim on different connections (a pool) may
  -- arrive out of order, and an older one asking for a shorter TTL must not cut short the
  -- lease the client was told of.
  UPDATE distlock.claims c
    SET deadline = greatest(c.deadline, clock_timestamp() + l.ttl_ms * interval '1 millisecond')
    FROM locked l
    WHERE c.ns = l.ns AND c.key = l.key AND c.owner = l.owner
      AND c.deadline > clock_timestamp()
    RETURNING l.i, c.fence IS NOT NULL
$$;

-- What a key looks like now: its family, then one row per live claim in queue order.
CREATE FUNCTION distlock.inspect(p_ns text, p_key text)
RETURNS TABLE (family text, mode text, permits integer, fence bigint, left_ms bigint)
LANGUAGE sql STABLE AS $$
  SELECT k.family || CASE WHEN k.family = 'sem' THEN ':' || k.max_permits ELSE '' END,
         c.mode, c.permits, c.fence,
         distlock.ms(c.deadline) - distlock.ms(clock_timestamp())
    FROM distlock.keys k
    LEFT JOIN distlock.claims c
      ON c.ns = k.ns AND c.key = k.key AND c.deadline > clock_timestamp()
    WHERE k.ns = p_ns AND k.key = p_key
    ORDER BY c.fence IS NULL, c.seq
$$;

-- Elections: publishes `p_value` as what the leader `p_owner` says. Returns 1, or 0 if it does
-- not lead (any more).
CREATE FUNCTION distlock.proclaim(p_ns text, p_key text, p_owner text, p_value bytea)
RETURNS integer
LANGUAGE plpgsql SET lock_timeout = '4s' AS $$
DECLARE
  now_ timestamptz := clock_timestamp();
BEGIN
  PERFORM distlock.lock_key(p_ns, p_key, now_);
  UPDATE distlock.claims c SET value = p_value
    WHERE c.ns = p_ns AND c.key = p_key AND c.owner = p_owner
      AND c.fence IS NOT NULL AND NOT c.provisional AND c.deadline > now_;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  PERFORM distlock.announce(p_ns, p_key);
  RETURN 1;
END $$;

-- Elections: the key's family and, if it has a leader (a holder whose grant is confirmed), its
-- value, fencing token (the term) and lease left; no row for a key nobody used lately.
CREATE FUNCTION distlock.leader(p_ns text, p_key text)
RETURNS TABLE (family text, value bytea, fence bigint, left_ms bigint)
LANGUAGE sql STABLE AS $$
  SELECT k.family || CASE WHEN k.family = 'sem' THEN ':' || k.max_permits ELSE '' END,
         c.value, c.fence, distlock.ms(c.deadline) - distlock.ms(clock_timestamp())
    FROM distlock.keys k
    LEFT JOIN distlock.claims c
      ON c.ns = k.ns AND c.key = k.key AND c.fence IS NOT NULL AND NOT c.provisional
         AND c.deadline > clock_timestamp()
    WHERE k.ns = p_ns AND k.key = p_key
    ORDER BY c.seq
    LIMIT 1
$$;

INSERT INTO distlock.meta (version) VALUES (3);
