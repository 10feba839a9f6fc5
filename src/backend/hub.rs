//! The skeleton of a notification hub: one dedicated connection per backend that hears the
//! grants released locks send to their next owner (Redis pub/sub, PostgreSQL LISTEN), shared by
//! every waiter.
//!
//! Written once here: the mailboxes of waiting claims by owner token and the registration that
//! removes one when dropped; the hub's task, which opens the connection, serves it until it is
//! lost and opens it again after a pause that doubles from [`RECONNECT_MIN`] to
//! [`RECONNECT_MAX`] while attempts fail; after every reconnect, every mailbox told to re-check
//! (messages are not replayed) and the reconnect counter moved (holders renew at once, in case
//! the server lost their locks meanwhile); the keep-alive that pings the connection while
//! anyone waits, since a half-open TCP connection would swallow every grant silently; and the
//! end of the task when the hub is closed or its last handle dropped.
//!
//! The task runs on the runtime that started the hub (the one the backend was built in), and
//! goes when that runtime shuts down, as the client does.
//!
//! What differs between services comes in through two small traits: [`HubState`], the state a
//! hub's handles share with its task (how mailboxes are filed: by owner, or by channel and
//! owner), and [`Link`], how its connection is opened, what listening to the channels in use
//! takes, and what serving it means.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::handoff::{parse, Listening, Mailbox, Wake};
use super::retry::Backoff;
use crate::sync::LockExt;

/// How long connecting may take, and how long a subscriber waits for the connection.
pub(crate) const CONNECT_WAIT: Duration = Duration::from_secs(5);
/// The first pause between two attempts to open the connection.
pub(crate) const RECONNECT_MIN: Duration = Duration::from_millis(20);
/// The longest pause between two attempts to open the connection.
pub(crate) const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// How often the connection is checked while anyone waits on it.
const PING_EVERY: Duration = Duration::from_secs(1);
/// How long a ping may go unanswered before the connection is taken as dead.
const PING_DEADLINE: Duration = Duration::from_secs(1);

/// The elections observed through a hub, by name: a counter each, moved when the service says
/// its leader may have changed, and all at once whenever messages may have been missed.
///
/// Every message a hub hears passes through [`moved`](Self::moved); a hub that nobody ever
/// observed an election through skips the map (and its lock) with one atomic load.
#[derive(Default)]
pub(crate) struct Elections {
    by_name: StdMutex<HashMap<Arc<str>, watch::Sender<u64>>>,
    /// Whether the map has ever held an election (it only ever turns true).
    used: AtomicBool,
}

impl Elections {
    /// A counter for the election `name`, shared by its observers here.
    pub(crate) fn watch(&self, name: &str) -> watch::Receiver<u64> {
        let mut elections = self.by_name.locked();
        self.used.store(true, Ordering::Release);
        if let Some(changes) = elections.get(name) {
            return changes.subscribe();
        }
        // Forget the elections nobody observes any more.
        elections.retain(|_, changes| changes.receiver_count() > 0);
        let (changes, rx) = watch::channel(0);
        elections.insert(name.into(), changes);
        rx
    }

