//! The slab table's geometry: where slabs, the undo log and value cells sit in the pool.
//!
//! Twin: the constants of the generated WGSL prelude (`shader.rs`) and the address helpers of
//! `shaders/slab_common.wgsl`; change them together.
//!
//! ```text
//! table region (u32 words):
//! | log header (32 words) | slab 0 .. slab B-1 (base slabs) | slab B .. slab B+P-1 (pool) | log entries |
//! slab (32 words = 128 bytes):
//! | key[0..K] ref | key[0..K] ref | ... (M entries of K+1 words) | unused | next |
//! log entry (33 words): | slab id | the slab's 32 words before the batch |
//! heap region: cell c = words c*CW .. c*CW+CW (CW = ceil(value_bytes / 4))
//! ```

use gphash::{Error, Result};

/// Words of one slab (128 bytes).
pub const SLAB_WORDS: u32 = 32;
/// The word of a slab that holds the next-slab pointer.
pub const NEXT_WORD: u32 = 31;
/// Words of the log header at the start of the table region (one 128-byte block).
pub const LOG_HEADER_WORDS: u32 = 32;
/// Words of one log entry: the slab id and the slab's 32 words.
pub const LOG_ENTRY_WORDS: u32 = 33;

/// A free entry (its reference word), and the end of a chain (a next pointer).
pub const EMPTY: u32 = u32::MAX;
/// No slab / no cell.
pub const NONE: u32 = u32::MAX;
/// An entry claimed by an insertion whose key is being written: invisible to searches.
pub const FILLING: u32 = u32::MAX - 1;
/// Reference words below this are published value cells.
pub const MAX_REF: u32 = u32::MAX - 15;

/// Marks a slab pool in the header's first user word (`"SLABHASH"`).
pub const SLAB_MAGIC: u64 = u64::from_le_bytes(*b"SLABHASH");
/// Version of this layout, in the header's fourth user word.
pub const SLAB_VERSION: u64 = 1;
/// The log header's first word while the log is valid (`"SLOG"`).
pub const LOG_VALID: u32 = u32::from_le_bytes(*b"SLOG");

/// Expected keys per slab entry slot when the table holds its capacity (the load that sizes
/// the base slabs).
pub const TARGET_LOAD: f64 = 0.6;

/// The shape of one slab table. Everything is derived from these numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabGeometry {
    /// Key width in bytes (a multiple of 4, 4 to 120).
    pub key_bytes: u32,
    /// Value size in bytes.
    pub value_bytes: u32,
    /// Buckets = base slabs.
    pub buckets: u32,
    /// Slabs of the slab pool (chain extensions).
    pub pool_slabs: u32,
    /// Value cells in the heap.
    pub cells: u32,
    /// Seed of the bucket hash.
    pub seed: u32,
}

impl SlabGeometry {
    /// Validates a geometry: every address a kernel computes must fit in 32 bits.
    pub fn new(
        key_bytes: u32,
        value_bytes: u32,
        buckets: u32,
        pool_slabs: u32,
        cells: u32,
        seed: u32,
    ) -> Result<Self> {
        let bad = |why: String| Err(Error::InvalidConfig(why));
        if key_bytes == 0 || !key_bytes.is_multiple_of(4) || key_bytes > 120 {
            return bad(format!("slab key width {key_bytes} bytes: must be a multiple of 4, 4 to 120"));
        }
        if value_bytes == 0 || value_bytes > 65536 {
            return bad(format!("value size {value_bytes} bytes: must be 1 to 65536"));
        }
        if buckets == 0 {
            return bad("a slab table needs at least one bucket".into());
        }
        if cells == 0 || cells >= MAX_REF {
            return bad(format!("{cells} value cells: must be 1 to {}", MAX_REF - 1));
        }
        let g = SlabGeometry { key_bytes, value_bytes, buckets, pool_slabs, cells, seed };
        if g.slabs() >= FILLING as u64 || g.table_words() > u32::MAX as u64 {
            return bad(format!("{} slabs: the table region would pass 2^32 words", g.slabs()));
        }
        if g.heap_words() > u32::MAX as u64 {
            return bad(format!("{cells} cells of {value_bytes} bytes pass 2^32 words"));
        }
        Ok(g)
    }

    /// A geometry for `capacity` keys: base slabs for [`TARGET_LOAD`], a pool of a quarter of
    /// the slabs the keys fill, cells for the keys plus room for a batch of new values.
    pub fn for_capacity(key_bytes: u32, value_bytes: u32, capacity: u64, seed: u32) -> Result<Self> {
        if key_bytes == 0 || !key_bytes.is_multiple_of(4) || key_bytes > 120 {
            return Err(Error::InvalidConfig(format!(
                "slab key width {key_bytes} bytes: must be a multiple of 4, 4 to 120"
            )));
        }
        let m = Self::entries_for(key_bytes) as u64;
        let capacity = capacity.max(1);
        let buckets = (capacity as f64 / (m as f64 * TARGET_LOAD)).ceil() as u64;
        let pool = capacity.div_ceil(4 * m) + 64;
        let cells = capacity + capacity / 8 + 1024;
        let fit = |x: u64, what: &str| {
            u32::try_from(x).map_err(|_| Error::InvalidConfig(format!("{x} {what} do not fit 32 bits")))
        };
        Self::new(
            key_bytes,
            value_bytes,
            fit(buckets, "buckets")?,
            fit(pool, "slabs")?,
            fit(cells, "cells")?,
            seed,
        )
    }

