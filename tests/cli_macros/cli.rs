//! The `distlock` binary against real Redis and ZooKeeper servers: `run` excludes, `--no-wait`
//! reports busy, a lost lock terminates the command with the documented status, SIGINT
//! releases at once, and `inspect` reads holders and waiters.
#![cfg(all(feature = "cli", feature = "redis", feature = "zookeeper"))]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::server::postgres::shared_postgres;
use crate::support::server::redis::shared_redis;
use crate::support::server::zookeeper::shared_zookeeper;

const BUSY: i32 = 75;
const LOST: i32 = 125;
const INTERRUPTED: i32 = 130;

/// `distlock --url <url> --namespace <ns> <args...>`.
fn distlock(url: &str, ns: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distlock"));
    cmd.env_remove("DISTLOCK_URL")
        .args(["--url", url, "--namespace", ns])
        .args(args)
        .stdin(Stdio::null());
    cmd
}

fn output(mut cmd: Command) -> Output {
    cmd.output().expect("run distlock")
}

fn redis_url() -> String {
    shared_redis().url()
}

fn pg_url() -> String {
    shared_postgres().url()
}

fn zk_url() -> String {
    format!("zk://{}", shared_zookeeper().connect_string())
}

/// Blocking waits off the async workers.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Three `distlock run`s of two rounds each on one key, each command marking its start and end
/// in one file: the marks strictly alternate.
fn runs_never_overlap(url: &str, ns: &str, dir: &Path) {
    let marks = dir.join("marks");
    let script = format!(
        "echo start >> {0}; sleep 0.1; echo end >> {0}",
        marks.display()
    );
    let children: Vec<Child> = (0..3)
        .map(|_| {
            let mut cmd = distlock(url, ns, &[]);
            cmd.args(["run", "k", "--quiet", "--", "sh", "-c"]);
            cmd.arg(format!("{script}; {script}"));
            cmd.spawn().expect("spawn distlock")
        })
        .collect();
    // Two critical sections per command: each `run` holds the lock across both.
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let text = std::fs::read_to_string(&marks).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 12, "{text}");
    for pair in lines.chunks(2) {
        assert_eq!(pair, ["start", "end"], "overlapping runs:\n{text}");
    }
}

#[test]
fn runs_on_one_key_never_overlap() {
    let ns = test_namespace!();
    let dir = tempfile::tempdir().unwrap();
    runs_never_overlap(&redis_url(), &ns, dir.path());
    let dir = tempfile::tempdir().unwrap();
    runs_never_overlap(&zk_url(), &ns, dir.path());
    let dir = tempfile::tempdir().unwrap();
    runs_never_overlap(&pg_url(), &ns, dir.path());
}

