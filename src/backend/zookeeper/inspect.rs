//! Reading a lock's nodes the way Curator's predicates see them, for `LockClient::inspect`.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::client::{Failure, NodeStat};
use super::recipe::{self, Other, Place};
use super::Inner;
use crate::backend::{Family, LockKind};
use crate::error::Result;
use crate::inspect::{ForceReleased, Holder, Inspection, Waiter};
use crate::sync::LockExt;

impl Inner {
    pub(super) async fn inspect(&self, namespace: &str, key: &str) -> Result<Inspection> {
        self.inspect_nodes(namespace, key)
            .await
            .map(|(seen, ..)| seen)
    }

    /// The operator's unlock: deletes the nodes that carry every holder's grant (a mutex's or
    /// read-write lock's holding nodes, the lease nodes of a semaphore's permit holders).
    /// Their waiters' watches fire; the holders' own checks (renewal) find their nodes gone
    /// and report lost. Each new node's czxid, the next grant's token, is above theirs.
    pub(super) async fn force_release(&self, namespace: &str, key: &str) -> Result<ForceReleased> {
        let (seen, carriers, vanished) = self.inspect_nodes(namespace, key).await?;
        let up = self.hub.until_up(self.hub.now().timeout).await?;
        let mut removed = ForceReleased::nothing(key);
        removed.family = seen.family;
        for (holder, paths) in seen.holders.into_iter().zip(carriers) {
            let mut dropped = false;
            for path in &paths {
                // Released (or expired) meanwhile, or moved (below).
                dropped |= delete(&up, path).await?;
                // A write hold being downgraded moves to a read node of the same sequence,
                // made before the write node goes: drop that too. (A downgrade that finds its
                // write node already gone gives its read node up itself.)
                for read in moved_to(&up, path).await? {
                    dropped |= delete(&up, &read).await?;
                }
            }
            if dropped {
                removed.removed.push(holder);
            }
        }
        // A write node listed and gone before it was read may have been downgraded in
        // between: its hold moved to a read node the listing did not see. Drop that too.
        for path in &vanished {
            for read in moved_to(&up, path).await? {
                if delete(&up, &read).await? {
                    removed.family = Some(Family::RwLock);
                    removed.removed.push(Holder {
                        kind: LockKind::Read,
                        fencing_token: None,
                        lease_left: None,
                    });
                }
            }
        }
        Ok(removed)
    }

