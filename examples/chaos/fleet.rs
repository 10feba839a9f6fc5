//! The holders of a process run: spawning, signalling and killing them, each behind its own
//! fault proxies.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use crate::checker::{parse_report, Log};
use crate::support;

pub(crate) struct Holder {
    pub(crate) child: Child,
    pub(crate) stdin: Option<ChildStdin>,
}

pub(crate) struct Fleet {
    pub(crate) backend: String,
    pub(crate) primitive: String,
    pub(crate) trace: bool,
    pub(crate) exe: std::path::PathBuf,
    pub(crate) resource_url: String,
    pub(crate) ns: String,
    pub(crate) holders: Vec<Option<Holder>>,
    /// Per holder, a proxy to each lock server node.
    pub(crate) proxies: Vec<Vec<support::proxy::Proxy>>,
    /// The URL every holder uses as it is, where they reach the servers directly (Sentinel,
    /// Cluster: the servers' own addresses come back in answers and redirects).
    pub(crate) direct_url: Option<String>,
    pub(crate) log: Arc<StdMutex<Log>>,
    pub(crate) spawned: u64,
}

impl Fleet {
    pub(crate) fn lock_url(&self, i: usize) -> String {
        if let Some(url) = &self.direct_url {
            return url.clone();
        }
        let ports: Vec<u16> = self.proxies[i].iter().map(|p| p.port()).collect();
        let port = ports[0];
        match self.backend.as_str() {
            "redis" => format!("redis://127.0.0.1:{port}/"),
            "redlock" => ports
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}/"))
                .collect::<Vec<_>>()
                .join(","),
            "postgres" => format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            // Statements through the pooler, LISTEN straight to the server.
            "postgres-pgbouncer" => ports
                .iter()
                .map(|p| format!("postgres://postgres@127.0.0.1:{p}/postgres"))
                .collect::<Vec<_>>()
                .join(","),
            _ => format!("127.0.0.1:{port}"),
        }
    }

    pub(crate) fn spawn(&mut self, i: usize) {
        let mut child = Command::new(&self.exe)
            .args(["--backend", &self.backend, "--holder", &i.to_string()])
            .args(["--primitive", &self.primitive])
            .args(self.trace.then_some("--trace"))
            .args(["--ttl", &crate::ttl().as_millis().to_string()])
            .args(["--lock-url", &self.lock_url(i)])
            .args(["--resource-url", &self.resource_url, "--ns", &self.ns])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("CHAOS_DEBUG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("spawn a holder");
        let stdout = child.stdout.take().expect("holder stdout");
        let stdin = child.stdin.take();
        let log = self.log.clone();
        (log.lock().unwrap_or_else(|p| p.into_inner()).spawns).push((i, crate::wall_ns()));
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(r) = parse_report(i, &line) {
                    log.lock().unwrap_or_else(|p| p.into_inner()).lines.push(r);
                }
            }
        });
        self.spawned += 1;
        self.holders[i] = Some(Holder { child, stdin });
    }

    pub(crate) fn pid(&self, i: usize) -> Option<nix::unistd::Pid> {
        let h = self.holders[i].as_ref()?;
        Some(nix::unistd::Pid::from_raw(
            i32::try_from(h.child.id()).ok()?,
        ))
    }

    pub(crate) fn signal(&self, i: usize, sig: nix::sys::signal::Signal) {
        if let Some(pid) = self.pid(i) {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    }

    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(mut h) = self.holders[i].take() {
            let _ = h.child.kill();
            let _ = h.child.wait();
        }
    }

    /// Asks every holder to stop (closing its stdin), and waits for them.
    pub(crate) fn stop_all(&mut self) {
        for h in self.holders.iter_mut().flatten() {
            h.stdin.take();
        }
        for slot in &mut self.holders {
            if let Some(mut h) = slot.take() {
                let deadline = Instant::now() + Duration::from_secs(15);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = h.child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = h.child.kill();
                let _ = h.child.wait();
            }
        }
    }
}
