//! Server processes for the tests: each runs under a small `sh` wrapper that holds a pipe from
//! this process. When the pipe closes (drop, panic, or the test binary exiting or being
//! killed), the wrapper kills the server, so a server shared by every test of a binary never
//! outlives it. A missing program fails the test naming the install script.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use super::INSTALL_HINT;

/// How long a server may take to answer after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A free TCP port on 127.0.0.1. There is a window between this and the server binding it;
/// `start` retries on another port if the server fails to come up.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port on loopback");
    listener.local_addr().expect("local addr").port()
}

/// Finds an executable on PATH, or fails the test naming the install script.
pub fn require_binary(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` was not found on PATH: {INSTALL_HINT}"))
}

pub fn require_file(path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    assert!(p.is_file(), "`{path}` is missing: {INSTALL_HINT}");
    p
}

/// A child process that dies with its wrapper's stdin.
pub struct Supervised {
    wrapper: Child,
    lifeline: Option<ChildStdin>,
}

impl Supervised {
    /// Runs `program args...` under `sh`, killing it when our end of the pipe closes.
    pub fn spawn(program: &Path, args: &[String], log: &Path) -> Self {
        Self::spawn_env(program, args, log, &[])
    }

    /// Like [`spawn`](Self::spawn), with extra environment variables (for the wrapper and the
    /// program alike).
    pub fn spawn_env(
        program: &Path,
        args: &[String],
        log: &Path,
        env: &[(String, String)],
    ) -> Self {
        let mut cmd = Command::new("sh");
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.arg("-c")
            .arg(r#""$@" & pid=$!; cat >/dev/null; kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null"#)
            .arg("supervised")
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create(log).expect("create server log"))
            .stderr(std::fs::File::create(log.with_extension("err")).expect("create stderr log"));
        let mut wrapper = cmd.spawn().expect("spawn sh");
        let lifeline = wrapper.stdin.take();
        Self { wrapper, lifeline }
    }

    pub fn stop(&mut self) {
        // Closing the pipe makes the wrapper kill the server and exit.
        self.lifeline.take();
        let _ = self.wrapper.wait();
    }

    pub fn exited(&mut self) -> bool {
        matches!(self.wrapper.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn read_log(dir: &Path, names: &[&str]) -> String {
    let mut out = String::new();
    for name in names {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(dir.join(name)) {
            let _ = f.read_to_string(&mut text);
        }
        out.push_str(&format!("--- {name} ---\n{text}\n"));
    }
    out
}

/// Connects to 127.0.0.1:`port` and sends `request`.
pub fn send(port: u16, request: &[u8]) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().expect("loopback addr"),
        Duration::from_millis(500),
    )?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(request)?;
    Ok(stream)
}

/// Sends `request` and returns the first line of the reply.
pub fn ask(port: u16, request: &[u8]) -> std::io::Result<String> {
    let mut reply = String::new();
    BufReader::new(send(port, request)?).read_line(&mut reply)?;
    Ok(reply)
}

/// Sends `request` and reads until the server closes the connection.
pub fn ask_all(port: u16, request: &[u8]) -> std::io::Result<String> {
    let mut reply = String::new();
    send(port, request)?.read_to_string(&mut reply)?;
    Ok(reply)
}

/// Starts a server (up to three times, each on a fresh port and directory) until `ready`
/// accepts it. `command` gives the program and arguments for a port and directory.
pub fn launch(
    what: &str,
    log_files: &[&str],
    command: impl FnMut(u16, &Path) -> (PathBuf, Vec<String>),
    ready: impl Fn(u16) -> bool,
) -> (Supervised, u16, tempfile::TempDir) {
    launch_env(what, log_files, &[], command, ready)
}

/// Like [`launch`], with extra environment variables for the server.
pub fn launch_env(
    what: &str,
    log_files: &[&str],
    env: &[(String, String)],
    mut command: impl FnMut(u16, &Path) -> (PathBuf, Vec<String>),
    ready: impl Fn(u16) -> bool,
) -> (Supervised, u16, tempfile::TempDir) {
    let mut last_log = String::new();
    for _attempt in 0..3 {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let (program, args) = command(port, dir.path());
        let mut process =
            Supervised::spawn_env(&program, &args, &dir.path().join(log_files[0]), env);
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline && !process.exited() {
            if ready(port) {
                return (process, port, dir);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        last_log = read_log(dir.path(), log_files);
    }
    panic!("{what} did not start serving within {READY_TIMEOUT:?}; its log:\n{last_log}");
}

/// Starts `program` again on the same `port` and directory, retrying while the port is still
/// in TIME_WAIT, until `ready`.
pub fn respawn(
    what: &str,
    program: &Path,
    args: &[String],
    port: u16,
    dir: &Path,
    log_files: &[&str],
    ready: fn(u16) -> bool,
) -> Supervised {
    respawn_env(what, program, args, &[], port, dir, log_files, ready)
}

/// Like [`respawn`], with extra environment variables for the server.
#[allow(clippy::too_many_arguments)]
pub fn respawn_env(
    what: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    port: u16,
    dir: &Path,
    log_files: &[&str],
    ready: fn(u16) -> bool,
) -> Supervised {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let mut process = Supervised::spawn_env(program, args, &dir.join(log_files[0]), env);
        let started = Instant::now();
        while !process.exited() && started.elapsed() < Duration::from_secs(20) {
            if ready(port) {
                return process;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not restart on port {port}; its log:\n{}",
            read_log(dir, log_files)
        );
        process.stop();
    }
}

/// Finds an executable on PATH or in one of `dirs` (e.g. `/usr/sbin`, which is not on every
/// PATH), or fails the test naming the install script.
pub fn require_binary_in(name: &str, dirs: &[&str]) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(dirs.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` was not found: {INSTALL_HINT}"))
}
