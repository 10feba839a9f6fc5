//! One rule for errors on every backend: a service that cannot be reached is a transient
//! backend error, a refusal that will not change by itself is not (`Error::is_transient`), and
//! a printed chain of causes says each thing once.
#![cfg(all(
    feature = "redis",
    feature = "redlock",
    feature = "zookeeper",
    feature = "postgres"
))]

use std::error::Error as _;
use std::time::Duration;

use distlock::backend::{PgBackend, RedisBackend, RedlockBackend, ZkBackend};
use distlock::{Error, LockClient};

/// The messages of `err` and each cause below it, as a reporter prints them.
fn chain(err: &Error) -> Vec<String> {
    let mut out = vec![err.to_string()];
    let mut cause = err.source();
    while let Some(c) = cause {
        out.push(c.to_string());
        cause = c.source();
    }
    out
}

/// An unreachable service: a backend error, transient, whose chain names the refusal once.
fn assert_unreachable(service: &str, err: &Error) {
    let chain = chain(err);
    assert!(err.is_backend(), "{service}: {err:?}");
    assert!(err.is_transient(), "{service}: not transient: {chain:?}");
    for pair in chain.windows(2) {
        assert!(
            !pair[0].ends_with(&pair[1]),
            "{service}: a cause repeats the message above it: {chain:?}"
        );
    }
}

/// A loopback port nobody listens on.
fn closed_port() -> u16 {
    crate::support::free_port()
}

#[tokio::test]
async fn an_unreachable_server_is_transient_on_every_backend() {
    let port = closed_port();
    let redis = RedisBackend::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert_unreachable("redis", &redis);
    assert!(
        chain(&redis).last().unwrap().contains("refused"),
        "{:?}",
        chain(&redis)
    );

    let pg = PgBackend::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .await
        .unwrap_err();
    assert_unreachable("postgres", &pg);
    assert!(
        chain(&pg).last().unwrap().contains("refused"),
        "{:?}",
        chain(&pg)
    );

    let zk = ZkBackend::builder(format!("127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap_err();
    assert_unreachable("zookeeper", &zk);

    let urls = (0..3).map(|_| format!("redis://127.0.0.1:{}", closed_port()));
    let redlock = RedlockBackend::connect(urls).await.unwrap_err();
    assert_unreachable("redlock", &redlock);

    // Through the URL entry point as well: the same answers.
    let via_url = LockClient::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(via_url.is_transient(), "{via_url:?}");
}

/// A loopback port whose listener accepts every connection and never says a word: a hung
/// server, or a balancer with no backend behind it.
async fn silent_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    port
}

/// How long `connect` took to fail, and its error, which must be an unreachable server's.
async fn fails_within<T>(
    service: &str,
    limit: Duration,
    connect: impl std::future::Future<Output = distlock::Result<T>>,
) -> Duration {
    let start = tokio::time::Instant::now();
    let result = tokio::time::timeout(limit, connect).await;
    let took = start.elapsed();
    match result {
        Ok(Err(err)) => assert_unreachable(service, &err),
        Ok(Ok(_)) => panic!("{service}: connected to a silent listener"),
        Err(_) => panic!("{service}: still connecting to a silent listener after {limit:?}"),
    }
    println!("{service}: gave up on a silent listener after {took:?}");
    took
}

/// A server that accepts connections and never answers: every backend gives up within its
/// connect timeout with a transient error, and PostgreSQL's honours the URL's
/// `connect_timeout` (tokio-postgres bounds only the TCP connect by it, not the startup).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_is_transient_on_every_backend() {
    let port = silent_port().await;
    let secs = Duration::from_secs;
    let pg = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let took = fails_within(
        "postgres",
        secs(10),
        PgBackend::connect(&format!("{pg}?connect_timeout=1")),
    )
    .await;
    assert!(
        took < secs(2),
        "postgres took {took:?} against connect_timeout=1"
    );
    fails_within(
        "postgres (default timeout)",
        secs(10),
        PgBackend::connect(&pg),
    )
    .await;
    fails_within(
        "postgres (through LockClient::connect)",
        secs(10),
        LockClient::connect(&format!("{pg}?connect_timeout=1")),
    )
    .await;
    let took = fails_within(
        "redis",
        secs(20),
        RedisBackend::connect(&format!("redis://127.0.0.1:{port}")),
    )
    .await;
    assert!(
        took < secs(7),
        "redis took {took:?} against a 5 s connect timeout"
    );
    fails_within(
        "zookeeper",
        secs(10),
        ZkBackend::builder(format!("127.0.0.1:{port}"))
            .connect_timeout(secs(1))
            .build(),
    )
    .await;
    let silent = [
        silent_port().await,
        silent_port().await,
        silent_port().await,
    ];
    fails_within(
        "redlock",
        secs(20),
        RedlockBackend::connect(silent.map(|p| format!("redis://127.0.0.1:{p}"))),
    )
    .await;
}