#[test]
fn no_wait_on_a_busy_key_exits_75_and_the_token_reaches_the_command() {
    let ns = test_namespace!();
    for url in [redis_url(), zk_url(), pg_url()] {
        let mut holder = distlock(
            &url,
            &ns,
            &[
                "run",
                "k",
                "--",
                "sh",
                "-c",
                "echo $DISTLOCK_FENCING_TOKEN; sleep 30",
            ],
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
        let mut token = String::new();
        let mut out = holder.stdout.take().unwrap();
        // The command runs (so the lock is held) once it has printed its token.
        let mut buf = [0u8; 64];
        while !token.ends_with('\n') {
            let n = std::io::Read::read(&mut out, &mut buf).unwrap();
            assert!(n > 0, "the holder's command printed nothing");
            token.push_str(std::str::from_utf8(&buf[..n]).unwrap());
        }
        assert!(token.trim().parse::<u64>().unwrap() > 0, "{token}");
        let busy = output(distlock(
            &url,
            &ns,
            &["run", "--no-wait", "k", "--", "true"],
        ));
        assert_eq!(busy.status.code(), Some(BUSY), "{busy:?}");
        let timed = output(distlock(
            &url,
            &ns,
            &["run", "--timeout", "300ms", "k", "--", "true"],
        ));
        assert_eq!(timed.status.code(), Some(124), "{timed:?}");
        // flock(1)'s short options say the same.
        let busy = output(distlock(&url, &ns, &["run", "-n", "k", "--", "true"]));
        assert_eq!(busy.status.code(), Some(BUSY), "{busy:?}");
        let timed = output(distlock(
            &url,
            &ns,
            &["run", "-w", "300ms", "k", "--", "true"],
        ));
        assert_eq!(timed.status.code(), Some(124), "{timed:?}");
        holder.kill().unwrap();
        holder.wait().unwrap();
    }
}

/// Starts `distlock run k --ttl <ttl> -- sleep 30` and waits until it holds (inspect shows
/// a holder).
// The child is returned to the caller, which waits on it (`wait_exit`).
#[allow(clippy::zombie_processes)]
fn start_holder(url: &str, ns: &str, ttl: &str) -> Child {
    let mut child = distlock(url, ns, &["run", "--ttl", ttl, "k", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = output(distlock(url, ns, &["inspect", "--json", "k"]));
        let json: serde_json::Value = serde_json::from_slice(&seen.stdout).unwrap_or_default();
        if json["holders"].as_array().is_some_and(|h| h.len() == 1) {
            return child;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the holder never got the lock");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(mut child: Child, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(
            Instant::now() < deadline,
            "distlock did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_terminates_the_command_with_status_125() {
    let ns = test_namespace!();
    // Redis: the lock's key deleted behind the holder's back; its next renewal is refused.
    let url = redis_url();
    let holder = blocking(|| start_holder(&url, &ns, "1500ms"));
    let mut conn = crate::support::redis::connection(&url).await;
    let _: () = redis::cmd("DEL")
        .arg(format!("{ns}:{{k}}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let code = blocking(|| wait_exit(holder, Duration::from_secs(5)));
    assert_eq!(code, LOST);

    // ZooKeeper: the holder's node deleted; its own-node watch notices at once.
    let url = zk_url();
    let holder = blocking(|| start_holder(&url, &ns, "15s"));
    let zk = crate::support::zk::raw(&shared_zookeeper().connect_string()).await;
    let path = format!("/{ns}/k");
    for node in crate::support::zk::children(&zk, &path).await {
        zk.delete(&format!("{path}/{node}"), None).await.unwrap();
    }
    let code = blocking(|| wait_exit(holder, Duration::from_secs(5)));
    assert_eq!(code, LOST);
}

#[test]
fn sigint_releases_at_once() {
    let ns = test_namespace!();
    for url in [redis_url(), zk_url()] {
        // A 30 s lease: the waiter must not be getting in by expiry.
        let holder = start_holder(&url, &ns, "30s");
        let waiter = distlock(&url, &ns, &["run", "--quiet", "k", "--", "true"])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let pid = nix::unistd::Pid::from_raw(holder.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let sent = Instant::now();
        assert_eq!(wait_exit(holder, Duration::from_secs(5)), INTERRUPTED);
        assert_eq!(wait_exit(waiter, Duration::from_secs(5)), 0);
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "the waiter got in only after {:?}",
            sent.elapsed()
        );
    }
}

#[test]
fn inspect_shows_holders_and_waiters() {
    let ns = test_namespace!();
    for url in [redis_url(), zk_url()] {
        let holder = start_holder(&url, &ns, "15s");
        let waiter = distlock(&url, &ns, &["run", "--quiet", "k", "--", "true"])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let json = loop {
            let seen = output(distlock(&url, &ns, &["inspect", "--json", "k"]));
            assert!(seen.status.success(), "{seen:?}");
            let json: serde_json::Value = serde_json::from_slice(&seen.stdout).unwrap();
            if json["waiters"].as_array().is_some_and(|w| w.len() == 1) {
                break json;
            }
            assert!(Instant::now() < deadline, "no waiter seen: {json}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(json["family"], "mutex");
        assert!(
            json["holders"][0]["fencing_token"].as_u64().unwrap() > 0,
            "{json}"
        );
        let table = output(distlock(&url, &ns, &["inspect", "k"]));
        let text = String::from_utf8(table.stdout).unwrap();
        assert!(
            text.contains("holders   1") && text.contains("waiters   1"),
            "{text}"
        );
        // Redis records no time a waiter queued, ZooKeeper no lease: the table says why `-`.
        assert!(
            text.contains(" - ") || text.contains(" -\n"),
            "a value this service does not record: {text}"
        );
        assert!(text.contains("not recorded by this service"), "{text}");
        let pid = nix::unistd::Pid::from_raw(holder.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        assert_eq!(wait_exit(holder, Duration::from_secs(5)), INTERRUPTED);
        assert_eq!(wait_exit(waiter, Duration::from_secs(5)), 0);
    }
}

/// `distlock schema` prints the SQL a DBA applies (tests/postgres/server.rs applies it by hand and
/// uses it), without any service.
#[test]
fn schema_prints_the_postgres_sql() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distlock"));
    cmd.env_remove("DISTLOCK_URL").arg("schema");
    let out = output(cmd);
    assert!(out.status.success(), "{out:?}");
    let sql = String::from_utf8(out.stdout).unwrap();
    assert_eq!(sql, distlock::backend::PgBackend::schema_sql());
    assert!(sql.contains("CREATE FUNCTION distlock.acquire("));
}

/// `--help` names every kind of service URL and says what KEY is; an unreachable service is
/// reported with its cause, once; `memory:` is refused with the services that work.
#[test]
fn help_names_every_service_and_errors_say_their_cause_once() {
    let help = output(distlock("redis://unused", "ns", &["run", "--help"]));
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "redis://",
        "rediss://",
        "redis+cluster://",
        "redis+sentinel://",
        "redlock://",
        "zk://",
        "postgres://",
        "user:password@",
        "The lock's name",
        "-w, --timeout",
        "-n, --no-wait",
    ] {
        assert!(text.contains(needle), "--help lacks {needle:?}:\n{text}");
    }
    // Each command's summary is one line; the details are in its own --help, and the forms
    // of --url only where they are spelled out (run's long help), not under every command.
    let top = output(distlock("redis://unused", "ns", &["--help"]));
    let top = String::from_utf8_lossy(&top.stdout);
    let commands: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    for name in ["run", "inspect", "schema", "unlock", "help"] {
        let line = commands
            .iter()
            .position(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no line for {name}:\n{top}"));
        // A continued summary would be a line that names no command.
        let next = commands.get(line + 1).map_or("", |l| l.trim_start());
        assert!(
            next.is_empty()
                || ["run ", "inspect ", "schema ", "unlock ", "help "]
                    .iter()
                    .any(|n| next.starts_with(n)),
            "the summary of {name} runs over one line:\n{top}"
        );
    }
    for args in [
        &["--help"][..],
        &["inspect", "--help"],
        &["unlock", "--help"],
    ] {
        let help = output(distlock("redis://unused", "ns", args));
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(
            !help.contains("redis+sentinel://"),
            "{args:?} repeats the URL forms:\n{help}"
        );
        assert!(help.contains("distlock run --help"), "{args:?}:\n{help}");
    }
    let unlock = output(distlock("redis://unused", "ns", &["unlock", "--help"]));
    let unlock = String::from_utf8_lossy(&unlock.stdout);
    assert!(
        unlock.contains("next renewal") && unlock.contains("fencing"),
        "{unlock}"
    );
    let port = crate::support::free_port();
    let down = output(distlock(
        &format!("redis://127.0.0.1:{port}"),
        "ns",
        &["inspect", "k"],
    ));
    assert_eq!(down.status.code(), Some(69), "{down:?}");
    let err = String::from_utf8_lossy(&down.stderr);
    assert_eq!(err.matches("Connection refused").count(), 1, "{err}");
    // A web server's port: one line, in our words, not the reply parser's dump.
    let http = output(distlock(
        &format!("redis://127.0.0.1:{}", http_port()),
        "ns",
        &["inspect", "k"],
    ));
    let err = String::from_utf8_lossy(&http.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("did not speak the Redis protocol"), "{err}");
    let memory = output(distlock("memory:", "ns", &["inspect", "k"]));
    assert_eq!(memory.status.code(), Some(2), "{memory:?}");
    assert!(
        String::from_utf8_lossy(&memory.stderr).contains("postgres://"),
        "{memory:?}"
    );
}

/// A loopback port whose listener answers every connection with an HTTP error and hangs up. The
/// listener lives as long as the test process.
fn http_port() -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut socket in listener.incoming().flatten() {
            let _ = socket.read(&mut [0u8; 1024]);
            let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    port
}

/// A loopback port whose listener accepts connections and never answers (a hung server, a
/// balancer with no backend). The listener lives as long as the test process.
fn silent_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let open: Vec<_> = listener.incoming().collect();
        drop(open);
    });
    port
}

/// A service that accepts and never answers ends the run: 69 within the URL's
/// `connect_timeout`, and `--timeout` bounds the whole run, connecting included (124). A
/// refusal that will not pass (a wrong password) exits 77, not 69, so a wrapper that retries
/// on 69 does not retry it for ever.
#[test]
fn a_silent_service_ends_the_run_and_a_refusal_has_its_own_code() {
    let port = silent_port();
    let pg = format!("postgres://u:p@127.0.0.1:{port}/app");
    let start = Instant::now();
    let out = output(distlock(
        &format!("{pg}?connect_timeout=1"),
        "ns",
        &["run", "-w", "5s", "k", "--", "true"],
    ));
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    let start = Instant::now();
    let out = output(distlock(
        &format!("{pg}?connect_timeout=30"),
        "ns",
        &["run", "-w", "1s", "k", "--", "true"],
    ));
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );

    let wrong = redis_url().replace("redis://", "redis://nobody:wrong@");
    let out = output(distlock(&wrong, "ns", &["run", "-n", "k", "--", "true"]));
    assert_eq!(out.status.code(), Some(77), "{out:?}");
}

/// `distlock unlock KEY`: without `--force` it shows what it would remove and
/// changes nothing (status 75 while held); `inspect` says the same; `--force` drops the holder,
/// whose `run` then stops its command as lost (125); an unheld key has nothing to remove.
#[test]
fn unlock_refuses_without_force_and_force_drops_the_holder() {
    let ns = test_namespace!();
    let mut urls = vec![redis_url()];
    urls.extend(force_release_urls());
    for url in urls {
        let holder = start_holder(&url, &ns, "3s");
        let dry = output(distlock(&url, &ns, &["unlock", "k"]));
        assert_eq!(dry.status.code(), Some(BUSY), "{dry:?}");
        let text = String::from_utf8_lossy(&dry.stdout);
        assert!(text.contains("would remove 1 holder"), "{text}");
        assert!(
            String::from_utf8_lossy(&dry.stderr).contains("--force"),
            "{dry:?}"
        );
        let table = output(distlock(&url, &ns, &["inspect", "k"]));
        let text = String::from_utf8_lossy(&table.stdout);
        assert!(
            text.contains("would remove the 1 holder(s) above"),
            "{text}"
        );
        let json = output(distlock(&url, &ns, &["inspect", "--json", "k"]));
        let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(json["unlock_removes"], 1, "{json}");
        let token = json["holders"][0]["fencing_token"].clone();

        let forced = output(distlock(&url, &ns, &["unlock", "--force", "--json", "k"]));
        assert!(forced.status.success(), "{forced:?}");
        let json: serde_json::Value = serde_json::from_slice(&forced.stdout).unwrap();
        assert_eq!(json["forced"], true, "{json}");
        assert_eq!(json["removed"].as_array().map(Vec::len), Some(1), "{json}");
        assert_eq!(json["removed"][0]["fencing_token"], token, "{json}");
        // The holder's next renewal (a third of its 3 s lease) is refused: lost.
        assert_eq!(wait_exit(holder, Duration::from_secs(5)), LOST, "{url}");

        // For people: the removed holder's token, and that it may act until its next
        // renewal, so fencing is what keeps its writes out.
        let holder = start_holder(&url, &ns, "3s");
        let json = output(distlock(&url, &ns, &["inspect", "--json", "k"]));
        let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        let token = match json["holders"][0]["fencing_token"].as_u64() {
            Some(token) => token.to_string(),
            None => "unknown".to_owned(),
        };
        let forced = output(distlock(&url, &ns, &["unlock", "--force", "k"]));
        assert!(forced.status.success(), "{forced:?}");
        let text = String::from_utf8_lossy(&forced.stdout);
        assert!(text.contains("removed 1 holder(s)"), "{text}");
        assert!(
            text.contains(&format!(
                "The removed holder (token {token}) may still act until its next renewal"
            )),
            "{url}: {text}"
        );
        assert!(
            text.contains("a third of its TTL") && text.contains("fencing"),
            "{text}"
        );
        assert_eq!(wait_exit(holder, Duration::from_secs(5)), LOST, "{url}");

        let free = output(distlock(&url, &ns, &["unlock", "k"]));
        assert!(free.status.success(), "{free:?}");
        assert!(String::from_utf8_lossy(&free.stdout).contains("not held"));
        let bad = output(distlock(&url, &ns, &["unlock", "--force", ""]));
        assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    }
}

/// The services besides Redis whose `unlock --force` the CLI test covers.
fn force_release_urls() -> Vec<String> {
    vec![pg_url(), zk_url()]
}
