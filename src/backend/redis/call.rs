//! How one call of a script reaches the server: as a function of the library (`FCALL`), or by
//! `EVALSHA`, the library or the script loaded again where the server lost it.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use ::redis::{FromRedisValue, RedisResult, ToRedisArgs};

use super::script::{Functions, Script};
use super::strings::Strings;

/// A call's script, keys and arguments, owned: what a coalesced call is made of (see
/// [`Library::call_many`](super::script::Library::call_many)).
pub(crate) struct Parts {
    pub(crate) name: &'static str,
    pub(super) keys: Strings,
    pub(super) args: Strings,
    pub(super) clock: Option<usize>,
}

/// One call of a [`Script`] with its keys and arguments, as a function (`FCALL`) or by
/// `EVALSHA`.
pub(crate) struct Call<'a> {
    /// `None` if the library holds no script of that name: sending the call fails.
    pub(super) script: Option<&'a Script>,
    /// The script's name, for that failure.
    pub(super) name: &'static str,
    /// Called as a function of the library these use.
    pub(super) functions: Option<&'a Functions>,
    /// A function call the server refuses goes by `EVALSHA` instead (see
    /// [`invoke_async`](Self::invoke_async)).
    pub(super) fallback: bool,
    pub(super) keys: Strings,
    pub(super) args: Strings,
    /// The indexes in `args` that are this machine's clock, read as each attempt is sent (see
    /// [`arg_clock`](Self::arg_clock)): one per claim.
    pub(super) clocks: Vec<usize>,
}

impl<'a> Call<'a> {
    /// The call with the library use `functions` instead of its own: a function call while
    /// they are on, else by `EVALSHA` (Redlock builds a call once and sends it to every node,
    /// each with its own use of the library).
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) fn on<'b>(&self, functions: Option<&'b Functions>) -> Call<'b>
    where
        'a: 'b,
    {
        Call {
            script: self.script,
            name: self.name,
            functions: None,
            fallback: self.fallback,
            keys: self.keys.clone(),
            args: self.args.clone(),
            clocks: self.clocks.clone(),
        }
        .using(functions)
    }

    /// The call's script name, if the script has a coalesced form and the call is sent as a
    /// function (by `EVALSHA` every call goes alone).
    pub(crate) fn coalescible(&self) -> Option<&'static str> {
        let script = self.script?;
        let many = self.fallback
            && self.clocks.len() <= 1
            && self
                .functions
                .is_some_and(|f| f.library.script(script.name, true).is_some());
        many.then_some(script.name)
    }

    /// The call's parts, if it is [`coalescible`](Self::coalescible).
    pub(crate) fn into_parts(self) -> Option<Parts> {
        Some(Parts {
            name: self.coalescible()?,
            clock: self.clocks.first().copied(),
            keys: self.keys,
            args: self.args,
        })
    }

    pub(super) fn using(mut self, functions: Option<&'a Functions>) -> Self {
        self.functions = functions.filter(|f| f.on.load(Ordering::Relaxed));
        self
    }
}

impl Call<'_> {
    /// Adds a key (`KEYS[i]` in the script).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds an argument (`ARGV[i]` in the script).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// Adds this machine's wall clock in µs since 1970 as an argument, read anew each time the
    /// call is sent (a call sent again after a failover carries the clock of then, not of the
    /// first attempt). A clock before 1970 is sent as 0. One per call (a coalesced call has one
    /// per claim).
    pub(crate) fn arg_clock(&mut self) -> &mut Self {
        self.clocks.push(self.args.len());
        self.args.push(b"");
        self
    }

    /// The arguments as this attempt sends them: the clock argument, if any, as `now` (see
    /// [`clock_now`](Self::clock_now)).
    fn sent_args<'s>(&'s self, now: &'s [u8]) -> impl Iterator<Item = &'s [u8]> {
        self.args
            .iter()
            .enumerate()
            .map(move |(i, arg)| if self.clocks.contains(&i) { now } else { arg })
    }

    /// The clock argument of an attempt sent now (empty if the call has none).
    fn clock_now(&self) -> Vec<u8> {
        if self.clocks.is_empty() {
            Vec::new()
        } else {
            wall_clock_us().to_string().into_bytes()
        }
    }

    /// A function call that reports the server's refusal instead of going by `EVALSHA`: how
    /// a backend finds out, when it connects, whether it may use the library.
    pub(crate) fn strict(mut self) -> Self {
        self.fallback = false;
        self
    }

    /// Sends the call over `con`. As a function: a server without the library gets it loaded
    /// and the call sent again; a server that refuses functions now (the library gone and this
    /// user may not load it, or a server without `FCALL` behind the same address) gets the
    /// script by `EVALSHA`, so the call still runs. By `EVALSHA`: the script's text is loaded on
    /// `NOSCRIPT`.
    pub(crate) async fn invoke_async<C, T>(&self, con: &mut C) -> RedisResult<T>
    where
        C: ::redis::aio::ConnectionLike,
        T: FromRedisValue,
    {
        let Some(script) = self.script else {
            return Err(::redis::RedisError::from((
                ::redis::ErrorKind::Client,
                "distlock: no such script in the library",
                self.name.to_owned(),
            )));
        };
        let Some(functions) = self.functions else {
            return Box::pin(self.eval(script, con)).await;
        };
        let mut fcall = ::redis::Cmd::with_capacity(
            3 + self.keys.len() + self.args.len(),
            40 + script.function.len() + self.keys.size() + self.args.size(),
        );
        fcall
            .arg("FCALL")
            .arg(&script.function)
            .arg(self.keys.len());
        for key in self.keys.iter() {
            fcall.arg(key);
        }
        let now = self.clock_now();
        for arg in self.sent_args(&now) {
            fcall.arg(arg);
        }
        // The rare paths (the library not loaded yet, scripts by EVALSHA) are boxed: their
        // futures would make this one, on every lock's path, over twice the size.
        let refused = match fcall.query_async(con).await {
            Err(e) if says(&e, "function not found") => {
                match Box::pin(functions.library.load(con)).await {
                    Ok(()) => return fcall.query_async(con).await,
                    Err(e) if answered(&e) => e,
                    Err(e) => return Err(e),
                }
            }
            Err(e) if says(&e, "unknown command") || (says(&e, "noperm") && says(&e, "fcall")) => e,
            reply => return reply,
        };
        if !self.fallback {
            return Err(refused);
        }
        if functions.on.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                error = %refused,
                "redis: the server refuses distlock's function library now; scripts go by EVALSHA"
            );
        }
        Box::pin(self.eval(script, con)).await
    }

    /// Sends the call by `EVALSHA` (the text on `NOSCRIPT`).
    async fn eval<C, T>(&self, script: &Script, con: &mut C) -> RedisResult<T>
    where
        C: ::redis::aio::ConnectionLike,
        T: FromRedisValue,
    {
        let mut inv = script.lua.prepare_invoke();
        for key in self.keys.iter() {
            inv.key(key);
        }
        let now = self.clock_now();
        for arg in self.sent_args(&now) {
            inv.arg(arg);
        }
        inv.invoke_async(con).await
    }
}

/// This machine's wall clock in µs since 1970; 0 before then.
pub(crate) fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Whether the server answered (with an error), rather than the connection failing.
fn answered(e: &::redis::RedisError) -> bool {
    !super::commands::unreachable(e)
}

/// Whether the server's error says `what` (compared in lowercase).
pub(super) fn says(e: &::redis::RedisError, what: &str) -> bool {
    e.to_string().to_ascii_lowercase().contains(what)
}
