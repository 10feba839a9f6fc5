//! The process run: start the servers and holders, inject faults one at a time, then judge the
//! calm that follows.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checker::{
    granted_since, judge, liveness, resource_log, Counts, MAX_COMMANDS_PER_GRANT,
};
use crate::fleet::Fleet;
use crate::servers::Server;
use crate::{support, ttl, wall_ns, Args, Rng, HOLDERS};

/// How long the connections of a holder started during a restart's outage wait for the server.
const PATIENCE: Duration = Duration::from_secs(10);

pub(crate) fn run_processes(args: &Args) -> (Counts, Vec<String>) {
    let mut server = Server::start(&args.backend);
    let resource = support::RedisServer::start();
    let ns = format!("chaos{}", std::process::id());
    let mut fleet = Fleet {
        backend: args.backend.clone(),
        primitive: args.primitive.clone(),
        trace: args.trace,
        exe: std::env::current_exe().expect("own path"),
        resource_url: resource.url(),
        ns: ns.clone(),
        holders: (0..HOLDERS).map(|_| None).collect(),
        proxies: (0..HOLDERS)
            .map(|i| {
                server
                    .holder_ports(i)
                    .into_iter()
                    .map(support::proxy::Proxy::start)
                    .collect()
            })
            .collect(),
        direct_url: server.direct_url(args.direct),
        log: Arc::default(),
        spawned: 0,
    };
    for i in 0..HOLDERS {
        fleet.spawn(i);
    }
    let mut counts = Counts::default();
    let kinds = fault_kinds(&args.backend);
    let minority = &mut 0u64;
    counts.faults = inject_faults_as(args, &kinds, |kind, i| {
        match kind {
            "stop" => {
                let from = wall_ns();
                fleet.signal(i, nix::sys::signal::Signal::SIGSTOP);
                std::thread::sleep(ttl() + Duration::from_millis(500));
                fleet.signal(i, nix::sys::signal::Signal::SIGCONT);
                let to = wall_ns();
                fleet
                    .log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .stops
                    .push((i, from, to));
            }
            "stopq" => crate::waiters::stop_waiter(&fleet, i),
            // Two or three queued waiters in a row.
            "killq" => {
                crate::waiters::kill_waiters(&mut fleet, 2 + i % 2, &args.backend, &args.primitive)
            }
            "kill" => {
                fleet
                    .log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .killed(i);
                fleet.kill(i);
                fleet.spawn(i);
            }
            "kill2" => {
                // Two in a row: with one holder at a time, at least one was a queued waiter,
                // and often both (two dead waiters in a row).
                let j = (i + 1) % HOLDERS;
                let mut log = fleet.log.lock().unwrap_or_else(|p| p.into_inner());
                log.killed(i);
                log.killed(j);
                drop(log);
                fleet.kill(i);
                fleet.kill(j);
                fleet.spawn(i);
                fleet.spawn(j);
            }
            "restart" => {
                // With a hold in progress that outlasts the outage (its lease extended past
                // it). A Redis server comes back after 3 s (long enough for clients' reconnect
                // back-off to grow), by turns without its data and from a snapshot taken
                // half a second before the crash, whose fencing counter is behind the grants
                // since (the holders are warm: each has taken and released locks before).
                // A queued waiter's process goes down with the server and starts again as it
                // returns (a worker restarted alongside it, a new replica): a fresh client
                // that asks at once, where the other waiters' pub/sub reconnects on its own
                // back-off. A server that forgot its locks grants it at once, so the old
                // holder must be told it lost the lock by then.
                let forgets = args.backend == "redis";
                if forgets {
                    let restarts = fleet
                        .log
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .restarts
                        .len();
                    let stale = restarts % 2 == 1;
                    server.snapshot_before_restart(stale);
                    if stale {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
                let held = crate::waiters::extend_hold(&mut fleet);
                let outage = Duration::from_millis(if forgets { 3000 } else { 100 });
                let restarted = if args.strict_restart {
                    crate::waiters::kill_queued_but(&mut fleet, held)
                } else {
                    None
                };
                let down = wall_ns();
                if let (true, Some(r)) = (forgets, restarted) {
                    // It starts during the outage, its connections waiting in its proxy as a
                    // refused connect retried would, so it asks the moment the server is back.
                    let early = Duration::from_millis(500);
                    server.restart_with(|| {
                        std::thread::sleep(outage - early);
                        fleet.proxies[r]
                            .iter()
                            .for_each(|p| p.set_patience(PATIENCE));
                        fleet.spawn(r);
                        std::thread::sleep(early);
                    });
                    fleet.proxies[r]
                        .iter()
                        .for_each(|p| p.set_patience(Duration::ZERO));
                } else {
                    server.restart(outage);
                    if let Some(r) = restarted {
                        fleet.spawn(r);
                    }
                }
                let back = wall_ns();
                if forgets {
                    let mut log = fleet.log.lock().unwrap_or_else(|p| p.into_inner());
                    log.restarts.push((down, back));
                }
            }
            "minority" => {
                let killed = minority.is_multiple_of(2);
                *minority += 1;
                server.minority_down(i, killed);
            }
            "blackhole" => {
                fleet.proxies[i].iter().for_each(|p| p.blackhole());
                std::thread::sleep(ttl() + Duration::from_millis(500));
                fleet.proxies[i].iter().for_each(|p| p.heal());
            }
            "expire" => {
                fleet.proxies[i].iter().for_each(|p| p.blackhole());
                std::thread::sleep(ttl() * 2 + Duration::from_millis(500));
                fleet.proxies[i].iter().for_each(|p| p.heal());
            }
            "node" => {
                // Node `i` silent for every holder past the lease: a majority still answers.
                fleet.proxies.iter().for_each(|p| p[i].blackhole());
                std::thread::sleep(ttl() + Duration::from_millis(500));
                fleet.proxies.iter().for_each(|p| p[i].heal());
            }
            "reset" => {
                fleet.proxies[i].iter().for_each(|p| p.cut());
                std::thread::sleep(Duration::from_millis(50));
                fleet.proxies[i].iter().for_each(|p| p.pass());
            }
            topology => return topology_fault(&mut server, topology, i, &fleet),
        }
        kind
    });
    // Faults stop: every holder must get the lock within a judged bound, with no TTL-long
    // stall, and the lock server's command rate must stay that of a lock, not of waiters
    // polling.
    let calm = Instant::now();
    let commands_before = server.commands(&args.backend);
    std::thread::sleep(ttl() * 3);
    let commands = server
        .commands(&args.backend)
        .zip(commands_before)
        .map(|(after, before)| after.saturating_sub(before));
    let (figures, mut problems) = liveness(
        &fleet.log.lock().unwrap_or_else(|p| p.into_inner()),
        &args.backend,
        calm,
        Instant::now(),
    );
    counts.liveness = figures;
    if let Some(commands) = commands {
        let grants = granted_since(&fleet.log.lock().unwrap_or_else(|p| p.into_inner()), calm);
        let per_grant = commands / grants.max(1);
        // Redlock's grant runs on every node: the bound is per lock server.
        let servers = match &server {
            Server::Redlock(nodes, _) => nodes.len().max(1) as u64,
            _ => 1,
        };
        let per_server = per_grant / servers;
        println!(
            "chaos calm: {grants} grants, {commands} server commands ({per_grant} a grant, \
             {per_server} per server)"
        );
        if per_server > MAX_COMMANDS_PER_GRANT {
            problems.push(format!(
                "{commands} server commands for {grants} grants after the faults stopped: someone polls"
            ));
        }
    }
    fleet.stop_all();
    // Locks and queue entries of holders that stopped cleanly are gone; those of killed ones
    // go with their lease (Redis, PostgreSQL) or session (ZooKeeper).
    std::thread::sleep(ttl() * 2 + Duration::from_millis(500));
    let left = server.leftovers(&args.backend, &ns);
    if !left.is_empty() {
        problems.push(format!("left behind: {left:?}"));
    }
    let log = std::mem::take(&mut *fleet.log.lock().unwrap_or_else(|p| p.into_inner()));
    problems.extend(log.problems.iter().cloned());
    let keys = crate::holder::keys_of(&args.primitive);
    let capacity = crate::holder::capacity_of(&args.primitive);
    print_restarts(&log);
    judge(
        &log,
        &resource_log(&resource.url(), &keys),
        capacity,
        args.backend == "redlock",
        args.strict_restart,
        &mut counts,
    );
    counts.faults.insert("spawned", fleet.spawned);
    (counts, problems)
}

/// Injects faults for `args.secs`, one at a time, a random pause apart, every kind in turn in
/// a random order, each on a random holder (`apply(kind, holder)` does it, and returns when
/// it is over). Returns how many of each kind.
pub(crate) fn inject_faults(
    args: &Args,
    kinds: &[&'static str],
    mut apply: impl FnMut(&'static str, usize),
) -> HashMap<&'static str, u64> {
    inject_faults_as(args, kinds, |kind, i| {
        apply(kind, i);
        kind
    })
}

/// [`inject_faults`], where `apply` returns the kind it did: a topology may do another where
/// one cannot be done (Cluster kills a primary for good once). Counts the kinds done.
fn inject_faults_as(
    args: &Args,
    kinds: &[&'static str],
    mut apply: impl FnMut(&'static str, usize) -> &'static str,
) -> HashMap<&'static str, u64> {
    let mut rng = Rng(args.seed);
    let mut done: HashMap<&'static str, u64> = HashMap::new();
    let mut deck: Vec<&'static str> = Vec::new();
    let end = Instant::now() + Duration::from_secs(args.secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(300 + rng.below(900)));
        if deck.is_empty() {
            deck = kinds.to_vec();
        }
        let kind = deck.swap_remove(rng.below(deck.len() as u64) as usize);
        let i = rng.below(HOLDERS as u64) as usize;
        let began = Instant::now();
        let did = apply(kind, i);
        if std::env::var_os("CHAOS_DEBUG").is_some() {
            eprintln!("fault {did} on {i}: {:?}", began.elapsed());
        }
        *done.entry(did).or_default() += 1;
    }
    done
}

/// The fault kinds of a backend: the holder faults its holders can take (connection faults
/// only through proxies: not on Sentinel or Cluster), and the server's own.
fn fault_kinds(backend: &str) -> Vec<&'static str> {
    // The first backends' order as it was, so their seeds replay the same runs.
    let mut kinds = vec!["stop", "kill", "kill2"];
    if matches!(
        backend,
        "redis" | "zookeeper" | "postgres" | "redlock" | "postgres-pgbouncer"
    ) {
        kinds.push("restart");
    }
    if !matches!(backend, "redis-sentinel" | "redis-cluster") {
        kinds.extend(["blackhole", "reset"]);
    }
    // Faults on queued waiters: SIGSTOP one, SIGKILL two or three in a row.
    kinds.extend(["stopq", "killq"]);
    kinds.extend(match backend {
        "zookeeper" => &["expire"][..],
        "redlock" => &["node", "minority"],
        "redis-sentinel" => &["pause-primary", "kill-primary"],
        "redis-cluster" => &["failover", "kill-primary"],
        "zookeeper-ensemble" => &["expire", "partition", "isolate", "kill-leader"],
        "postgres-pgbouncer" => &["restart-bouncer"],
        _ => &[],
    });
    kinds
}

/// A topology's own fault; returns the kind done.
fn topology_fault(
    server: &mut Server,
    kind: &'static str,
    i: usize,
    fleet: &Fleet,
) -> &'static str {
    match (server, kind) {
        (Server::Sentinel(s), "pause-primary") => s.pause_primary(fleet),
        (Server::Sentinel(s), "kill-primary") => s.kill_primary(fleet),
        (Server::Cluster(c), "kill-primary") => {
            // Once a run, after two failovers of its shard; otherwise a failover.
            if !c.kill_primary_for_good(fleet) {
                c.failover();
                return "failover";
            }
        }
        (Server::Cluster(c), "failover") => c.failover(),
        (Server::Ensemble(e), "partition") => e.partition_clients(fleet, i),
        (Server::Ensemble(e), "isolate") => e.isolate_follower(i),
        (Server::Ensemble(e), "kill-leader") => e.kill_leader(),
        (Server::Bouncer(b), "restart-bouncer") => b.restart_bouncer(),
        (_, other) => panic!("no fault {other} on this backend"),
    }
    kind
}

/// One line per restart of a server that forgot its locks: when it was back, the first grant
/// after that, and when the holds from before it stopped being believed (ms from its return).
fn print_restarts(log: &crate::checker::Log) {
    let ms = |t: u128, back: u128| (t as f64 - back as f64) / 1e6;
    for &(down, back) in &log.restarts {
        let first = log
            .intervals()
            .filter(|i| i.start_ns >= back)
            .min_by_key(|i| i.start_ns);
        let old: Vec<String> = log
            .intervals()
            .filter(|i| i.start_ns < down && i.end_ns >= down)
            .map(|i| format!("holder {} until {:+.1} ms", i.holder, ms(i.end_ns, back)))
            .collect();
        println!(
            "chaos restart: down {:.0} ms, back; first grant after {}; held from before: {}",
            ms(back, down),
            first.map_or("none".into(), |i| format!(
                "{:+.1} ms (holder {})",
                ms(i.start_ns, back),
                i.holder
            )),
            if old.is_empty() {
                "none".into()
            } else {
                old.join(", ")
            }
        );
    }
}
