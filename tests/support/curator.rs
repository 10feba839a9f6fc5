//! Apache Curator 5 (Debian's `libcurator-recipes-java`) in a Java child process: an
//! `InterProcessMutex` driven over stdin for the interop tests (`tests/java/CuratorLock.java`),
//! its read-write lock and semaphores (`tests/java/CuratorFamily.java`), a `LeaderLatch`
//! (`tests/java/CuratorLatch.java`),
//! and the contention workload for the benchmark (`tests/java/CuratorBench.java`), compiled
//! with `javac` once per test binary.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use super::{require_binary, require_file};

const JARS: &[&str] = &[
    "curator-recipes.jar",
    "curator-framework.jar",
    "curator-client.jar",
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "guava.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
];

fn classpath() -> String {
    JARS.iter()
        .map(|jar| {
            require_file(&format!("/usr/share/java/{jar}"))
                .display()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// The compiled class directory (compiled on first use).
fn classes() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let javac = require_binary("javac");
        let dir = tempfile::tempdir().expect("tempdir").keep();
        // The crate's own tests, or the benchmarks' crate one level down.
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let sources = [root.join("tests/java"), root.join("../tests/java")]
            .into_iter()
            .find(|p| p.is_dir())
            .expect("tests/java beside the crate");
        let out = Command::new(javac)
            .arg("-d")
            .arg(&dir)
            .arg("-cp")
            .arg(classpath())
            .arg(sources.join("Curators.java"))
            .arg(sources.join("CuratorLock.java"))
            .arg(sources.join("CuratorBench.java"))
            .arg(sources.join("CuratorFamily.java"))
            .arg(sources.join("CuratorLatch.java"))
            .output()
            .expect("run javac");
        assert!(
            out.status.success(),
            "javac failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

fn java(args: &[&str]) -> Command {
    let mut cmd = Command::new(require_binary("java"));
    cmd.args(["-Xmx256m", "-cp"])
        .arg(format!("{}:{}", classes().display(), classpath()))
        .args(args);
    cmd
}

/// Runs the contention workload on Curator (`workers` sessions, one path) and returns its
/// standard line, followed by ` acquisitions=N`.
pub fn bench(connect: &str, workers: usize, cs_ms: f64, secs: f64) -> String {
    let out = java(&[
        "CuratorBench",
        connect,
        "/distlock/bench:contention",
        &workers.to_string(),
        &cs_ms.to_string(),
        &secs.to_string(),
    ])
    .stderr(Stdio::inherit())
    .output()
    .expect("run the curator benchmark");
    assert!(out.status.success(), "the curator benchmark failed");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One Curator client with one `InterProcessMutex` on a path.
pub struct Curator {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Curator {
    /// Starts the JVM, connects, and waits until the mutex is ready.
    pub fn start(connect: &str, path: &str) -> Self {
        Self::launch(&["CuratorLock", connect, path])
    }

    /// Curator's read-write lock (`recipe` = `rw`), `InterProcessSemaphoreV2` (`sem <max>`) or
    /// `InterProcessSemaphoreMutex` (`semmutex`) on `path` (`tests/java/CuratorFamily.java`).
    pub fn start_family(connect: &str, path: &str, recipe: &str) -> Self {
        let mut args = vec!["CuratorFamily", connect, path];
        args.extend(recipe.split(' '));
        Self::launch(&args)
    }

    /// A `LeaderLatch` on `path` for participant `id` (`tests/java/CuratorLatch.java`).
    pub fn start_latch(connect: &str, path: &str, id: &str) -> Self {
        Self::launch(&["CuratorLatch", connect, path, id])
    }

    fn launch(args: &[&str]) -> Self {
        let mut child = java(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn java");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut me = Self {
            child,
            stdin,
            lines,
        };
        assert_eq!(me.reply(Duration::from_secs(30)).as_deref(), Some("READY"));
        me
    }

    /// Sends a command without waiting for its answer.
    pub fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("write to curator");
        self.stdin.flush().expect("flush to curator");
    }

    /// The next line of output, if one comes within `wait`.
    pub fn reply(&mut self, wait: Duration) -> Option<String> {
        self.lines.recv_timeout(wait).ok()
    }

    /// Sends a command and returns its answer.
    pub fn ask(&mut self, command: &str) -> String {
        self.send(command);
        self.reply(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("curator did not answer `{command}`"))
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
