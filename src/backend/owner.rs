//! Owner tokens for claims, made without a system call each.
//!
//! A claim's owner token is a v4 UUID. Drawing each one from the operating system (`getrandom`)
//! cost a system call per lock, about 4 % of a busy client's CPU. A client now asks
//! the system once, for a 128-bit key, and makes each token from that key and a counter.
//!
//! - **Unique within a client.** The low 62 bits of a token are `key.1 + n` for the `n`-th token,
//!   which differ for 2^62 tokens; the version and variant bits a v4 UUID fixes lie outside them.
//! - **Unique across clients** as random v4 UUIDs are: another client's key is another random
//!   draw. The high half mixes the counter with the key's other half, so tokens do not show the
//!   counter.
//! - **Fork.** A forked child does not carry a client over (its connections and tasks stay
//!   with the parent); one it builds draws its own key.

use std::sync::atomic::{AtomicU64, Ordering};

/// The length of an owner token: a hyphenated UUID.
pub(crate) const OWNER_LEN: usize = uuid::fmt::Hyphenated::LENGTH;

/// An owner token: a hyphenated lowercase v4 UUID, ASCII.
pub(crate) type Owner = [u8; OWNER_LEN];

/// Makes a client's owner tokens (see the module docs).
pub(crate) struct Owners {
    key: (u64, u64),
    next: AtomicU64,
}

impl Default for Owners {
    fn default() -> Self {
        Self {
            key: uuid::Uuid::new_v4().as_u64_pair(),
            next: AtomicU64::new(0),
        }
    }
}

impl Owners {
    /// The next owner token, unlike every earlier one of this generator.
    pub(crate) fn next(&self) -> Owner {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let high = mix(n ^ self.key.0);
        let low = self.key.1.wrapping_add(n);
        let bits = (u128::from(high) << 64) | u128::from(low);
        let mut owner = [0; OWNER_LEN];
        uuid::Builder::from_random_bytes(bits.to_be_bytes())
            .into_uuid()
            .hyphenated()
            .encode_lower(&mut owner);
        owner
    }
}

/// The splitmix64 finaliser: a bijection of `u64` that spreads every input bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn tokens_are_v4_uuids_unique_within_and_across_generators() {
        let (a, b) = (Owners::default(), Owners::default());
        let mut seen = HashSet::new();
        for owners in [&a, &b] {
            for _ in 0..10_000 {
                let owner = owners.next();
                let text = std::str::from_utf8(&owner).expect("ascii");
                let uuid = uuid::Uuid::parse_str(text).expect("a uuid");
                assert_eq!(uuid.get_version_num(), 4, "{text}");
                assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122, "{text}");
                assert_eq!(uuid.hyphenated().to_string(), text, "lowercase hyphenated");
                assert!(seen.insert(owner), "{text} made twice");
            }
        }
    }

    #[test]
    fn tokens_stay_unique_where_the_counter_and_the_low_half_wrap() {
        let owners = Owners {
            key: (0, u64::MAX - 1),
            next: AtomicU64::new(u64::MAX - 3),
        };
        let made: HashSet<Owner> = (0..8).map(|_| owners.next()).collect();
        assert_eq!(made.len(), 8, "tokens made twice across the wrap");
    }
}