    /// The leader of `name` may have changed.
    pub(crate) fn moved(&self, name: &str) {
        if !self.used.load(Ordering::Acquire) {
            return;
        }
        if let Some(changes) = self.by_name.locked().get(name) {
            changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Any leader may have changed (messages may have been missed).
    pub(crate) fn moved_all(&self) {
        if !self.used.load(Ordering::Acquire) {
            return;
        }
        for changes in self.by_name.locked().values() {
            changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Whether anyone observes an election here.
    #[cfg(feature = "postgres")]
    pub(crate) fn observed(&self) -> bool {
        self.used.load(Ordering::Acquire)
            && self
                .by_name
                .locked()
                .values()
                .any(|changes| changes.receiver_count() > 0)
    }
}

/// The mailboxes of waiting claims, by owner token.
#[derive(Default)]
pub(crate) struct Mailboxes(HashMap<Arc<str>, Arc<Mailbox>>);

impl Mailboxes {
    /// A new mailbox for `owner`, in place of any it had.
    pub(crate) fn open(&mut self, owner: Arc<str>) -> Arc<Mailbox> {
        let mailbox = Arc::new(Mailbox::default());
        self.0.insert(owner, mailbox.clone());
        mailbox
    }

    /// Removes `owner`'s mailbox.
    pub(crate) fn close(&mut self, owner: &str) {
        self.0.remove(owner);
    }

    /// Whether no claim waits here.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Puts the wake-up a message carries into the mailbox of the owner it names, if that
    /// owner waits here.
    pub(crate) fn deliver(&self, payload: &str) {
        let Some((owner, wake)) = parse(payload) else {
            return;
        };
        if let Some(mailbox) = self.0.get(owner) {
            mailbox.put(wake);
        }
    }

    /// Tells every mailbox to re-check: messages may have been missed.
    pub(crate) fn recheck(&self) {
        self.0.values().for_each(|m| m.put(Wake::Recheck));
    }
}

/// What every hub's handles share with its task, whatever the service; `H` is what a
/// subscriber needs of an open connection (`()` if nothing).
pub(crate) struct Common<H> {
    /// Moves on every reconnect after the first connect. The hub's connection is always open,
    /// so it is the first to see a server go and come back.
    reconnects: watch::Sender<u64>,
    /// The open connection's handle; `None` while there is none.
    connected: watch::Sender<Option<H>>,
    /// Sent on [`close`](Self::close), or dropped with the hub: the task stops.
    stop: watch::Sender<bool>,
}

impl<H: Clone> Common<H> {
    /// Not connected yet, no reconnect so far, not stopped.
    pub(crate) fn new() -> Self {
        Self {
            reconnects: watch::Sender::new(0),
            connected: watch::Sender::new(None),
            stop: watch::Sender::new(false),
        }
    }

    /// A counter that moves every time the connection comes back after a drop.
    pub(crate) fn reconnects(&self) -> watch::Receiver<u64> {
        self.reconnects.subscribe()
    }

    /// Moves the reconnect counter: holders renew at once.
    pub(crate) fn reconnected(&self) {
        self.reconnects.send_modify(|n| *n += 1);
    }

    /// The open connection's handle, waiting for it at most `limit`.
    pub(crate) async fn connected(&self, limit: Duration) -> Option<H> {
        let mut rx = self.connected.subscribe();
        let handle = match tokio::time::timeout(limit, rx.wait_for(Option::is_some)).await {
            Ok(Ok(handle)) => handle.clone(),
            _ => None,
        };
        handle
    }

    /// Stops the task, closing the connection.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn close(&self) {
        self.stop.send_replace(true);
    }
}

/// The state a hub's handles share with its task.
pub(crate) trait HubState: Send + Sync + 'static {
    /// What a subscriber needs of an open connection.
    type Handle: Clone + Send + Sync + 'static;
    /// What a registration is filed under.
    type Key: Send + Sync + 'static;

    /// What every hub shares with its task.
    fn common(&self) -> &Common<Self::Handle>;

    /// Removes the mailbox filed under `key`.
    fn unregister(&self, key: &Self::Key);

    /// Tells every mailbox to re-check: messages may have been missed.
    fn recheck_all(&self);

    /// Whether any waiter has a mailbox (only then is the connection worth checking).
    fn anyone_waits(&self) -> bool;
}

/// A registered mailbox; dropping it unregisters.
pub(crate) struct Registration<S: HubState> {
    hub: Weak<S>,
    key: S::Key,
    pub(crate) mailbox: Arc<Mailbox>,
}

impl<S: HubState> Registration<S> {
    /// The registration of `mailbox`, filed under `key` in `hub`.
    pub(crate) fn new(hub: &Arc<S>, key: S::Key, mailbox: Arc<Mailbox>) -> Self {
        Self {
            hub: Arc::downgrade(hub),
            key,
            mailbox,
        }
    }
}

impl<S: HubState> Listening for Registration<S> {
    fn mailbox(&self) -> &Arc<Mailbox> {
        &self.mailbox
    }
}

impl<S: HubState> Drop for Registration<S> {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.unregister(&self.key);
        }
    }
}

/// How a connection's service ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// The connection was lost: open another.
    Lost,
    /// The hub is gone: the task ends.
    HubGone,
}

