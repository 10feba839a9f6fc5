//! PostgreSQL's own tests against a real server (one per test binary, a namespace per test):
//! its schema, URLs and TLS, notifications, connections killed or pooled (PgBouncer, deadpool).
//! Contenders use separate `LockClient`s, with their own connections, as separate processes
//! would. The behaviour suite every backend runs is in `tests/contract/matrix.rs` (`matrix::postgres::`, and
//! `pgbouncer::` through a pooler).
#![cfg(feature = "postgres")]

use std::time::Duration;

use crate::support::contract::granted;
use crate::support::pg::{claims_in, connection, terminate, until_queued};
use crate::support::server::postgres::shared_postgres;
use distlock::backend::PgBackend;
use distlock::LockClient;
use tokio::time::{sleep, timeout, Instant};

async fn client_at(url: &str, ns: &str, ttl: Duration) -> LockClient {
    crate::support::pg::client(url, ns, ttl, Duration::from_secs(2)).await
}

async fn client(ns: &str) -> LockClient {
    client_at(&shared_postgres().url(), ns, Duration::from_secs(10)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_and_lock_timeout_leave_nothing_behind() {
    let ns = test_namespace!();
    let (a, b) = (client(&ns).await, client(&ns).await);
    let held = a.mutex("k").lock().await.unwrap();
    let err = b.mutex("k").try_lock().await.unwrap_err();
    assert!(err.is_would_block(), "{err:?}");
    let started = Instant::now();
    let err = b
        .mutex("k")
        .lock_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // Only the holder's row is left: the try and the timed-out wait left none.
    sleep(Duration::from_millis(200)).await;
    assert_eq!(claims_in(&shared_postgres().url(), &ns).await, 1);
    held.release().await.unwrap();
    let again = b.mutex("k").try_lock().await.unwrap();
    again.release().await.unwrap();
    assert_eq!(claims_in(&shared_postgres().url(), &ns).await, 0);
}

/// A lease renewed in the background outlives its TTL many times over; without renewal it
/// lasts one TTL and the guard says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_lease_and_its_absence_loses_it() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let ttl = Duration::from_millis(600);
    let renewed = client_at(&url, &ns, ttl).await;
    let guard = renewed.mutex("renewed").lock().await.unwrap();
    sleep(ttl * 4).await;
    assert!(!guard.is_lost());
    let other = client(&ns).await;
    assert!(other
        .mutex("renewed")
        .try_lock()
        .await
        .unwrap_err()
        .is_would_block());
    guard.release().await.unwrap();

    let backend = PgBackend::connect(&url).await.unwrap();
    let once = LockClient::builder(backend)
        .namespace(&ns)
        .ttl(ttl)
        .auto_renew(false)
        .build()
        .unwrap();
    let guard = once.mutex("once").lock().await.unwrap();
    timeout(ttl * 3, guard.lost())
        .await
        .expect("an unrenewed lease was never reported lost");
    // The guard is told before the server lets anyone else in.
    let next = other.mutex("once").lock_timeout(ttl).await.unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    let err = guard.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    next.release().await.unwrap();
}

/// A grant goes to the one client it names: each client listens on its own channel, so a
/// handoff among 8 clients is one notification, heard by one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_notifies_only_the_client_it_names() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let holder = client(&ns).await;
    let held = holder.mutex("k").lock().await.unwrap();
    let mut waiters = Vec::new();
    for i in 0..8 {
        let c = client(&ns).await;
        waiters.push(tokio::spawn(async move {
            let g = c.mutex("k").lock().await.unwrap();
            sleep(Duration::from_millis(5)).await;
            g.release().await.unwrap();
            c.shutdown().await;
        }));
        until_queued(&url, &ns, "k", i + 1).await;
    }
    // Every client listens on a channel of its own: the 9 claims' owners name 9 channels, and
    // each has a LISTEN connection of its own holding that channel's mark (the advisory lock it
    // takes just before it listens, kept for the session). Read from state the connections
    // keep, not from their last statement, which the hub's pings replace every second.
    let probe = connection(&url).await;
    let row = probe
        .query_one(
            "SELECT count(DISTINCT distlock.channel(c.owner)), count(DISTINCT a.pid) \
             FROM distlock.claims c \
             LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted \
               AND ((l.classid::bigint << 32) | l.objid::bigint) = distlock.listener(c.owner) \
             LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
               AND a.application_name = 'distlock-listen' \
             WHERE c.ns = $1 AND c.key = 'k'",
            &[&ns],
        )
        .await
        .unwrap();
    let (channels, listeners): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(
        (channels, listeners),
        (9, 9),
        "distinct channels and LISTEN connections marked for them, for 9 clients"
    );
    held.release().await.unwrap();
    for w in waiters {
        timeout(Duration::from_secs(20), w).await.unwrap().unwrap();
    }
    holder.shutdown().await;
}

