//! A script call's keys or arguments: byte strings one after another in one buffer.
//!
//! A call is built for every acquire and release, so what it is made of is paid for at every
//! lock of a busy service: one buffer for the bytes and one for where each string ends, not an
//! allocation per key and per number (issue 29).

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
}