/// One service's connection, as the hub's task drives it.
pub(crate) trait Link: Send + 'static {
    /// The hub's shared state.
    type State: HubState;
    /// An open connection, listening to every channel in use.
    type Conn: Send;
    /// Why a connection could not be opened.
    type Failure: Send;

    /// How logs name the connection (`redis pub/sub`, `postgres listen`).
    const NAME: &'static str;

    /// The hub's shared state, gone once its last handle is dropped.
    fn hub(&self) -> &Weak<Self::State>;

    /// Opens the connection and listens to every channel in use.
    fn open(&mut self) -> impl Future<Output = Result<Self::Conn, Self::Failure>> + Send;

    /// The pause before the next attempt after `failure`: `backoff` unless the service knows
    /// better.
    fn pause(&self, backoff: Duration, _failure: &Self::Failure) -> Duration {
        backoff
    }

    /// Records that `conn` is open (its channels listened to) and returns its handle.
    fn opened(&mut self, hub: &Self::State, conn: &Self::Conn)
        -> <Self::State as HubState>::Handle;

    /// Serves `conn` until it is lost or the hub is gone.
    fn serve(&mut self, conn: Self::Conn) -> impl Future<Output = Served> + Send;
}

/// A hub's task: opens `link`'s connection, serves it, and opens it again when it is lost,
/// until the hub is closed or dropped (`stop`).
async fn run<L: Link>(mut link: L, mut stop: watch::Receiver<bool>) {
    let mut backoff = Backoff::new(RECONNECT_MIN, RECONNECT_MAX);
    loop {
        let opened = tokio::select! {
            opened = link.open() => opened,
            () = stopped(&mut stop) => break,
        };
        let conn = match opened {
            Ok(conn) => conn,
            Err(failure) => {
                let pause = link.pause(backoff.current(), &failure);
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stopped(&mut stop) => break,
                }
                backoff.grow();
                continue;
            }
        };
        backoff.reset();
        let Some(hub) = link.hub().upgrade() else {
            break;
        };
        let handle = link.opened(&hub, &conn);
        // Messages sent while we were away are gone: every waiter asks the server, and
        // holders renew now, in case the server lost their locks meanwhile. The first
        // connection too: the client may have taken locks before it was open (on a server
        // that has restarted since). With nobody holding or waiting, this costs nothing.
        tracing::debug!("{} connection open", L::NAME);
        hub.recheck_all();
        hub.common().reconnected();
        hub.common().connected.send_replace(Some(handle));
        drop(hub);
        let served = tokio::select! {
            served = link.serve(conn) => served,
            () = stopped(&mut stop) => break,
        };
        if served == Served::HubGone {
            break;
        }
        tracing::debug!("{} connection lost; reconnecting", L::NAME);
        if let Some(hub) = link.hub().upgrade() {
            hub.common().connected.send_replace(None);
        }
    }
}

/// Starts a hub's task for `link` on the current runtime.
pub(crate) fn start<L: Link>(link: L, hub: &L::State) {
    let stop = hub.common().stop.subscribe();
    tokio::spawn(run(link, stop));
}

/// What a [`Link`]'s future awaits once it finds the hub gone: it never resolves, and the
/// task's stop signal, dropped with the hub, ends the task.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) async fn gone<T>() -> T {
    std::future::pending().await
}

/// Resolves when the hub is closed or dropped.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Why the keep-alive ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alive {
    /// A ping went unanswered: the connection is dead.
    Dead,
    /// The hub is gone.
    HubGone,
}