/// Bad input is a clear error before any I/O; a bad URL or an unreachable server is a clear
/// error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_bad_urls_are_clear_errors() {
    let err = PgBackend::connect("postgres://host:notaport/db")
        .await
        .unwrap_err();
    assert!(err.is_invalid_config(), "{err:?}");
    let started = Instant::now();
    let port = crate::support::free_port();
    let err = PgBackend::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let err = PgBackend::connect(&format!(
        "postgres://postgres@127.0.0.1:{}/no_such_db",
        shared_postgres().port()
    ))
    .await
    .unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
    let err = PgBackend::builder(shared_postgres().url())
        .connections(0)
        .build()
        .await
        .unwrap_err();
    assert!(err.is_invalid_config(), "{err:?}");

    let ns = test_namespace!();
    let c = client(&ns).await;
    for key in ["", "a\0b"] {
        let err = c.mutex(key).lock().await.unwrap_err();
        assert!(err.is_invalid_key(), "{key:?}: {err:?}");
    }
    let long = "k".repeat(distlock::MAX_KEY_LEN + 1);
    assert!(c.mutex(long).try_lock().await.unwrap_err().is_invalid_key());
    // Quotes, dollars and SQL-looking keys are plain data.
    let odd = "o'rders; DROP TABLE distlock.keys; --$$";
    let g = c.mutex(odd).lock().await.unwrap();
    g.release().await.unwrap();
    assert_eq!(claims_in(&shared_postgres().url(), &ns).await, 0);
    c.shutdown().await;
}

/// `LockClient::connect` takes `postgres://` URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_takes_postgres_urls() {
    let c = LockClient::connect(&shared_postgres().url()).await.unwrap();
    let g = c.mutex(test_namespace!()).lock().await.unwrap();
    assert!(g.fencing_token() > 0);
    g.release().await.unwrap();
    c.shutdown().await;
    let c = LockClient::postgres(&shared_postgres().url())
        .await
        .unwrap();
    c.shutdown().await;
}

