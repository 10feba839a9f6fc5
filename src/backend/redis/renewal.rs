//! Renewal: every lease and queue entry of a round in one script call (one per slot on a
//! Cluster).

#[cfg(feature = "redis-cluster")]
use super::lock_name;
use super::scripts::{Renew, Renewed};
use super::{RedisBackend, RedisTicket};
use crate::backend::handoff::renewal::{fail_all, RenewAnswer};
use crate::backend::{Claim, Renewal};
use crate::error::{Error, ErrorKind};

impl RedisBackend {
    /// The claims to renew in one script call each, by index: all of them on one server; on a
    /// Cluster one group per slot (a script's keys must share a slot), sent together.
    fn renewal_groups(&self, claims: &[(&Claim, &RedisTicket)]) -> Vec<Vec<usize>> {
        #[cfg(feature = "redis-cluster")]
        if self.inner.cluster {
            let mut groups: std::collections::HashMap<_, Vec<usize>> =
                std::collections::HashMap::new();
            for (i, (claim, _)) in claims.iter().enumerate() {
                let lock = lock_name(claim.namespace(), claim.key());
                let slot = ::redis::cluster_routing::Slot::for_key(&lock);
                groups.entry(slot).or_default().push(i);
            }
            return groups.into_values().collect();
        }
        vec![(0..claims.len()).collect()]
    }

    /// Renews the claims at `group` (indices into `claims`) in one script call; a failed call
    /// fails those claims only.
    async fn renew_group(
        &self,
        claims: &[(&Claim, &RedisTicket)],
        group: &[usize],
    ) -> Vec<Renewal> {
        let mut args = Renew::default();
        let mut members: Vec<&Claim> = Vec::with_capacity(group.len());
        for (claim, ticket) in group.iter().filter_map(|&i| claims.get(i)) {
            args.claims.push(Renewed {
                keys: self.keys_of(ticket, claim),
                ttl: claim.ttl(),
            });
            members.push(claim);
        }
        let inv = self.call(&args);
        match self
            .inner
            .commands
            .invoke_timed::<Vec<i64>>("renew", &inv)
            .await
        {
            Ok((results, sent)) if results.len() == members.len() => {
                if let Err(err) = self.renewal_acknowledged(&members).await {
                    return fail_all(members.len(), &err);
                }
                members
                    .iter()
                    .zip(results)
                    .map(|(claim, r)| {
                        // Keys that cannot be read hold another type: this claim cannot own them.
                        let answer = RenewAnswer::of_code(r).unwrap_or(RenewAnswer::Neither);
                        answer.renewal(sent, claim.ttl())
                    })
                    .collect()
            }
            Ok(_) => {
                let err = Error::new(ErrorKind::Backend, "redis renew returned a malformed reply");
                fail_all(members.len(), &err)
            }
            Err(err) => fail_all(members.len(), &err),
        }
    }

    pub(super) async fn renew_claims(&self, claims: &[(&Claim, &RedisTicket)]) -> Vec<Renewal> {
        let mut out: Vec<Option<Renewal>> = vec![None; claims.len()];
        let groups = self.renewal_groups(claims);
        let answers =
            futures::future::join_all(groups.iter().map(|group| self.renew_group(claims, group)))
                .await;
        for (group, answer) in groups.iter().zip(answers) {
            for (&i, renewal) in group.iter().zip(answer) {
                if let Some(slot) = out.get_mut(i) {
                    *slot = Some(renewal);
                }
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Renewal::Failed(Error::new(ErrorKind::Backend, "redis renew lost a claim"))
                })
            })
            .collect()
    }
}
