//! A TCP proxy on a free loopback port that can pass traffic, cut every connection, or swallow
//! bytes silently (a partition that looks alive), for fault tests against real servers.
//!
//! Runs on plain threads, so it keeps working whatever the test's runtime is doing.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const PASS: u8 = 0;
const CUT: u8 = 1;
const BLACKHOLE: u8 = 2;

struct Shared {
    mode: AtomicU8,
    /// Bumped by `cut`: connections from an older generation close.
    generation: AtomicU64,
    stop: AtomicBool,
}

/// Forwards 127.0.0.1:`port()` to an upstream port.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy port");
        let port = listener.local_addr().expect("proxy addr").port();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(PASS),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        thread::spawn(move || accept_loop(listener, upstream, s));
        Self { port, shared }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Traffic flows again (new connections are accepted).
    pub fn pass(&self) {
        self.shared.mode.store(PASS, Ordering::SeqCst);
    }

    /// Closes every open connection and refuses new ones until `pass`.
    pub fn cut(&self) {
        self.shared.mode.store(CUT, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Keeps connections open but drops every byte, both ways, until `pass` (and then cuts
    /// them, as a real network would have lost them).
    pub fn blackhole(&self) {
        self.shared.mode.store(BLACKHOLE, Ordering::SeqCst);
    }

    /// Ends a blackhole the way a healed partition usually looks to TCP: the old
    /// connections are dead, new ones work.
    pub fn heal(&self) {
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        self.pass();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn accept_loop(listener: TcpListener, upstream: u16, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        if shared.mode.load(Ordering::SeqCst) == CUT {
            drop(client);
            continue;
        }
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
            continue;
        };
        let generation = shared.generation.load(Ordering::SeqCst);
        for (from, to) in [(&client, &server), (&server, &client)] {
            let (from, to) = (
                from.try_clone().expect("clone stream"),
                to.try_clone().expect("clone stream"),
            );
            let shared = shared.clone();
            thread::spawn(move || pump(from, to, generation, &shared));
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, generation: u64, shared: &Shared) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = [0u8; 16 * 1024];
    loop {
        if shared.generation.load(Ordering::SeqCst) != generation {
            break;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if shared.mode.load(Ordering::SeqCst) == BLACKHOLE {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