/// A role without rights to the schema gets an error that says so when it connects; a database without the
/// schema and `create_schema(false)` gets one that names `schema_sql()`; a DBA can apply
/// `schema_sql()` themselves and the backend then uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_is_created_once_and_missing_rights_are_named() {
    let server = shared_postgres();
    let admin = connection(&server.url()).await;
    let db = format!("schema_{}", std::process::id());
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", server.port());

    let err = PgBackend::builder(&url)
        .create_schema(false)
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("schema_sql"), "{err}");

    // Concurrent first uses install it once.
    let (a, b) = tokio::join!(PgBackend::connect(&url), PgBackend::connect(&url));
    let (a, b) = (a.unwrap(), b.unwrap());
    drop((a, b));
    let in_db = connection(&url).await;
    let versions: i64 = in_db
        .query_one("SELECT count(*) FROM distlock.meta", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(versions, 1);

    // A role that may connect but was granted nothing on the schema.
    in_db
        .batch_execute("CREATE ROLE distlock_nobody LOGIN")
        .await
        .unwrap();
    let nobody = format!(
        "postgres://distlock_nobody@127.0.0.1:{}/{db}",
        server.port()
    );
    let err = PgBackend::connect(&nobody).await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(err.to_string().contains("permission denied"), "{err}");

    // A schema newer than this build is refused.
    in_db
        .batch_execute("UPDATE distlock.meta SET version = 99")
        .await
        .unwrap();
    let err = PgBackend::connect(&url).await.unwrap_err();
    assert!(err.is_unsupported(), "{err:?}");
    assert!(err.to_string().contains("99"), "{err}");

    // Older ones too, saying how to move on (version 1 had no elections; version 2 reported
    // an election's lead handed to a candidate before the candidate confirmed it).
    for older in [1, 2] {
        in_db
            .batch_execute(&format!("UPDATE distlock.meta SET version = {older}"))
            .await
            .unwrap();
        let err = PgBackend::connect(&url).await.unwrap_err();
        assert!(err.is_unsupported(), "{older}: {err:?}");
        assert!(
            err.to_string().contains("DROP SCHEMA distlock CASCADE"),
            "{err}"
        );
    }

    // A DBA applies the SQL by hand; the backend uses it without creating anything.
    in_db
        .batch_execute("DROP SCHEMA distlock CASCADE")
        .await
        .unwrap();
    in_db
        .batch_execute(&format!("BEGIN; {} COMMIT;", PgBackend::schema_sql()))
        .await
        .unwrap();
    let backend = PgBackend::builder(&url)
        .create_schema(false)
        .build()
        .await
        .unwrap();
    let c = LockClient::builder(backend).build().unwrap();
    let g = c.mutex("k").lock().await.unwrap();
    g.release().await.unwrap();
    c.shutdown().await;
    drop(in_db);
    let _ = admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await;
}

/// A holder that dies (SIGKILL) keeps the lock only until its lease runs out: the next waiter
/// gets it within the TTL plus 50 ms, with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_with_sigkill_frees_the_lock_within_its_ttl() {
    crate::support::faults::killed_holder_frees_the_lock(
        &crate::support::pg::service(),
        "server::a_holder_killed_with_sigkill_frees_the_lock_within_its_ttl",
        &test_namespace!(),
        Duration::from_millis(50),
    )
    .await;
}

/// The LISTEN connection killed by the server mid-wait: the hub reconnects and every waiter
/// re-checks, so a grant made while it was gone is not waited out to the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_after_the_listen_connection_is_killed() {
    let ns = test_namespace!();
    // Its own connection name, so only this test's connections are killed.
    let name = "dl-listen-killed";
    let url = format!("{}?application_name={name}", shared_postgres().url());
    let ttl = Duration::from_secs(30);
    let holder = client_at(&url, &ns, ttl).await;
    let held = holder.mutex("k").lock().await.unwrap();
    let waiter = client_at(&url, &ns, ttl).await;
    let task = tokio::spawn(waiter.mutex("k").lock());
    until_queued(&url, &ns, "k", 1).await;
    // Kill every LISTEN connection (the holder's and the waiter's) and release at once: the
    // NOTIFY may go nowhere.
    assert_eq!(terminate(&url, &format!("{name}-listen")).await, 2);
    held.release().await.unwrap();
    let g = granted(task, Duration::from_secs(5), "the waiter").await;
    assert!(g.fencing_token() > 0);
    g.release().await.unwrap();
    // And the hub is back: the next handoff is heard as usual.
    let held = holder.mutex("k").lock().await.unwrap();
    let task = tokio::spawn(waiter.mutex("k").lock());
    until_queued(&url, &ns, "k", 1).await;
    held.release().await.unwrap();
    granted(task, Duration::from_secs(5), "the second waiter")
        .await
        .release()
        .await
        .unwrap();
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// Statement connections killed between calls (as a pooler hands each call another server
/// connection): the next call reconnects and works, and the holder keeps its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_connections_swapped_between_calls_still_work() {
    let ns = test_namespace!();
    // Its own connection name, so only this test's connections are killed.
    let name = "dl-swapped";
    let url = format!("{}?application_name={name}", shared_postgres().url());
    let ttl = Duration::from_millis(900);
    let c = client_at(&url, &ns, ttl).await;
    let other = client(&ns).await;
    for _ in 0..3 {
        let g = c.mutex("k").lock().await.unwrap();
        assert!(terminate(&url, name).await >= 1);
        // Renewals go over fresh connections.
        sleep(ttl * 2).await;
        assert!(!g.is_lost());
        assert!(other
            .mutex("k")
            .try_lock()
            .await
            .unwrap_err()
            .is_would_block());
        assert!(terminate(&url, name).await >= 1);
        g.release().await.unwrap();
    }
    assert_eq!(claims_in(&url, &ns).await, 0);
    c.shutdown().await;
    other.shutdown().await;
}

