//! The arithmetic of a quorum: how many nodes make one, and until when a set of per-node
//! leases keeps one.

use tokio::time::Instant;

/// A majority of `n` nodes: any two majorities share a node.
pub(super) fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The instant until which at least `q` of the per-node lease deadlines still hold (the `q`-th
/// latest); `None` if fewer than `q` are given.
pub(super) fn held_until(mut deadlines: Vec<Instant>, q: usize) -> Option<Instant> {
    if q == 0 || deadlines.len() < q {
        return None;
    }
    deadlines.sort_unstable_by(|a, b| b.cmp(a));
    deadlines.get(q - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn majorities() {
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(7), 4);
    }

    #[test]
    fn a_quorum_holds_until_its_qth_latest_lease_ends() {
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        let leases = vec![ms(50), ms(10), ms(40), ms(30), ms(20)];
        assert_eq!(held_until(leases.clone(), 3), Some(ms(30)));
        assert_eq!(held_until(leases.clone(), 1), Some(ms(50)));
        assert_eq!(held_until(leases.clone(), 5), Some(ms(10)));
        assert_eq!(held_until(leases, 6), None);
        assert_eq!(held_until(vec![], 0), None);
    }
}
