//! What a handoff message says: a grant to its new owner, or to the waiter next in line when
//! the provisional lease of the grant ahead of it ends.

/// A grant announced to its new owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handoff {
    pub(crate) fence: u64,
    pub(crate) server_ms: i64,
    pub(crate) px: u64,
}

/// The end of a provisional lease handed to the waiter ahead of us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseEnd {
    pub(crate) server_ms: i64,
    pub(crate) px: u64,
}

/// What woke a waiter, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    Granted(Handoff),
    /// Messages may have been missed (reconnect): ask the server.
    Recheck,
    /// The lock went to the waiter just ahead of us: ask again when its lease ends, in case it
    /// died before confirming it.
    NextInLine(LeaseEnd),
}

/// Reads a message: a handoff (four fields) or a next-in-line hint (three), and the owner it
/// names.
pub(crate) fn parse(payload: &str) -> Option<(&str, Wake)> {
    let parts: Vec<&str> = payload.split(' ').collect();
    match parts[..] {
        [owner, fence, server_ms, px] => Some((
            owner,
            Wake::Granted(Handoff {
                fence: fence.parse().ok()?,
                server_ms: server_ms.parse().ok()?,
                px: px.parse().ok()?,
            }),
        )),
        [owner, server_ms, px] => Some((
            owner,
            Wake::NextInLine(LeaseEnd {
                server_ms: server_ms.parse().ok()?,
                px: px.parse().ok()?,
            }),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_handoff_messages() {
        let (owner, h) = parse("a-b-c 1763000000000001 1763000000000 2000").unwrap();
        assert_eq!(owner, "a-b-c");
        assert_eq!(
            h,
            Wake::Granted(Handoff {
                fence: 1_763_000_000_000_001,
                server_ms: 1_763_000_000_000,
                px: 2000
            })
        );
        let (owner, next) = parse("d-e 1763000000000 300").unwrap();
        assert_eq!(owner, "d-e");
        assert_eq!(
            next,
            Wake::NextInLine(LeaseEnd {
                server_ms: 1_763_000_000_000,
                px: 300
            })
        );
        assert!(parse("garbage").is_none());
        assert!(parse("o x 1 2").is_none());
        assert!(parse("o 1 2 3 4").is_none());
    }
}
