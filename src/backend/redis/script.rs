//! The Lua scripts the Redis backends run, as one library (how one call of them reaches the
//! server: `call.rs`).
//!
//! Each backend's scripts (one set per topology, and Redlock's) are one function library: where
//! the server keeps functions (Redis 7 and later) it is loaded once and its scripts are called
//! by `FCALL`, so the helpers are compiled once, when the library loads, and a call runs only
//! its own body. A library is named after a hash of its text, so two versions of distlock on
//! one server each keep their own and never replace each other's. A server that lost the
//! library (restarted without persistence, flushed) answers "function not found": the call
//! loads it again and is sent once more. A server without functions, or one that refuses them
//! (this user may not load the lost library), gets each script by `EVALSHA` (the text once per
//! server, on `NOSCRIPT`): Redis then runs the whole text at every call, every helper
//! definition included.
//!
//! A call names its script by the type of its arguments (see [`Args`]), never by position.

use std::sync::atomic::{AtomicBool, Ordering};

use ::redis::RedisResult;

use super::call::{says, Call, Parts};
use super::strings::Strings;

/// A script's `KEYS` and `ARGV` as a struct whose fields a call site fills by name; one struct
/// per script, beside its `.lua` file (`scripts/mod.rs`). The struct names its script, and
/// pushes its fields in the order the script reads them: no call site writes a position.
pub(crate) trait Args {
    /// The script these arguments are for: its name in its library (how a call finds it),
    /// its body and the helpers it needs.
    const SCRIPT: Part;

    /// Adds the keys and arguments to `call`, in the script's order.
    fn push(&self, call: &mut Call<'_>);
}

/// A script of a [`Library`]: its text for `EVALSHA`, and its function's name.
pub(crate) struct Script {
    /// Its name in the library (its [`Part`]'s).
    pub(super) name: &'static str,
    /// The script's coalesced form (`<name>_many`).
    pub(super) many: bool,
    /// How many of a claim's last arguments a coalesced call sends once (its [`Part`]'s).
    pub(super) shared: usize,
    /// What a coalesced call sends of each claim's keys and own arguments (its [`Part`]'s).
    pub(super) widen: Option<Widen>,
    pub(super) lua: ::redis::Script,
    pub(super) function: String,
}

impl Script {
    /// How many of its `keys` keys and `own` own arguments each claim sends in a coalesced
    /// call of this script: all, unless the form [widens](Part::widen).
    fn sends(&self, keys: usize, own: usize) -> (usize, usize) {
        self.widen
            .map_or((keys, own), |w| (w.keys.min(keys), w.args.min(own)))
    }
}

/// One script of a [`Library`]: its function's name (after the library's), the helpers it
/// needs beyond the library's prelude, and its body.
pub(crate) struct Part {
    pub(crate) name: &'static str,
    /// The script writes nothing: its function may run on a replica too.
    pub(crate) read_only: bool,
    /// The script may add state (a grant, a queue entry): while the server is out of memory
    /// its call is refused as a whole. The others (releases, renewals, inspection) run then too
    /// (`allow-oom`), as they would by `EVALSHA`, where a script is refused only at a command
    /// that may grow memory: a holder can still renew and release on a full server.
    pub(crate) grows: bool,
    pub(crate) helpers: &'static [&'static str],
    pub(crate) body: &'static str,
    /// The library also holds the script's coalesced form, `<name>_many`: many claims' calls
    /// in one (see `coalesce.rs`).
    pub(crate) many: bool,
    /// The name of a prelude function the coalesced form tries first for each claim (see
    /// `scripts/many.lua`), or empty.
    pub(crate) quick: &'static str,
    /// How many of each claim's last arguments are the same for every claim of one client (a
    /// setting, the clock): a coalesced call sends them once, after every claim's own.
    pub(crate) shared: usize,
    /// The coalesced form sends only the first of each claim's keys and own arguments, and
    /// rebuilds the others on the server (see [`Widen`]); `None`: it sends them all.
    pub(crate) widen: Option<Widen>,
}

