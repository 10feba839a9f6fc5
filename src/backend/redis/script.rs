//! The Lua scripts the Redis backends run, and how one call of them reaches the server.
//!
//! A script is sent by `EVALSHA` (the text once per server, on `NOSCRIPT`): Redis then runs the
//! whole text at every call, every helper definition included. Where the server keeps
//! functions (Redis 7 and later), the single-node and Cluster backends load their scripts as
//! one function library instead and call them by `FCALL`: the helpers are compiled once, when
//! the library loads, and a call runs only its own body. A library is named after a hash of its
//! text, so two versions of distlock on one server each keep their own and never replace each
//! other's. A server that lost the library (restarted without persistence, flushed) answers
//! "function not found": the call loads it again and is sent once more. A server that refuses
//! functions later on (this user may not load the lost library) gets the call by `EVALSHA`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ::redis::{FromRedisValue, RedisResult, ToRedisArgs};

/// A script: its text for `EVALSHA`, and its function's name when it is part of a
/// [`Library`].
pub(crate) struct Script {
    lua: ::redis::Script,
    function: Option<String>,
}

impl Script {
    /// A script run by `EVALSHA` only.
    #[cfg(feature = "redlock")]
    pub(crate) fn new(text: &str) -> Self {
        Self {
            lua: ::redis::Script::new(text),
            function: None,
        }
    }

    /// A call of this script by `EVALSHA`; keys and arguments are added to it.
    pub(crate) fn prepare_invoke(&self) -> Call<'_> {
        Call {
            script: self,
            functions: None,
            fallback: true,
            keys: Vec::new(),
            args: Vec::new(),
            clock: None,
        }
    }

    /// A call of this script as a function of the library `functions` use, while they are
    /// on, else by `EVALSHA`.
    pub(crate) fn call<'a>(&'a self, functions: Option<&'a Functions>) -> Call<'a> {
        let mut call = self.prepare_invoke();
        call.functions = functions.filter(|f| f.on.load(Ordering::Relaxed));
        call
    }
}

/// One script of a [`Library`]: its function's name (after the library's), the helpers it
/// needs beyond the library's prelude, and its body.
pub(crate) struct Part<'a> {
    pub(crate) name: &'a str,
    /// The script writes nothing: its function may run on a replica too.
    pub(crate) read_only: bool,
    pub(crate) helpers: &'a [&'a str],
    pub(crate) body: &'a str,
}

/// Scripts sharing one prelude of helpers, loaded as a Redis function library.
pub(crate) struct Library {
    /// The `FUNCTION LOAD` payload.
    code: String,
    /// The library's name (`distlock_<hash>`), which starts every function's name.
    name: String,
}

impl Library {
    /// The library of `scripts` after `prelude` (helpers and settings every script shares).
    /// Each script's body runs as its own function, as it would run by `EVALSHA` after the
    /// prelude and its own `helpers` (it reads `KEYS` and `ARGV`); the library holds each of
    /// them once. The prelude and helpers run once, at load: the hook `fresh` the prelude
    /// defines is called at the start of every function, to reset what a script keeps for one
    /// call. The library's name is a hash of its text. Returns the library and the scripts,
    /// in the order given.
    pub(crate) fn build<const N: usize>(
        prelude: &str,
        scripts: [Part<'_>; N],
    ) -> (Self, [Script; N]) {
        let mut helpers: Vec<&str> = Vec::new();
        for part in scripts.iter().flat_map(|s| s.helpers) {
            if !helpers.contains(part) {
                helpers.push(part);
            }
        }
        let functions = |prefix: &str| -> String {
            scripts
                .iter()
                .map(|s| {
                    format!(
                        "redis.register_function{{function_name='{prefix}{}', callback=function(KEYS, ARGV)\nfresh()\n{}\nend, flags={{{}}}}}\n",
                        s.name,
                        s.body,
                        if s.read_only { "'no-writes'" } else { "" }
                    )
                })
                .collect()
        };
        let helpers = format!("{prelude}\n{}\n", helpers.join("\n"));
        let hash: String = ::redis::Script::new(&format!("{helpers}{}", functions("")))
            .get_hash()
            .chars()
            .take(16)
            .collect();
        let name = format!("distlock_{hash}");
        let code = format!(
            "#!lua name={name}\n{helpers}{}",
            functions(&format!("{name}_"))
        );
        let scripts = scripts.map(|s| Script {
            lua: ::redis::Script::new(&format!("{prelude}\n{}\n{}", s.helpers.join("\n"), s.body)),
            function: Some(format!("{name}_{}", s.name)),
        });
        (Self { code, name }, scripts)
    }

    /// Loads the library on the server behind `con` (on a Cluster connection: on every
    /// primary). One already there is kept: a library's name is a hash of its text, so it is
    /// this very code, and the server declines without compiling it again (many clients that
    /// find it gone at once, after a restart, cost one compilation).
    async fn load<C: ::redis::aio::ConnectionLike>(&self, con: &mut C) -> RedisResult<()> {
        match ::redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(&self.code)
            .query_async::<::redis::Value>(con)
            .await
        {
            Err(e) if says(&e, "already exists") => Ok(()),
            reply => reply.map(drop),
        }
    }
}

/// A backend's use of a [`Library`] on its server: on from connect, switched off for good the
/// first time the server refuses a function call (see [`Call::invoke_async`]), so later calls
/// go straight by `EVALSHA` instead of asking for the function first each time.
pub(crate) struct Functions {
    library: &'static Library,
    on: AtomicBool,
}

impl Functions {
    pub(crate) fn new(library: &'static Library) -> Self {
        Self {
            library,
            on: AtomicBool::new(true),
        }
    }

