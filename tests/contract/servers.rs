//! The test servers are real: a round trip to each proves it. Without `redis-server` or
//! ZooKeeper installed these tests fail, naming the install script.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::server::redis::RedisServer;
use crate::support::server::zookeeper::ZkServer;

/// Sends one RESP command and reads one reply line.
fn resp(stream: &mut TcpStream, args: &[&str]) -> String {
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    stream.write_all(cmd.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    if let Some(len) = line
        .strip_prefix('$')
        .and_then(|n| n.trim().parse::<usize>().ok())
    {
        let mut body = String::new();
        reader.read_line(&mut body).unwrap();
        assert_eq!(body.trim_end().len(), len);
        return body.trim_end().to_string();
    }
    line.trim_end().to_string()
}

#[test]
fn redis_server_round_trip() {
    let server = RedisServer::start();
    let mut conn = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    assert_eq!(resp(&mut conn, &["SET", "smoke", "42"]), "+OK");
    assert_eq!(resp(&mut conn, &["GET", "smoke"]), "42");
    assert_eq!(resp(&mut conn, &["DBSIZE"]), ":1");
    let port = server.port();
    drop(server);
    assert!(
        TcpStream::connect_timeout(
            &format!("127.0.0.1:{port}").parse().unwrap(),
            Duration::from_millis(200)
        )
        .is_err(),
        "redis-server still answers after the handle was dropped"
    );
}

#[tokio::test]
async fn zookeeper_server_round_trip() {
    use zookeeper_client::{Acls, Client, CreateMode};

    let server = ZkServer::start();
    let zk = tokio::time::timeout(
        Duration::from_secs(10),
        Client::connector()
            .with_session_timeout(Duration::from_secs(5))
            .connect(&server.connect_string()),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "no ZooKeeper session within 10 s; server log:\n{}",
            server.log()
        )
    })
    .unwrap();
    let (stat, _) = zk
        .create(
            "/smoke",
            b"42",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    assert!(stat.czxid > 0);
    let (data, _) = zk.get_data("/smoke").await.unwrap();
    assert_eq!(data, b"42");
    zk.delete("/smoke", None).await.unwrap();
    assert!(zk.check_stat("/smoke").await.unwrap().is_none());
    drop(zk);
    assert!(server.four_letter("srvr").contains("Mode: standalone"));
}
