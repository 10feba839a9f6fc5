//! A script call's keys or arguments: byte strings one after another in one buffer.
//!
//! A call is built for every acquire and release, so what it is made of is paid for at every
//! lock of a busy service: one buffer for the bytes and one for where each string ends, not an
//! allocation per key and per number.

use std::io;

use ::redis::RedisWrite;

/// Byte strings one after another in one buffer.
#[derive(Clone, Debug, Default)]
pub(crate) struct Strings {
    bytes: Vec<u8>,
    /// Where each string ends in `bytes`; each starts where the one before ends.
    ends: Vec<usize>,
}

impl Strings {
    /// Room for `count` strings of `bytes` bytes in all.
    pub(crate) fn with_capacity(count: usize, bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(count),
        }
    }

    /// How many strings.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// How many bytes, all strings together.
    pub(crate) fn size(&self) -> usize {
        self.bytes.len()
    }

    /// The strings in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(start, end)| self.bytes.get(start..end).unwrap_or_default())
    }

    /// Whether the strings from the `from`-th on are those of `other` from its `from`-th on
    /// (both empty if either has no more than `from`).
    pub(crate) fn tail_eq(&self, other: &Strings, from: usize) -> bool {
        let start = |s: &Strings| match from.checked_sub(1) {
            None => Some(0),
            Some(i) => s.ends.get(i).copied(),
        };
        let (Some(a), Some(b)) = (start(self), start(other)) else {
            return self.len() <= from && other.len() <= from;
        };
        let (ends_a, ends_b) = (
            self.ends.get(from..).unwrap_or_default(),
            other.ends.get(from..).unwrap_or_default(),
        );
        self.bytes.get(a..) == other.bytes.get(b..)
            && ends_a.len() == ends_b.len()
            && ends_a.iter().zip(ends_b).all(|(x, y)| x - a == y - b)
    }

    /// The strings, each in its own `Vec` (for tests).
    #[cfg(test)]
    pub(crate) fn to_vecs(&self) -> Vec<Vec<u8>> {
        self.iter().map(<[u8]>::to_vec).collect()
    }

    /// Adds one string.
    pub(crate) fn push(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len());
    }

    /// Adds every string of `other`, in order.
    pub(crate) fn extend(&mut self, other: &Strings) {
        let base = self.bytes.len();
        self.bytes.extend_from_slice(&other.bytes);
        self.ends.extend(other.ends.iter().map(|end| base + end));
    }
}

/// A writer that adds what it is given to the last string of a [`Strings`].
pub(crate) struct Tail<'a>(&'a mut Strings);

impl io::Write for Tail<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.bytes.extend_from_slice(buf);
        if let Some(end) = self.0.ends.last_mut() {
            *end = self.0.bytes.len();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl RedisWrite for Strings {
    fn write_arg(&mut self, arg: &[u8]) {
        self.push(arg);
    }

    fn write_arg_fmt(&mut self, arg: impl std::fmt::Display) {
        use std::io::Write as _;
        self.ends.push(self.bytes.len());
        // Writing to a `Vec` cannot fail.
        let _ = write!(Tail(self), "{arg}");
    }

    fn writer_for_next_arg(&mut self) -> impl io::Write + '_ {
        self.ends.push(self.bytes.len());
        Tail(self)
    }

    fn reserve_space_for_args(&mut self, additional: impl IntoIterator<Item = usize>) {
        let mut count = 0;
        let bytes = additional.into_iter().inspect(|_| count += 1).sum();
        self.bytes.reserve(bytes);
        self.ends.reserve(count);
    }
}

#[cfg(test)]
mod tests {
    use ::redis::ToRedisArgs;

    use super::Strings;

    #[test]
    fn strings_keep_their_order_and_bounds_however_written() {
        let mut s = Strings::default();
        "key".write_redis_args(&mut s);
        42u64.write_redis_args(&mut s);
        s.push(b"");
        (-7i64).write_redis_args(&mut s);
        b"\0bin".as_slice().write_redis_args(&mut s);
        assert_eq!(
            s.to_vecs(),
            vec![
                b"key".to_vec(),
                b"42".to_vec(),
                vec![],
                b"-7".to_vec(),
                b"\0bin".to_vec()
            ]
        );
        assert_eq!(s.len(), 5);
        let mut t = Strings::with_capacity(1, 1);
        t.push(b"x");
        t.extend(&s);
        assert_eq!(t.to_vecs()[0], b"x".to_vec());
        assert_eq!(t.to_vecs()[1..], s.to_vecs()[..]);
        assert_eq!(t.size(), 1 + s.size());
    }

    #[test]
    fn tails_are_equal_exactly_when_their_strings_are() {
        let of = |parts: &[&[u8]]| {
            let mut s = Strings::default();
            parts.iter().for_each(|p| s.push(p));
            s
        };
        let slow =
            |a: &Strings, b: &Strings, from: usize| a.iter().skip(from).eq(b.iter().skip(from));
        let samples = [
            of(&[b"k1", b"owner", b"ab", b"c"]),
            of(&[b"key2", b"o", b"ab", b"c"]),
            of(&[b"key2", b"o", b"a", b"bc"]),
            of(&[b"key2", b"o", b"abc", b""]),
            of(&[b"k1", b"owner", b"ab"]),
            of(&[b"k1"]),
            of(&[]),
        ];
        for a in &samples {
            for b in &samples {
                for from in 0..6 {
                    assert_eq!(
                        a.tail_eq(b, from),
                        slow(a, b, from),
                        "{:?} / {:?} from {from}",
                        a.to_vecs(),
                        b.to_vecs()
                    );
                }
            }
        }
    }
}
