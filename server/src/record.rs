//! Redis keys and values, byte strings of any length, in the pool's fixed widths.
//!
//! A key of a pool with K-byte keys holds at most K - 1 bytes: its bytes, zeros, and its
//! length in the last byte (K is at most 256), so that keys of different lengths never
//! collide (`a` and `a\0` differ). A value of a pool with V-byte values holds at most V - 2
//! bytes: its length as a little-endian u16 (V is at most 65,536), then its bytes and zeros.
//! A read returns exactly the bytes written.

use std::fmt;

/// The pool's widths, and the longest key and value they hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Widths {
    key_bytes: usize,
    value_bytes: usize,
}

/// A key or value longer than the pool holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLong {
    what: &'static str,
    len: usize,
    max: usize,
    width: usize,
}

impl fmt::Display for TooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} bytes is longer than the {} bytes this pool's {}s hold ({}-byte {} slots)",
            self.what, self.len, self.max, self.what, self.width, self.what
        )
    }
}

impl Widths {
    /// The widths of a pool; `None` when its values are too small to hold a length (V < 2).
    pub fn new(key_bytes: u32, value_bytes: u32) -> Option<Self> {
        (value_bytes >= 2 && (1..=256).contains(&key_bytes))
            .then_some(Widths { key_bytes: key_bytes as usize, value_bytes: value_bytes as usize })
    }

    /// The pool's key width.
    pub fn key_bytes(&self) -> usize {
        self.key_bytes
    }

    /// The pool's value size.
    pub fn value_bytes(&self) -> usize {
        self.value_bytes
    }

    /// The longest key.
    pub fn max_key(&self) -> usize {
        self.key_bytes - 1
    }

    /// The longest value.
    pub fn max_value(&self) -> usize {
        self.value_bytes - 2
    }

    /// Appends `key` in the pool's key width to `out`.
    pub fn put_key(&self, key: &[u8], out: &mut Vec<u8>) -> Result<(), TooLong> {
        if key.len() > self.max_key() {
            return Err(TooLong { what: "key", len: key.len(), max: self.max_key(), width: self.key_bytes });
        }
        out.extend_from_slice(key);
        out.resize(out.len() + self.key_bytes - 1 - key.len(), 0);
        out.push(key.len() as u8);
        Ok(())
    }

    /// Appends `value` in the pool's value size to `out`.
    pub fn put_value(&self, value: &[u8], out: &mut Vec<u8>) -> Result<(), TooLong> {
        if value.len() > self.max_value() {
            let e =
                TooLong { what: "value", len: value.len(), max: self.max_value(), width: self.value_bytes };
            return Err(e);
        }
        out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        out.extend_from_slice(value);
        out.resize(out.len() + self.max_value() - value.len(), 0);
        Ok(())
    }

    /// The value a stored cell holds; `None` when its length is impossible (a value this
    /// server did not write).
    pub fn value<'a>(&self, stored: &'a [u8]) -> Option<&'a [u8]> {
        let len = u16::from_le_bytes([stored[0], stored[1]]) as usize;
        stored.get(2..2 + len).filter(|_| stored.len() == self.value_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_round_trip_at_every_length() {
        let w = Widths::new(8, 6).unwrap();
        let mut keys = vec![];
        for len in 0..=7 {
            let key: Vec<u8> = (0..len as u8).collect();
            let mut out = vec![];
            w.put_key(&key, &mut out).unwrap();
            assert_eq!(out.len(), 8);
            keys.push(out);
            let mut stored = vec![];
            w.put_value(&key[..len.min(4)], &mut stored).unwrap();
            assert_eq!(stored.len(), 6);
            assert_eq!(w.value(&stored), Some(&key[..len.min(4)]));
        }
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 8, "keys of different lengths never collide");
        let (mut a, mut a0) = (vec![], vec![]);
        w.put_key(b"a", &mut a).unwrap();
        w.put_key(b"a\0", &mut a0).unwrap();
        assert_ne!(a, a0);
    }

    #[test]
    fn too_long_is_refused_naming_the_limit() {
        let w = Widths::new(32, 64).unwrap();
        let mut out = vec![];
        let err = w.put_key(&[b'k'; 32], &mut out).unwrap_err();
        assert_eq!(
            err.to_string(),
            "key of 32 bytes is longer than the 31 bytes this pool's keys hold (32-byte key slots)"
        );
        let err = w.put_value(&[0; 63], &mut out).unwrap_err();
        assert!(err.to_string().starts_with("value of 63 bytes is longer than the 62 bytes"), "{err}");
        assert!(out.is_empty(), "nothing is appended for a refused key or value");
        assert_eq!(Widths::new(8, 1), None);
        let mut stored = vec![0xff, 0xff, 0, 0];
        assert_eq!(Widths::new(4, 4).unwrap().value(&stored), None, "an impossible length");
        stored[..2].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(Widths::new(4, 4).unwrap().value(&stored), Some(&[0u8, 0][..]));
    }
}