/// A coalesced form that sends each claim's first `keys` keys and first `args` own arguments
/// only: the prelude's Lua function `name(k, a)` rebuilds the rest in place from them before
/// the body runs (the other names are the lock's with a suffix). Each string a call carries
/// costs the server a parse and a Lua string; a busy client's releases carry two where they
/// carried six.
#[derive(Clone, Copy)]
pub(crate) struct Widen {
    pub(crate) name: &'static str,
    pub(crate) keys: usize,
    pub(crate) args: usize,
}

/// What a coalesced script (`<name>_many`) runs: the script's body once per claim (see
/// `scripts/many.lua`).
const MANY_LUA: &str = include_str!("scripts/many.lua");

/// The name of `name`'s coalesced form in its library.
pub(crate) fn many_name(name: &str) -> String {
    format!("{name}_many")
}

impl Part {
    /// The quick and widening functions as `many`'s last arguments (`, <quick>, <widen>`,
    /// `nil` for one the part has not), or nothing.
    fn many_args(&self) -> String {
        match (self.quick, self.widen) {
            ("", None) => String::new(),
            (quick, None) => format!(", {quick}"),
            ("", Some(widen)) => format!(", nil, {}", widen.name),
            (quick, Some(widen)) => format!(", {quick}, {}", widen.name),
        }
    }

    /// The function's flags, as a Lua list's items.
    fn flags(&self) -> String {
        let mut flags = Vec::new();
        if self.read_only {
            flags.push("'no-writes'");
        }
        if !self.grows {
            flags.push("'allow-oom'");
        }
        flags.join(", ")
    }
}

/// Scripts sharing one prelude of helpers, loaded as a Redis function library.
pub(crate) struct Library {
    /// The `FUNCTION LOAD` payload.
    code: String,
    /// The library's name (`distlock_<hash>`), which starts every function's name.
    name: String,
    scripts: Vec<Script>,
}