    /// What [`inspect`](Self::inspect) reads, for each holder the paths of the nodes that
    /// carry its grant, and the paths of the nodes listed but gone by the time they were read.
    async fn inspect_nodes(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<(Inspection, Vec<Vec<String>>, Vec<String>)> {
        let vanished = std::sync::Mutex::new(Vec::new());
        let up = self.hub.until_up(self.hub.now().timeout).await?;
        let path = format!("/{namespace}/{key}");
        let mut seen = Inspection::free(key);
        let mut carriers: Vec<Vec<String>> = Vec::new();
        let list = |p: String| {
            let zk = up.zk.clone();
            async move {
                match zk.children(&p).await {
                    Ok(kids) => Ok(kids),
                    Err(Failure::NoNode) => Ok(Vec::new()),
                    Err(f) => Err(f.into_error(&format!("list {p}"))),
                }
            }
        };
        // One `exists` per node, all in flight together; each list comes back in lock order.
        let stats = |parent: String, kind: LockKind, names: Vec<String>| {
            let (zk, vanished) = (up.zk.clone(), &vanished);
            async move {
                let found = futures::future::try_join_all(names.into_iter().map(|name| {
                    let (zk, at) = (zk.clone(), format!("{parent}/{name}"));
                    async move {
                        match zk.exists(&at).await {
                            Ok(Some(stat)) => Ok(Some((name, stat))),
                            Ok(None) => {
                                vanished.locked().push(at);
                                Ok(None)
                            }
                            Err(f) => Err(f.into_error(&format!("stat {at}"))),
                        }
                    }
                }))
                .await?;
                // Nodes gone since the listing are left out.
                let mut nodes: Vec<(String, NodeStat)> = found.into_iter().flatten().collect();
                recipe::sort_by_name(kind, &mut nodes, |(name, _)| name.as_str());
                Ok::<_, crate::Error>(nodes)
            }
        };
        let kids = list(path.clone()).await?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let age = |stat: &NodeStat| {
            u128::try_from(stat.ctime)
                .ok()
                .map(|c| Duration::from_millis(now.saturating_sub(c) as u64))
        };
        let token = |stat: &NodeStat| u64::try_from(stat.czxid).ok();

        let mut family = recipe::other_family(LockKind::Exclusive, &kids);
        let (mut admission, mut leases) = (Vec::new(), Vec::new());
        if family == Some(Other::Semaphore) {
            admission = list(format!("{path}/{}", recipe::ADMISSION)).await?;
            leases = list(format!("{path}/{}", recipe::LEASES)).await?;
            if admission.is_empty() && leases.is_empty() {
                // Empty containers (a refused semaphore ask's): the key is its nodes' family.
                family =
                    recipe::other_family(LockKind::Exclusive, &recipe::family_nodes(kids.clone()));
            }
        }
        match family {
            Some(Other::Semaphore) => {
                // The size is a convention among clients, stored nowhere: 0 here.
                seen.family = Some(Family::Semaphore { max: 0 });
                let admission = stats(
                    format!("{path}/{}", recipe::ADMISSION),
                    LockKind::Exclusive,
                    admission,
                )
                .await?;
                // The admission head's leases exist while it waits for room: not held yet.
                // A distlock head's leases carry its protection prefix; a Curator head's have
                // their own, so they are its session's leases made after its admission node
                // (the session may hold other permits too: its other tasks).
                let head = admission
                    .first()
                    .map(|(name, stat)| (protection_of(name), stat.owner, stat.czxid));
                let head_prefixed = head.is_some_and(|(prefix, _, _)| {
                    prefix.is_some_and(|p| leases.iter().any(|name| name.starts_with(p)))
                });
                let waiting = |name: &str, stat: &NodeStat| match head {
                    Some((Some(p), _, _)) if head_prefixed => name.starts_with(p),
                    Some((_, session, since)) if !head_prefixed => {
                        stat.owner == session && stat.czxid > since
                    }
                    _ => false,
                };
                let leases = stats(
                    format!("{path}/{}", recipe::LEASES),
                    LockKind::Exclusive,
                    leases,
                )
                .await?;
                // One distlock claim's permits share a protection prefix (one multi).
                let mut claims: BTreeMap<String, (u32, NodeStat, Vec<String>)> = BTreeMap::new();
                for (name, stat) in leases {
                    if waiting(&name, &stat) {
                        continue;
                    }
                    let claim = name
                        .rsplit_once('-')
                        .map_or(name.clone(), |(p, _)| p.to_owned());
                    let entry = claims.entry(claim).or_insert((0, stat, Vec::new()));
                    entry.0 += 1;
                    entry.2.push(format!("{path}/{}/{name}", recipe::LEASES));
                }
                for (count, stat, paths) in claims.into_values() {
                    seen.holders.push(Holder {
                        kind: LockKind::Permits { count, max: 0 },
                        fencing_token: token(&stat),
                        lease_left: None,
                    });
                    carriers.push(paths);
                }
                seen.waiters = admission
                    .iter()
                    .map(|(_, stat)| Waiter {
                        kind: LockKind::Permits { count: 0, max: 0 },
                        waited: age(stat),
                    })
                    .collect();
            }
            Some(Other::RwLock) => {
                let nodes = stats(path.clone(), LockKind::Read, recipe::family_nodes(kids)).await?;
                let names: Vec<String> = nodes.iter().map(|(n, _)| n.clone()).collect();
                seen.family = Some(Family::RwLock);
                for (name, stat) in &nodes {
                    let write = name.contains("__WRIT__");
                    let kind = if write {
                        LockKind::Write
                    } else {
                        LockKind::Read
                    };
                    let holds = match recipe::place(kind, &names, name) {
                        Place::Head => !write || names.first() == Some(name),
                        _ => false,
                    };
                    if holds {
                        seen.holders.push(Holder {
                            kind,
                            fencing_token: token(stat),
                            lease_left: None,
                        });
                        carriers.push(vec![format!("{path}/{name}")]);
                    } else {
                        seen.waiters.push(Waiter {
                            kind,
                            waited: age(stat),
                        });
                    }
                }
            }
            other => {
                // A mutex, or an election (a latch): one holder, the first node, then a queue.
                let (kind, family, name) = match other {
                    Some(Other::Election) => (LockKind::Leader, Family::Election, "latch-"),
                    _ => (LockKind::Exclusive, Family::Mutex, "lock-"),
                };
                let mut nodes = stats(path.clone(), kind, recipe::family_nodes(kids)).await?;
                nodes.retain(|(n, _)| n.contains(name));
                let mut nodes = nodes.into_iter();
                if let Some((name, stat)) = nodes.next() {
                    seen.family = Some(family);
                    seen.holders.push(Holder {
                        kind,
                        fencing_token: token(&stat),
                        lease_left: None,
                    });
                    carriers.push(vec![format!("{path}/{name}")]);
                }
                seen.waiters = nodes
                    .map(|(_, stat)| Waiter {
                        kind,
                        waited: age(&stat),
                    })
                    .collect();
            }
        }
        let vanished = std::mem::take(&mut *vanished.locked());
        Ok((seen, carriers, vanished))
    }
}

/// The protection prefix `_c_<uuid>-` a node name starts with, if it has one.
fn protection_of(name: &str) -> Option<&str> {
    let uuid = name.strip_prefix("_c_")?.get(..36)?;
    name.get(..3 + uuid.len() + 1)
        .filter(|p| p.ends_with('-') && uuid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
}

/// Deletes the node at `path`: whether it was there.
async fn delete(up: &super::session::Up, path: &str) -> Result<bool> {
    match up.zk.delete(path).await {
        Ok(()) => Ok(true),
        Err(Failure::NoNode) => Ok(false),
        Err(f) => Err(f.into_error(&format!("delete {path}"))),
    }
}

/// The read nodes the write node at `path` is being downgraded to (the same sequence, any
/// prefix: [`recipe::downgraded_suffix`]); none for any other node.
async fn moved_to(up: &super::session::Up, path: &str) -> Result<Vec<String>> {
    let Some((parent, name)) = path.rsplit_once('/') else {
        return Ok(Vec::new());
    };
    let Some(suffix) = recipe::downgraded_suffix(name) else {
        return Ok(Vec::new());
    };
    match up.zk.children(parent).await {
        Ok(kids) => Ok(kids
            .into_iter()
            .filter(|k| k.ends_with(&suffix))
            .map(|k| format!("{parent}/{k}"))
            .collect()),
        Err(Failure::NoNode) => Ok(Vec::new()),
        Err(f) => Err(f.into_error(&format!("list {parent}"))),
    }
}
