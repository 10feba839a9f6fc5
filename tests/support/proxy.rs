//! A TCP proxy on a free loopback port for fault tests against real servers. It can pass
//! traffic, cut every connection, swallow bytes silently (a partition that looks alive), and
//! aim a fault at some connections only: the pub/sub ones (a connection that has sent
//! `SUBSCRIBE` or `LISTEN`) or the command ones, delaying or swallowing the server's replies on them.
//!
//! Runs on plain threads, so it keeps working whatever the test's runtime is doing.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const PASS: u8 = 0;
const CUT: u8 = 1;
const BLACKHOLE: u8 = 2;

/// Which connections a targeted fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Every connection.
    All,
    /// Connections that have sent `SUBSCRIBE` (a Redis pub/sub connection) or `LISTEN` (a
    /// PostgreSQL one).
    Subscribers,
    /// Connections that have not (command connections).
    Commands,
}

/// What a targeted fault does to the connections it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Drop every byte, both ways.
    Blackhole,
    /// Drop every byte, both ways, and keep the server's end open this long after the client
    /// closes (a host that crashed: nothing reaches the server, no FIN either, until TCP
    /// keepalive gives up on it), or until the connection is cut (`cut`, `heal`).
    Crash(Duration),
    /// Drop the server's bytes; the client's still arrive.
    SwallowReplies,
    /// Deliver the server's bytes this much later (in order).
    DelayReplies(Duration),
    /// Deliver the client's bytes that contain this pattern this much later (and so every
    /// byte the client sends after them on that connection: order is kept).
    DelayRequests(&'static [u8], Duration),
}

/// A fault on the connections that were open when it was set (newer ones pass), or on every
/// one (`up_to` at `u64::MAX`).
#[derive(Debug, Clone, Copy)]
struct Targeted {
    which: Which,
    fault: Fault,
    up_to: u64,
}

struct Shared {
    mode: AtomicU8,
    /// How long to keep trying to reach the upstream for a new connection before closing it.
    patience: Mutex<Duration>,
    /// Bumped by `cut`: connections from an older generation close.
    generation: AtomicU64,
    stop: AtomicBool,
    next_id: AtomicU64,
    targeted: Mutex<Option<Targeted>>,
}

/// One proxied connection, as the faults see it.
struct Conn {
    id: u64,
    subscriber: AtomicBool,
}