/// Pings the connection every [`PING_EVERY`] while anyone waits on `hub`; resolves when a
/// `ping` (true when answered) went unanswered for [`PING_DEADLINE`], or when the hub is gone.
pub(crate) async fn keepalive<S, P>(hub: &Weak<S>, mut ping: impl FnMut() -> P) -> Alive
where
    S: HubState,
    P: Future<Output = bool>,
{
    let mut at = tokio::time::Instant::now() + PING_EVERY;
    loop {
        tokio::time::sleep_until(at).await;
        at = tokio::time::Instant::now() + PING_EVERY;
        let Some(waits) = hub.upgrade().map(|h| h.anyone_waits()) else {
            return Alive::HubGone;
        };
        if waits && !matches!(tokio::time::timeout(PING_DEADLINE, ping()).await, Ok(true)) {
            return Alive::Dead;
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use super::*;

    /// One waiting claim at most.
    struct State {
        waiting: StdMutex<Option<Arc<Mailbox>>>,
        common: Common<u32>,
    }

    impl HubState for State {
        type Handle = u32;
        type Key = ();

        fn common(&self) -> &Common<u32> {
            &self.common
        }

        fn unregister(&self, (): &()) {
            self.waiting.locked().take();
        }

        fn recheck_all(&self) {
            if let Some(mailbox) = self.waiting.locked().as_ref() {
                mailbox.put(Wake::Recheck);
            }
        }

        fn anyone_waits(&self) -> bool {
            self.waiting.locked().is_some()
        }
    }

    /// A connection that opens after `failures` failed attempts, numbers its openings, and is
    /// lost whenever `lose` says so.
    struct Fake {
        hub: Weak<State>,
        failures: usize,
        opened: u32,
        lose: mpsc::UnboundedReceiver<()>,
    }

    impl Link for Fake {
        type State = State;
        type Conn = u32;
        type Failure = ();

        const NAME: &'static str = "test";

        fn hub(&self) -> &Weak<State> {
            &self.hub
        }

        async fn open(&mut self) -> Result<u32, ()> {
            if self.failures > 0 {
                self.failures -= 1;
                return Err(());
            }
            self.opened += 1;
            Ok(self.opened)
        }

        fn opened(&mut self, _: &State, conn: &u32) -> u32 {
            *conn
        }

        async fn serve(&mut self, _: u32) -> Served {
            match self.lose.recv().await {
                Some(()) => Served::Lost,
                None => gone().await,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reconnects_after_a_growing_pause_and_rechecks_at_every_connect() {
        let state = Arc::new(State {
            waiting: StdMutex::new(None),
            common: Common::new(),
        });
        let mailbox = Arc::new(Mailbox::default());
        *state.waiting.locked() = Some(mailbox.clone());
        let registration = Registration::new(&state, (), mailbox.clone());
        let (lose, lost) = mpsc::unbounded_channel();
        let link = Fake {
            hub: Arc::downgrade(&state),
            failures: 2,
            opened: 0,
            lose: lost,
        };
        let mut reconnects = state.common.reconnects();
        let began = Instant::now();
        start(link, &state);

        // Two failures: 20 ms, then 40 ms.
        assert_eq!(state.common.connected(CONNECT_WAIT).await, Some(1));
        assert_eq!(began.elapsed(), Duration::from_millis(60));
        // The first connect too: the mailbox was open before the connection was.
        assert_eq!(*reconnects.borrow_and_update(), 1);
        assert_eq!(mailbox.recv().await, Wake::Recheck);

        lose.send(()).expect("the task serves");
        reconnects.changed().await.expect("the hub lives");
        assert_eq!(*reconnects.borrow_and_update(), 2);
        assert_eq!(mailbox.recv().await, Wake::Recheck);
        assert_eq!(state.common.connected(CONNECT_WAIT).await, Some(2));

        // A dropped registration is filed no more.
        drop(registration);
        assert!(!state.anyone_waits());

        state.common.close();
        tokio::task::yield_now().await;
        assert!(lose.send(()).is_err(), "the task ended on close");
    }

    #[tokio::test]
    async fn a_message_reaches_the_owner_it_names_and_no_other() {
        let mut mailboxes = Mailboxes::default();
        let ours = mailboxes.open("ours".into());
        let theirs = mailboxes.open("theirs".into());
        mailboxes.deliver("ours 7 1000 2000");
        mailboxes.deliver("nobody 8 1000 2000");
        mailboxes.deliver("not a message");
        assert!(matches!(ours.recv().await, Wake::Granted(h) if h.fence == 7));
        let quiet = tokio::time::timeout(Duration::from_millis(10), theirs.recv()).await;
        assert!(quiet.is_err(), "a message for another owner");
        mailboxes.close("ours");
        mailboxes.recheck();
        assert_eq!(theirs.recv().await, Wake::Recheck);
        assert!(!mailboxes.is_empty());
    }
}