    /// The library's name, while the backend calls it.
    pub(crate) fn name(&self) -> Option<&str> {
        self.on
            .load(Ordering::Relaxed)
            .then_some(self.library.name.as_str())
    }
}

/// One call of a [`Script`] with its keys and arguments, as a function (`FCALL`) or by
/// `EVALSHA`.
pub(crate) struct Call<'a> {
    script: &'a Script,
    /// Called as a function of the library these use.
    functions: Option<&'a Functions>,
    /// A function call the server refuses goes by `EVALSHA` instead (see
    /// [`invoke_async`](Self::invoke_async)).
    fallback: bool,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
    /// The index in `args` that is this machine's clock, read as each attempt is sent (see
    /// [`arg_clock`](Self::arg_clock)).
    clock: Option<usize>,
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
    /// first attempt). A clock before 1970 is sent as 0. One per call.
    pub(crate) fn arg_clock(&mut self) -> &mut Self {
        self.clock = Some(self.args.len());
        self.args.push(Vec::new());
        self
    }

    /// The arguments as this attempt sends them: the clock argument, if any, read now.
    fn sent_args(&self) -> impl Iterator<Item = std::borrow::Cow<'_, [u8]>> {
        let now = self.clock.map(|_| wall_clock_us().to_string().into_bytes());
        self.args
            .iter()
            .enumerate()
            .map(move |(i, arg)| match &now {
                Some(now) if self.clock == Some(i) => std::borrow::Cow::Owned(now.clone()),
                _ => std::borrow::Cow::Borrowed(arg.as_slice()),
            })
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
        let (Some(functions), Some(function)) = (self.functions, &self.script.function) else {
            return self.eval(con).await;
        };
        let mut fcall = ::redis::cmd("FCALL");
        fcall.arg(function).arg(self.keys.len());
        for key in &self.keys {
            fcall.arg(key);
        }
        for arg in self.sent_args() {
            fcall.arg(&*arg);
        }
        let refused = match fcall.query_async(con).await {
            Err(e) if says(&e, "function not found") => match functions.library.load(con).await {
                Ok(()) => return fcall.query_async(con).await,
                Err(e) if answered(&e) => e,
                Err(e) => return Err(e),
            },
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
        self.eval(con).await
    }

    /// Sends the call by `EVALSHA` (the text on `NOSCRIPT`).
    async fn eval<C, T>(&self, con: &mut C) -> RedisResult<T>
    where
        C: ::redis::aio::ConnectionLike,
        T: FromRedisValue,
    {
        let mut inv = self.script.lua.prepare_invoke();
        for key in &self.keys {
            inv.key(key);
        }
        for arg in self.sent_args() {
            inv.arg(&*arg);
        }
        inv.invoke_async(con).await
    }
}

/// This machine's wall clock in µs since 1970; 0 before then.
fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Whether the server answered (with an error), rather than the connection failing.
fn answered(e: &::redis::RedisError) -> bool {
    !super::commands::unreachable(e)
}

/// Whether the server's error says `what` (compared in lowercase).
fn says(e: &::redis::RedisError, what: &str) -> bool {
    e.to_string().to_ascii_lowercase().contains(what)
}

#[cfg(test)]
mod tests {
    use super::{Library, Part};

    #[test]
    fn a_library_names_its_functions_after_a_hash_of_its_text() {
        let one = |body| Part {
            name: "one",
            read_only: false,
            helpers: &[],
            body,
        };
        let (a, [script]) = Library::build("local function fresh() end", [one("return 1")]);
        let (b, _) = Library::build("local function fresh() end", [one("return 2")]);
        assert_ne!(a.name, b.name);
        assert!(a.name.starts_with("distlock_"));
        assert!(a
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_'));
        assert_eq!(script.function, Some(format!("{}_one", a.name)));
        assert!(a.code.starts_with(&format!("#!lua name={}\n", a.name)));
    }
}