/// Forwards 127.0.0.1:`port()` to an upstream port.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Self {
        Self::start_with_patience(upstream, Duration::ZERO)
    }

    /// A proxy that keeps trying to reach its upstream for `patience` before giving up on a
    /// new connection. A server that is not listening *yet* then looks like it does to a real
    /// client, a refused connect retried, rather than a connection accepted and then closed
    /// (which a ZooKeeper follower takes as its leader failing, and starts a new election).
    pub fn start_with_patience(upstream: u16, patience: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy port");
        let port = listener.local_addr().expect("proxy addr").port();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(PASS),
            patience: Mutex::new(patience),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            targeted: Mutex::new(None),
        });
        let s = shared.clone();
        thread::spawn(move || accept_loop(listener, upstream, s));
        Self { port, shared }
    }

    /// From now on, new connections wait this long for the upstream (see
    /// [`Proxy::start_with_patience`]).
    pub fn set_patience(&self, patience: Duration) {
        *self.shared.patience.lock().unwrap() = patience;
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many connections have been passed to the upstream so far.
    pub fn connections(&self) -> u64 {
        self.shared.next_id.load(Ordering::SeqCst)
    }

    /// Traffic flows again (new connections are accepted, targeted faults end).
    pub fn pass(&self) {
        self.shared.mode.store(PASS, Ordering::SeqCst);
        *self.shared.targeted.lock().unwrap() = None;
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

    /// Drops every byte of the `which` connections open now (a half-open connection); later
    /// connections pass.
    pub fn blackhole_only(&self, which: Which) {
        self.target(which, Fault::Blackhole);
    }

    /// The client host of the connections open now crashes: every byte is dropped, and the
    /// server's end stays open for `hold` after the client closes (no FIN reaches it, until
    /// TCP keepalive gives up) or until the connections are cut (`cut`, `heal`). Later
    /// connections pass.
    pub fn crash(&self, hold: Duration) {
        self.target(Which::All, Fault::Crash(hold));
    }

    /// Drops the server's replies on the `which` connections open now; requests still arrive.
    pub fn swallow_replies(&self, which: Which) {
        self.target(which, Fault::SwallowReplies);
    }

    /// Delays the server's replies on the `which` connections open now by `delay`.
    pub fn delay_replies(&self, which: Which, delay: Duration) {
        self.target(which, Fault::DelayReplies(delay));
    }

    /// Delays by `delay` every request that contains `pattern` (a statement or command
    /// name) on the `which` connections, open now or later, until `pass`: the request reaches
    /// the server late, and whatever the client sends after it on that connection with it,
    /// while requests on the other connections pass (a pooled connection on a slow path).
    pub fn delay_requests_containing(&self, which: Which, pattern: &'static [u8], delay: Duration) {
        *self.shared.targeted.lock().unwrap() = Some(Targeted {
            which,
            fault: Fault::DelayRequests(pattern, delay),
            up_to: u64::MAX,
        });
    }

    fn target(&self, which: Which, fault: Fault) {
        let up_to = self.shared.next_id.load(Ordering::SeqCst);
        *self.shared.targeted.lock().unwrap() = Some(Targeted {
            which,
            fault,
            up_to,
        });
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

impl Shared {
    /// The targeted fault that applies to `conn` now, if any.
    fn fault_for(&self, conn: &Conn) -> Option<Fault> {
        let t = (*self.targeted.lock().unwrap())?;
        if conn.id >= t.up_to {
            return None;
        }
        let subscriber = conn.subscriber.load(Ordering::SeqCst);
        let hit = match t.which {
            Which::All => true,
            Which::Subscribers => subscriber,
            Which::Commands => !subscriber,
        };
        hit.then_some(t.fault)
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
        let shared = shared.clone();
        // Off the accept thread: a patient connect must not hold up other connections.
        thread::spawn(move || serve(client, upstream, &shared));
    }
}

/// Connects `client` to the upstream (patiently, if the proxy is) and pumps both ways.
fn serve(client: TcpStream, upstream: u16, shared: &Arc<Shared>) {
    let give_up = Instant::now() + *shared.patience.lock().unwrap();
    let server = loop {
        match TcpStream::connect(("127.0.0.1", upstream)) {
            Ok(server) => break server,
            Err(_) if Instant::now() < give_up => thread::sleep(Duration::from_millis(20)),
            Err(_) => return,
        }
    };
    // Forward small writes at once, as the endpoints would send them (Nagle's algorithm
    // meeting delayed ACKs would add 40 ms stalls to a chatty protocol like ZooKeeper's).
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let generation = shared.generation.load(Ordering::SeqCst);
    let conn = Arc::new(Conn {
        id: shared.next_id.fetch_add(1, Ordering::SeqCst),
        subscriber: AtomicBool::new(false),
    });
    for (from, to, replies) in [(&client, &server, false), (&server, &client, true)] {
        let (from, to) = (
            from.try_clone().expect("clone stream"),
            to.try_clone().expect("clone stream"),
        );
        let (shared, conn) = (shared.clone(), conn.clone());
        thread::spawn(move || pump(from, to, replies, generation, &shared, &conn));
    }
}

/// Copies `from` to `to` until either side closes or the generation moves on. `replies` is
/// the server-to-client direction.
fn pump(
    mut from: TcpStream,
    to: TcpStream,
    replies: bool,
    generation: u64,
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    // Writes happen on their own thread, each at its due time, so a delay keeps byte order.
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = {
        let (shared, mut to) = (shared.clone(), to.try_clone().expect("clone stream"));
        thread::spawn(move || {
            for (due, bytes) in rx {
                let now = Instant::now();
                if due > now {
                    thread::sleep(due - now);
                }
                if shared.generation.load(Ordering::SeqCst) != generation
                    || to.write_all(&bytes).is_err()
                {
                    break;
                }
            }
        })
    };
    let mut buf = [0u8; 16 * 1024];
    loop {
        if shared.generation.load(Ordering::SeqCst) != generation {
            break;
        }
        let r = from.read(&mut buf);
        let closed = match &r {
            Ok(0) => true,
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            Ok(_) => false,
        };
        if let (true, false, Some(Fault::Crash(hold))) = (closed, replies, shared.fault_for(conn)) {
            // The client is gone, silently: hold the server's end a while, or until a cut.
            let until = Instant::now() + hold;
            while shared.generation.load(Ordering::SeqCst) == generation
                && !shared.stop.load(Ordering::SeqCst)
                && Instant::now() < until
            {
                thread::sleep(Duration::from_millis(20));
            }
            break;
        }
        match r {
            Ok(0) => break,
            Ok(n) => {
                let bytes = &buf[..n];
                if !replies && contains_subscribe(bytes) {
                    conn.subscriber.store(true, Ordering::SeqCst);
                }
                if shared.mode.load(Ordering::SeqCst) == BLACKHOLE {
                    continue;
                }
                let due = match shared.fault_for(conn) {
                    Some(Fault::Blackhole | Fault::Crash(_)) => continue,
                    Some(Fault::SwallowReplies) if replies => continue,
                    Some(Fault::DelayReplies(d)) if replies => Instant::now() + d,
                    Some(Fault::DelayRequests(pattern, d))
                        if !replies && bytes.windows(pattern.len()).any(|w| w == pattern) =>
                    {
                        Instant::now() + d
                    }
                    _ => Instant::now(),
                };
                if tx.send((due, bytes.to_vec())).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    drop(tx);
    let _ = writer.join();
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Whether a client's bytes subscribe to messages: Redis `SUBSCRIBE`, a PostgreSQL query that
/// starts with `LISTEN `.
///
/// A (P|S)SUBSCRIBE command's name as its own bulk string, not the word inside a longer one (a
/// Redis library's source, sent by `FUNCTION LOAD`, may say "subscribed"). Looked for only where
/// a bulk string or a `LISTEN` starts: every chunk of every connection passes through here, and
/// a window-by-window scan of a 1 MiB value took longer than a Redlock node's timeout in a test
/// build.
fn contains_subscribe(bytes: &[u8]) -> bool {
    const NAMES: [&[u8]; 3] = [
        b"$9\r\nSUBSCRIBE\r\n",
        b"$10\r\nPSUBSCRIBE\r\n",
        b"$10\r\nSSUBSCRIBE\r\n",
    ];
    let at = |i: usize, what: &[u8]| {
        bytes
            .get(i..i + what.len())
            .is_some_and(|w| w.eq_ignore_ascii_case(what))
    };
    bytes.iter().enumerate().any(|(i, b)| match b {
        b'$' => NAMES.iter().any(|name| at(i, name)),
        // A simple query (`Q`, then its length) that starts with it: not the word in a
        // statement's text (the schema's comments say "LISTEN connection").
        b'L' => i >= 5 && bytes[i - 5] == b'Q' && at(i, b"LISTEN "),
        _ => false,
    })
}

/// One proxy in front of each node of a service (one for a single server, one per node for
/// Redlock): a fault aimed at the set hits every node's connections of the clients behind it.
pub struct Proxies(Vec<Proxy>);

impl Proxies {
    pub fn start(upstreams: &[u16]) -> Self {
        Self(upstreams.iter().map(|&p| Proxy::start(p)).collect())
    }

    pub fn ports(&self) -> Vec<u16> {
        self.0.iter().map(Proxy::port).collect()
    }

    /// See [`Proxy::pass`].
    pub fn pass(&self) {
        self.0.iter().for_each(Proxy::pass);
    }

    /// See [`Proxy::blackhole`].
    pub fn blackhole(&self) {
        self.0.iter().for_each(Proxy::blackhole);
    }

    /// See [`Proxy::heal`].
    pub fn heal(&self) {
        self.0.iter().for_each(Proxy::heal);
    }

    /// See [`Proxy::blackhole_only`].
    pub fn blackhole_only(&self, which: Which) {
        self.0.iter().for_each(|p| p.blackhole_only(which));
    }

    /// See [`Proxy::crash`].
    pub fn crash(&self, hold: Duration) {
        self.0.iter().for_each(|p| p.crash(hold));
    }
}