#[tokio::test]
async fn a_refusal_that_will_not_pass_is_not_transient() {
    // Wrong credentials on a live Redis.
    let server = crate::support::server::redis::shared_redis();
    let url = server.url().replace("redis://", "redis://nobody:wrong@");
    let err = RedisBackend::connect(&url).await.unwrap_err();
    assert!(err.is_backend() && !err.is_transient(), "{:?}", chain(&err));
    assert!(err.to_string().contains("authentication"), "{err}");
    // Said once, in our words: redis-rs's "Password authentication failed -
    // AuthenticationFailed" adds nothing to it.
    assert_eq!(chain(&err).len(), 1, "{:?}", chain(&err));

    // A database that does not exist on a live PostgreSQL.
    let pg = crate::support::server::postgres::shared_postgres().url();
    let (base, _) = pg.rsplit_once('/').unwrap();
    let err = PgBackend::connect(&format!("{base}/no_such_database"))
        .await
        .unwrap_err();
    assert!(err.is_backend() && !err.is_transient(), "{:?}", chain(&err));
    assert!(err.to_string().contains("does not exist"), "{err}");

    // Bad input is never transient.
    let err = LockClient::connect("redis://127.0.0.1:notaport")
        .await
        .unwrap_err();
    assert!(err.is_invalid_config() && !err.is_transient(), "{err:?}");
}

/// A certificate refused stays refused: not transient, on Redis as on PostgreSQL; a pooler's
/// refusal (PgBouncer says 08P01 for every one) is no outage either.
#[cfg(all(feature = "redis-tls", feature = "postgres"))]
#[tokio::test]
async fn a_refused_certificate_or_a_poolers_refusal_is_not_transient() {
    let tls = crate::support::server::redis::TlsRedis::start();
    let no_ca = RedisBackend::connect(&tls.url()).await.unwrap_err();
    assert!(
        no_ca.is_backend() && !no_ca.is_transient(),
        "{:?}",
        chain(&no_ca)
    );
    assert!(no_ca.to_string().contains("TLS"), "{no_ca}");
    // The certificate names 127.0.0.1, not localhost.
    let wrong_name = RedisBackend::builder(format!("rediss://localhost:{}/", tls.tls_port))
        .tls_root_certificate(tls.ca.clone())
        .build()
        .await
        .unwrap_err();
    assert!(!wrong_name.is_transient(), "{:?}", chain(&wrong_name));

    let bouncer = crate::support::server::pgbouncer::PgBouncer::start(
        crate::support::server::postgres::shared_postgres(),
        2,
    );
    let url = bouncer.url();
    let (base, _) = url.rsplit_once('/').unwrap();
    let err = PgBackend::connect(&format!("{base}/no_such_database"))
        .await
        .unwrap_err();
    assert!(err.is_backend() && !err.is_transient(), "{:?}", chain(&err));
}

/// A loopback port whose listener answers every connection as a web server answers a request it
/// cannot read, and hangs up: a `redis://` URL pointed at an HTTP port. On 127.0.0.2, so that
/// it never takes the port another test here found closed on 127.0.0.1.
async fn http_port() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let _ = socket.read(&mut request).await;
                let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            });
        }
    });
    port
}

/// Errors a user meets on the first day, said once in our words, each on one line: a server
/// that speaks another protocol, and URLs redis-rs cannot read (whose own text,
/// `Missing hostname - InvalidClientConfig`, names its error kind).
#[tokio::test]
async fn a_foreign_server_or_a_malformed_url_is_said_in_our_words_once() {
    let port = http_port().await;
    let err = RedisBackend::connect(&format!("redis://127.0.0.2:{port}"))
        .await
        .unwrap_err();
    let said = chain(&err);
    assert!(
        said[0].contains("did not speak the Redis protocol"),
        "{said:?}"
    );
    assert!(
        err.is_backend() && !err.is_transient(),
        "a wrong port stays wrong: {said:?}"
    );
    assert!(said.iter().all(|c| !c.contains('\n')), "{said:?}");
    assert!(said.iter().all(|c| !c.contains("Unexpected")), "{said:?}");

    for (url, why) in [
        ("redis://", "names no host"),
        ("redis://:6379", "not a URL of the form"),
        ("redis://127.0.0.1:6379/db", "not a number"),
        (
            "redlock://127.0.0.1:1,127.0.0.1:2,:3/0",
            "malformed redis url in redlock",
        ),
    ] {
        let err = LockClient::connect(url).await.unwrap_err();
        let said = chain(&err);
        assert!(err.is_invalid_config(), "{url}: {said:?}");
        assert_eq!(said.len(), 1, "{url}: {said:?}");
        assert!(said[0].contains(why), "{url}: {said:?}");
        assert!(!said[0].contains("InvalidClientConfig"), "{url}: {said:?}");
    }
}
