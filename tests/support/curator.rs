//! Apache Curator 5 (Debian's `libcurator-recipes-java`) driving an `InterProcessMutex` in a
//! Java child process, for interop tests: `tests/java/CuratorLock.java`, compiled with `javac`
//! once per test binary.

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
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/java/CuratorLock.java");
        let out = Command::new(javac)
            .arg("-d")
            .arg(&dir)
            .arg("-cp")
            .arg(classpath())
            .arg(source)
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

/// One Curator client with one `InterProcessMutex` on a path.
pub struct Curator {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Curator {
    /// Starts the JVM, connects, and waits until the mutex is ready.
    pub fn start(connect: &str, path: &str) -> Self {
        let java = require_binary("java");
        let mut child = Command::new(java)
            .args(["-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp"])
            .arg(format!("{}:{}", classes().display(), classpath()))
            .args(["CuratorLock", connect, path])
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