    /// Entries of one slab for keys of `key_bytes`.
    pub fn entries_for(key_bytes: u32) -> u32 {
        (SLAB_WORDS - 1) / (key_bytes / 4 + 1)
    }

    /// 32-bit words of a key.
    pub fn key_words(&self) -> u32 {
        self.key_bytes / 4
    }

    /// Words of one entry: the key and the reference word.
    pub fn entry_words(&self) -> u32 {
        self.key_words() + 1
    }

    /// Entries per slab (M).
    pub fn entries(&self) -> u32 {
        Self::entries_for(self.key_bytes)
    }

    /// Words of one value cell.
    pub fn cell_words(&self) -> u32 {
        self.value_bytes.div_ceil(4)
    }

    /// Base slabs plus pool slabs.
    pub fn slabs(&self) -> u64 {
        self.buckets as u64 + self.pool_slabs as u64
    }

    /// Entries of the base slabs and the pool together.
    pub fn entry_capacity(&self) -> u64 {
        self.slabs() * self.entries() as u64
    }

    /// Table word of slab `s`'s first word.
    pub fn slab_word(&self, s: u32) -> u32 {
        LOG_HEADER_WORDS + s * SLAB_WORDS
    }

    /// Table word of the reference word of entry `e` of slab `s`.
    pub fn ref_word(&self, s: u32, e: u32) -> u32 {
        self.slab_word(s) + e * self.entry_words() + self.key_words()
    }

    /// Table word of the first log entry.
    pub fn log_base(&self) -> u32 {
        LOG_HEADER_WORDS + (self.slabs() as u32) * SLAB_WORDS
    }

    /// Table word of log entry `i`.
    pub fn log_word(&self, i: u32) -> u32 {
        self.log_base() + i * LOG_ENTRY_WORDS
    }

    /// Log entries the region holds: one per slab, so the log can hold every slab a batch
    /// touches (chains are disjoint and each bucket is logged once per batch).
    pub fn log_capacity(&self) -> u32 {
        self.slabs() as u32
    }

    /// Words of the table region.
    pub fn table_words(&self) -> u64 {
        LOG_HEADER_WORDS as u64 + self.slabs() * (SLAB_WORDS + LOG_ENTRY_WORDS) as u64
    }

    /// Bytes of the table region.
    pub fn table_bytes(&self) -> u64 {
        self.table_words() * 4
    }

    /// Words of the heap region.
    pub fn heap_words(&self) -> u64 {
        self.cells as u64 * self.cell_words() as u64
    }

    /// Bytes of the heap region.
    pub fn heap_bytes(&self) -> u64 {
        self.heap_words() * 4
    }

    /// The bucket of a key given as words. Twin: `bucket_of` in `shaders/slab_common.wgsl`.
    pub fn bucket(&self, key: &[u32]) -> u32 {
        gphash::hash::hash_words(key, self.seed) % self.buckets
    }

    /// Words of the slab bitmap (bit `s` set: slab `s` in use; base slabs always are).
    pub fn slab_bitmap_words(&self) -> u32 {
        self.slabs().div_ceil(32) as u32
    }

    /// Words of the cell bitmap.
    pub fn cell_bitmap_words(&self) -> u32 {
        self.cells.div_ceil(32)
    }
}

/// The check word of a valid log header. Twin: none (the host writes and reads the header).
pub fn log_check(count: u32, seq: u32) -> u32 {
    gphash::hash::fmix(LOG_VALID ^ gphash::hash::fmix(count ^ gphash::hash::fmix(seq.wrapping_add(0x51AB))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_fill_31_words() {
        assert_eq!(SlabGeometry::entries_for(8), 10);
        assert_eq!(SlabGeometry::entries_for(4), 15);
        assert_eq!(SlabGeometry::entries_for(32), 3);
        assert_eq!(SlabGeometry::entries_for(120), 1);
        assert!(SlabGeometry::new(124, 8, 1, 1, 1, 0).is_err());
    }

    #[test]
    fn regions_do_not_overlap() {
        let g = SlabGeometry::new(8, 8, 10, 5, 100, 1).unwrap();
        assert_eq!(g.slab_word(0), 32);
        assert_eq!(g.log_base(), g.slab_word(15));
        assert_eq!(g.ref_word(1, 0), g.slab_word(1) + 2);
        assert_eq!(g.table_words(), g.log_word(15) as u64);
        let c = SlabGeometry::for_capacity(8, 128, 1000, 3).unwrap();
        assert!(c.entry_capacity() as f64 * TARGET_LOAD >= 1000.0);
    }
}