/// a LISTEN through PgBouncer in transaction mode succeeds, yet hears no
/// notification (the server connection that listens goes back to the pool), so every waiter
/// would be served only at its own re-check. Building such a backend is refused, naming
/// `listen_url`; with the LISTEN connection on the server, a handoff through the pooler is heard
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_connection_through_a_transaction_pooler_is_refused() {
    let ns = test_namespace!();
    let bouncer = crate::support::server::pgbouncer::shared_pgbouncer();
    let refused = PgBackend::builder(bouncer.url()).build().await;
    let err = refused.expect_err("a LISTEN through a transaction pooler was accepted");
    assert!(err.is_invalid_config(), "{err}");
    assert!(err.to_string().contains("listen_url"), "{err}");

    let ttl = Duration::from_secs(10);
    let mut cs = Vec::new();
    for _ in 0..2 {
        let backend = PgBackend::builder(bouncer.url())
            .listen_url(shared_postgres().url())
            .build()
            .await
            .unwrap();
        cs.push(
            LockClient::builder(backend)
                .namespace(&ns)
                .ttl(ttl)
                .build()
                .unwrap(),
        );
    }
    let held = cs[0].mutex("k").lock().await.unwrap();
    let waiter = tokio::spawn(cs[1].mutex("k").lock());
    until_queued(&shared_postgres().url(), &ns, "k", 1).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = timeout(ttl, waiter).await.unwrap().unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "the handoff was heard {:?} after the release",
        released.elapsed()
    );
    guard.release().await.unwrap();
    for c in cs {
        c.shutdown().await;
    }
}

/// A `deadpool-postgres` pool (here through PgBouncer too) carries the statements.
#[cfg(feature = "postgres-deadpool")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_through_a_deadpool_pool() {
    let ns = test_namespace!();
    let bouncer = crate::support::server::pgbouncer::shared_pgbouncer();
    let mut cs = Vec::new();
    for _ in 0..4 {
        let mut cfg = deadpool_postgres::Config::new();
        cfg.url = Some(bouncer.url());
        let pool = cfg
            .create_pool(
                Some(deadpool_postgres::Runtime::Tokio1),
                tokio_postgres::NoTls,
            )
            .unwrap();
        let backend = PgBackend::builder(shared_postgres().url())
            .deadpool(pool)
            .build()
            .await
            .unwrap();
        cs.push(LockClient::builder(backend).namespace(&ns).build().unwrap());
    }
    crate::support::contract::contend(cs, "pool", 15, Duration::from_micros(300)).await;
    assert_eq!(claims_in(&shared_postgres().url(), &ns).await, 0);
}