impl Library {
    /// The library of `scripts` after `prelude` (helpers and settings every script shares).
    /// Each script's body runs as its own function, as it would run by `EVALSHA` after the
    /// prelude and its own `helpers` (it reads `KEYS` and `ARGV`); the library holds each of
    /// them once. The prelude and helpers run once, at load: the hook `fresh` the prelude
    /// defines is called at the start of every function, to reset what a script keeps for one
    /// call. The library's name is a hash of its text.
    pub(crate) fn build(prelude: &str, scripts: &[Part]) -> Self {
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
                    let mut f = format!(
                        "local function run_{name}(KEYS, ARGV)\nfresh()\n{body}\nend\nredis.register_function{{function_name='{prefix}{name}', callback=run_{name}, flags={{{flags}}}}}\n",
                        name = s.name,
                        body = s.body,
                        flags = s.flags()
                    );
                    if s.many {
                        f.push_str(&format!(
                            "redis.register_function{{function_name='{prefix}{many}', callback=function(KEYS, ARGV) return many(run_{name}, KEYS, ARGV{args}) end, flags={{{flags}}}}}\n",
                            many = many_name(s.name),
                            name = s.name,
                            args = s.many_args(),
                            flags = s.flags()
                        ));
                    }
                    f
                })
                .collect()
        };
        let helpers = format!("{prelude}\n{}\n{MANY_LUA}\n", helpers.join("\n"));
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
        let mut all = Vec::new();
        for s in scripts {
            let helpers = s.helpers.join("\n");
            all.push(Script {
                name: s.name,
                many: false,
                shared: 0,
                widen: None,
                lua: ::redis::Script::new(&format!("{prelude}\n{helpers}\n{}", s.body)),
                function: format!("{name}_{}", s.name),
            });
            if s.many {
                // By `EVALSHA`: the same loop around the body, each claim starting afresh.
                all.push(Script {
                    name: s.name,
                    many: true,
                    shared: s.shared,
                    widen: s.widen,
                    lua: ::redis::Script::new(&format!(
                        "{prelude}\n{helpers}\n{MANY_LUA}\nlocal function run(KEYS, ARGV)\nfresh()\n{}\nend\nreturn many(run, KEYS, ARGV{})",
                        s.body,
                        s.many_args()
                    )),
                    function: format!("{name}_{}", many_name(s.name)),
                });
            }
        }
        Self {
            code,
            name,
            scripts: all,
        }
    }

    /// A call of the script `args` are for, with them: a function of this library while
    /// `functions` (this library's use on the server) are on, else by `EVALSHA`.
    pub(crate) fn call<'a, A: Args>(
        &'a self,
        functions: Option<&'a Functions>,
        args: &A,
    ) -> Call<'a> {
        let mut call = Call {
            script: self.script(A::SCRIPT.name, false),
            name: A::SCRIPT.name,
            functions: None,
            fallback: true,
            // Room for a release's keys and arguments, the most a lock's calls carry.
            keys: Strings::with_capacity(5, 160),
            args: Strings::with_capacity(8, 160),
            clocks: Vec::new(),
        };
        args.push(&mut call);
        call.using(functions)
    }

    pub(super) fn script(&self, name: &str, many: bool) -> Option<&Script> {
        self.scripts
            .iter()
            .find(|s| s.name == name && s.many == many)
    }

    /// One call of the coalesced form of the script every one of `claims` calls (see
    /// `MANY_LUA`): their keys in turn; then the count of keys and of own arguments each claim
    /// has, of the shared arguments, and of claims; their own arguments in turn; then the
    /// shared ones, once (the script's [`shared`](Part::shared) last arguments, the same for
    /// every claim). A form that [widens](Part::widen) sends only the first of each claim's
    /// keys and own arguments, and counts only those. `None` unless all call one script with a
    /// coalesced form, with as many keys and arguments each, and the same shared arguments.
    pub(crate) fn call_many<'a>(
        &'a self,
        functions: Option<&'a Functions>,
        claims: &[&Parts],
    ) -> Option<Call<'a>> {
        let (script, own) = self.many_of(claims)?;
        let first = claims.first()?;
        let shared = first.args.len() - own;
        let (nk, sent) = script.sends(first.keys.len(), own);
        let first_tail = first.args.iter().skip(own);
        let mut call = Call {
            script: Some(script),
            name: first.name,
            functions: None,
            fallback: true,
            keys: Strings::with_capacity(
                nk * claims.len(),
                claims.iter().map(|c| c.keys.size()).sum(),
            ),
            args: Strings::with_capacity(
                4 + sent * claims.len() + shared,
                40 + claims.iter().map(|c| c.args.size()).sum::<usize>(),
            ),
            clocks: Vec::new(),
        };
        call.arg(nk).arg(sent).arg(shared).arg(claims.len());
        for claim in claims {
            if nk == claim.keys.len() {
                call.keys.extend(&claim.keys);
            } else {
                for key in claim.keys.iter().take(nk) {
                    call.keys.push(key);
                }
            }
            if let Some(i) = claim.clock.filter(|i| *i < sent) {
                call.clocks.push(call.args.len() + i);
            }
            for arg in claim.args.iter().take(sent) {
                call.args.push(arg);
            }
        }
        if let Some(i) = first.clock.filter(|i| *i >= own) {
            call.clocks.push(call.args.len() + i - own);
        }
        for arg in first_tail {
            call.args.push(arg);
        }
        Some(call.using(functions))
    }

    /// Whether `claims` can go as one call of a coalesced form (see
    /// [`call_many`](Self::call_many)): its script, and how many of each claim's arguments are
    /// its own.
    pub(crate) fn many_of(&self, claims: &[&Parts]) -> Option<(&Script, usize)> {
        let first = claims.first()?;
        let (nk, na) = (first.keys.len(), first.args.len());
        let script = self.script(first.name, true)?;
        let own = na - script.shared.min(na);
        // A clock among the own arguments a widened form leaves out would not be read anew.
        let (_, sent) = script.sends(nk, own);
        let fits = claims.iter().all(|c| {
            c.name == first.name
                && c.keys.len() == nk
                && c.args.len() == na
                && !c.clock.is_some_and(|i| (sent..own).contains(&i))
                && c.args.tail_eq(&first.args, own)
        });
        fits.then_some((script, own))
    }

    /// Loads the library on the server behind `con` (on a Cluster connection: on every
    /// primary). One already there is kept: a library's name is a hash of its text, so it is
    /// this very code, and the server declines without compiling it again (many clients that
    /// find it gone at once, after a restart, cost one compilation).
    pub(super) async fn load<C: ::redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
    ) -> RedisResult<()> {
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
    pub(super) library: &'static Library,
    pub(super) on: AtomicBool,
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

#[cfg(test)]
mod tests {
    use super::{Args, Call, Library, Part};

    const ONE: Part = Part {
        name: "one",
        read_only: false,
        grows: true,
        helpers: &[],
        body: "return 1",
        many: false,
        quick: "",
        shared: 0,
        widen: None,
    };

    /// The arguments of `ONE`, in its order: a key, then a number and a word.
    struct One {
        key: &'static str,
        n: u32,
        word: &'static str,
    }

    impl Args for One {
        const SCRIPT: Part = ONE;

        fn push(&self, call: &mut Call<'_>) {
            call.key(self.key).arg(self.n).arg(self.word);
        }
    }

    /// Arguments of a script no library here holds.
    struct Other;

    impl Args for Other {
        const SCRIPT: Part = Part {
            name: "other",
            ..ONE
        };

        fn push(&self, _call: &mut Call<'_>) {}
    }

    #[test]
    fn a_library_names_its_functions_after_a_hash_of_its_text() {
        let a = Library::build("local function fresh() end", &[ONE]);
        let b = Library::build(
            "local function fresh() end",
            &[Part {
                body: "return 2",
                ..ONE
            }],
        );
        assert_ne!(a.name, b.name);
        assert!(a.name.starts_with("distlock_"));
        assert!(a
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_'));
        assert_eq!(a.scripts[0].function, format!("{}_one", a.name));
        assert!(a.code.starts_with(&format!("#!lua name={}\n", a.name)));
    }

    #[test]
    fn a_call_finds_its_script_by_name_and_pushes_its_fields_in_order() {
        let library = Library::build("local function fresh() end", &[ONE]);
        let call = library.call(
            None,
            &One {
                key: "k",
                n: 7,
                word: "w",
            },
        );
        assert_eq!(call.script.map(|s| s.name), Some("one"));
        assert_eq!(call.keys.to_vecs(), vec![b"k".to_vec()]);
        assert_eq!(call.args.to_vecs(), vec![b"7".to_vec(), b"w".to_vec()]);
        assert!(library.call(None, &Other).script.is_none());
    }

    /// `ONE` with a clock argument after its own.
    struct Clocked;

    impl Args for Clocked {
        const SCRIPT: Part = Part { many: true, ..ONE };

        fn push(&self, call: &mut Call<'_>) {
            call.key("k").arg(7).arg_clock();
        }
    }

    /// `ONE` with its own argument, then a setting and the clock every claim shares.
    struct Sharing(&'static str, u32);

    impl Args for Sharing {
        const SCRIPT: Part = Part {
            many: true,
            shared: 2,
            ..ONE
        };

        fn push(&self, call: &mut Call<'_>) {
            call.key(self.0).arg(self.0).arg(self.1).arg_clock();
        }
    }

    /// Asserts `call` is claims `a` and `b` of one key and one own argument each, then the
    /// shared `9` and the clock: nk 1, own 1, shared 2, claims 2.
    fn sends_a_then_b(call: &Call<'_>) {
        assert_eq!(call.keys.to_vecs(), vec![b"a".to_vec(), b"b".to_vec()]);
        let args: Vec<&[u8]> = vec![b"1", b"1", b"2", b"2", b"a", b"b", b"9", b""];
        assert_eq!(call.args.to_vecs(), args);
        assert_eq!(call.clocks, vec![7]);
    }

    #[test]
    fn a_coalesced_call_sends_the_shared_arguments_once_and_only_when_they_agree() {
        let library = Box::leak(Box::new(Library::build(
            "local function fresh() end",
            &[Sharing::SCRIPT],
        )));
        let functions = super::Functions::new(library);
        let functions = Some(&functions);
        let parts = |s: Sharing| library.call(functions, &s).into_parts().unwrap();
        let (a, b) = (parts(Sharing("a", 9)), parts(Sharing("b", 9)));
        // nk, own, shared, claims; the own arguments in turn; the shared ones once.
        sends_a_then_b(&library.call_many(functions, &[&a, &b]).unwrap());
        // A claim with another setting does not go with them.
        let c = parts(Sharing("c", 8));
        assert!(library.call_many(functions, &[&a, &c]).is_none());
    }

    /// `Sharing` whose coalesced form sends each claim's key and first own argument only.
    struct Widened(&'static str);

    impl Args for Widened {
        const SCRIPT: Part = Part {
            widen: Some(super::Widen {
                name: "widen",
                keys: 1,
                args: 1,
            }),
            ..Sharing::SCRIPT
        };

        fn push(&self, call: &mut Call<'_>) {
            call.key(self.0)
                .key("other")
                .arg(self.0)
                .arg("derived")
                .arg(9)
                .arg_clock();
        }
    }

    #[test]
    fn a_widened_coalesced_call_sends_each_claims_first_key_and_argument_and_names_its_widener() {
        let library = Box::leak(Box::new(Library::build(
            "local function fresh() end\nlocal function widen(k, a) end",
            &[Widened::SCRIPT],
        )));
        assert!(library.code.contains("ARGV, nil, widen)"));
        let functions = super::Functions::new(library);
        let functions = Some(&functions);
        let parts = |s: Widened| library.call(functions, &s).into_parts().unwrap();
        let (a, b) = (parts(Widened("a")), parts(Widened("b")));
        // nk 1, own 1 (of 2), shared 2, claims; each claim's first own argument; the shared.
        sends_a_then_b(&library.call_many(functions, &[&a, &b]).unwrap());
    }

    #[test]
    fn a_coalesced_call_lays_out_its_claims_in_turn_after_their_counts() {
        let library = Library::build("local function fresh() end", &[Clocked::SCRIPT]);
        assert!(library.code.contains(&format!("{}_one_many", library.name)));
        let functions = super::Functions::new(Box::leak(Box::new(Library::build(
            "local function fresh() end",
            &[Clocked::SCRIPT],
        ))));
        let functions = Some(&functions);
        let one = library.call(functions, &Clocked).into_parts().unwrap();
        let two = library.call(functions, &Clocked).into_parts().unwrap();
        let call = library.call_many(functions, &[&one, &two]).unwrap();
        assert!(call.script.is_some_and(|s| s.many));
        assert_eq!(call.keys.to_vecs(), vec![b"k".to_vec(), b"k".to_vec()]);
        assert_eq!(
            &call.args.to_vecs()[..6],
            &[
                b"1".to_vec(),
                b"2".to_vec(),
                b"0".to_vec(),
                b"2".to_vec(),
                b"7".to_vec(),
                vec![]
            ]
        );
        assert_eq!(call.clocks, vec![5, 7]);
        // By EVALSHA every call goes alone.
        assert!(library.call(None, &Clocked).into_parts().is_none());
    }
}