/// TLS as libpq's `sslmode` says, against a server that takes TLS only for the lock database
/// and whose certificate names `localhost` alone: `verify-full` by name with the CA works
/// (contention with handoffs: the LISTEN connection is TLS too), by address it is refused for
/// the name; `verify-ca` and `require` accept the address; without the CA `verify-full` is
/// refused; `disable` is refused by the server. Refusals are not transient.
#[cfg(feature = "postgres-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_as_sslmode_says() {
    let ca = crate::support::tls::TestCa::new();
    let (cert, key) = ca.issue("localhost", "DNS:localhost");
    let server = crate::support::server::postgres::PgServer::start_tls(&cert, &key);
    connection(&server.url())
        .await
        .batch_execute("CREATE DATABASE locks")
        .await
        .unwrap();
    let port = server.port();
    let root = ca.pem_path().display().to_string();
    let url =
        |host: &str, params: &str| format!("postgres://postgres@{host}:{port}/locks?{params}");
    let client = |url: String| async move {
        let backend = PgBackend::builder(url).build().await?;
        LockClient::builder(backend).build()
    };

    let full = url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={root}"),
    );
    let mut cs = Vec::new();
    for _ in 0..3 {
        cs.push(client(full.clone()).await.unwrap());
    }
    crate::support::contract::contend(cs, "tls", 10, Duration::from_micros(300)).await;

    for ok in [
        url(
            "127.0.0.1",
            &format!("sslmode=verify-ca&sslrootcert={root}"),
        ),
        url("127.0.0.1", "sslmode=require"),
    ] {
        let c = client(ok.clone())
            .await
            .unwrap_or_else(|e| panic!("{ok}: {e:?}"));
        c.mutex("k").lock().await.unwrap().release().await.unwrap();
        c.shutdown().await;
    }
    // The CA given to the builder instead of in the URL.
    let backend = PgBackend::builder(url("localhost", "sslmode=verify-full"))
        .tls_root_certificate(ca.pem())
        .build()
        .await
        .unwrap();
    let c = LockClient::builder(backend).build().unwrap();
    c.mutex("k").lock().await.unwrap().release().await.unwrap();
    c.shutdown().await;

    for (refused, why) in [
        (
            url(
                "127.0.0.1",
                &format!("sslmode=verify-full&sslrootcert={root}"),
            ),
            "TLS",
        ),
        (url("localhost", "sslmode=verify-full"), "TLS"),
        (
            url("127.0.0.1", "sslmode=disable"),
            "authentication refused",
        ),
    ] {
        let err = client(refused.clone()).await.unwrap_err();
        assert!(err.is_backend(), "{refused}: {err:?}");
        assert!(!err.is_transient(), "{refused}: {err:?}");
        assert!(err.to_string().contains(why), "{refused}: {err}");
    }
    let err = client(url(
        "localhost",
        "sslmode=verify-full&sslrootcert=/nonexistent.pem",
    ))
    .await
    .unwrap_err();
    assert!(err.is_invalid_config(), "{err:?}");
}

/// Every spelling libpq takes for `sslmode` is honoured: against a server without TLS, asking
/// for it is refused however it is written (spaces around `=`, a quoted value, a `%`-escaped
/// URL key), never a quiet plaintext connection; the rest of a `key=value` string reaches the
/// server as written (a quoted application name keeps its two spaces).
#[cfg(feature = "postgres-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_in_every_libpq_spelling_is_honoured() {
    let port = shared_postgres().port();
    let kv = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
    for url in [
        format!("{kv} sslmode = require"),
        format!("{kv} sslmode='require'"),
        format!("{kv} sslmode = 'verify-full'"),
        format!("postgres://postgres@127.0.0.1:{port}/postgres?ssl%6Dode=require"),
    ] {
        let err = PgBackend::connect(&url).await.unwrap_err();
        assert!(err.is_backend() && !err.is_transient(), "{url}: {err:?}");
        assert!(err.to_string().contains("TLS"), "{url}: {err}");
    }
    let backend = PgBackend::connect(&format!(
        "{kv} sslmode = 'disable' application_name='two  spaces'"
    ))
    .await
    .unwrap();
    let seen: i64 = connection(&shared_postgres().url())
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'two  spaces'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(seen >= 1, "the quoted application name changed on the way");
    drop(backend);
}
