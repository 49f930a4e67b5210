//! Geometry of the CPU table: bucket layout, shards, value cells, and how they are recorded in
//! the host-pm [`Header`].
//!
//! # Bucket (256 bytes, 4 cache lines, 256-byte aligned)
//!
//! | bytes | content |
//! |---|---|
//! | 0..8 | metadata word (u64, little-endian): bit `i < N` = slot `i` valid; bit 63 = overflow |
//! | 8..8+N | tags: one byte per slot, the top byte of the key's shard hash |
//! | `M + i*(K+4)` | slot `i`: the global value-cell index (u32) then the key's `K` bytes |
//!
//! `M` is `8 + N` rounded up to 8, `K` the key width; `N` is the largest slot count that fits
//! (27 slots for 4-byte keys, 18 for 8, 11 for 16, 6 for 32; keys up to 236 bytes). Every
//! slot starts 4-byte aligned, so a cell index is rewritten with one aligned store.
//!
//! The overflow bit of bucket `b` says that some key whose probe started at or before `b`
//! lives after `b`: a search stops at the first bucket without it.
//!
//! # Shards and cells
//!
//! The table region holds `shards` shards of `buckets` buckets each, shard after shard; the
//! heap region holds `shards` runs of `cells` value cells of `ceil(value_bytes / 4) * 4` bytes.
//! Shard `s` owns buckets `s*buckets ..` and cells `s*cells ..`; its slots refer to its own
//! cells only, by global cell index.
//!
//! # Header mapping
//!
//! | field | meaning here |
//! |---|---|
//! | `table.key_bytes`, `table.value_bytes` | key width, value size |
//! | `table.levels` | 1 (one flat level) |
//! | `table.hashes` | 2 (shard/tag hash and bucket hash) |
//! | `table.slots` | slots per bucket `N` |
//! | `table.top_level` | log2 of the shard count |
//! | `table.seed` | hash seed |
//! | `table_region`, `heap_region` | buckets, value cells |
//! | `heap_cells` | `shards * cells` |
//! | `user[0]` | [`CPU_MAGIC`]: refuses pools of other formats |
//! | `user[1]` | buckets per shard |
//! | `user[2]` | cells per shard |
//! | `user[3]` | probe limit in buckets |
//! | `user[4]` | bucket bytes (256) |
//! | `user[5]` | layout version (1) |

use host_pm::{Header, ResizeRecord, TableConfig};

use gphash::hash::{Seeds, hash_words};
use gphash::{Error, Result};

/// Bytes of a bucket: four cache lines, the block size of Optane media that TurboHash targets.
pub const BUCKET_BYTES: usize = 256;
/// The overflow bit of a bucket's metadata word.
pub const OVERFLOW: u64 = 1 << 63;
/// Most slots a bucket may have (bit 63 is the overflow bit).
pub const MAX_SLOTS: usize = 63;
/// Load factor the table is sized for: `capacity` keys fill this share of the slots.
pub const MAX_LOAD: f64 = 0.75;
/// Longest probe in buckets (TurboHash's probing scope is 16 buckets too).
pub const MAX_PROBE: usize = 16;
/// A shard gets at least this many buckets when the table is small (fewer shards instead).
pub const MIN_BUCKETS_PER_SHARD: usize = 64;
/// Most shards a table may have (the tag byte must stay clear of the shard bits).
pub const MAX_SHARDS: usize = 1 << 16;
/// `user[0]` of a CPU-baseline pool: `b"GPHCPU01"` little-endian.
pub const CPU_MAGIC: u64 = u64::from_le_bytes(*b"GPHCPU01");
/// `user[5]`: version of this layout.
pub const LAYOUT_VERSION: u64 = 1;

/// Where a key goes: its shard, its home bucket inside the shard, and its tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// Shard index.
    pub shard: usize,
    /// First bucket of the probe, relative to the shard.
    pub home: usize,
    /// One-byte fingerprint kept beside the slot.
    pub tag: u8,
}

/// Every size and count of one table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Key width in bytes (a multiple of 4).
    pub key_bytes: usize,
    /// Value size in bytes.
    pub value_bytes: usize,
    /// Slots per bucket (`N`).
    pub slots: usize,
    /// Bytes of a slot: 4 (cell index) + key.
    pub slot_bytes: usize,
    /// Offset of slot 0 in a bucket.
    pub meta_bytes: usize,
    /// Bytes of a value cell (`ceil(value_bytes / 4) * 4`).
    pub cell_bytes: usize,
    /// Number of shards (a power of two).
    pub shards: usize,
    /// Buckets per shard.
    pub buckets: usize,
    /// Value cells per shard.
    pub cells: usize,
    /// Probe limit in buckets (at most `buckets`).
    pub probe: usize,
    /// Hash seed.
    pub seed: u64,
    /// Seed of the shard/tag hash.
    pub shard_seed: u32,
    /// Seed of the bucket hash.
    pub bucket_seed: u32,
}

/// Slots that fit a 256-byte bucket for keys of `key_bytes`.
pub fn slots_for(key_bytes: usize) -> usize {
    let slot = key_bytes + 4;
    (1..=MAX_SLOTS).rev().find(|&n| (8 + n).next_multiple_of(8) + n * slot <= BUCKET_BYTES).unwrap_or(0)
}

impl Geometry {
    /// The geometry for `capacity` keys at [`MAX_LOAD`]. `shards` = 0 picks
    /// `4 * threads` rounded up to a power of two, halved while a shard would have fewer than
    /// [`MIN_BUCKETS_PER_SHARD`] buckets; otherwise it must be a power of two.
    pub fn new(
        key_bytes: usize,
        value_bytes: usize,
        capacity: u64,
        threads: usize,
        shards: usize,
        seed: u64,
    ) -> Result<Geometry> {
        if !(4..=256).contains(&key_bytes) || !key_bytes.is_multiple_of(4) {
            return Err(Error::InvalidConfig(format!(
                "key width {key_bytes} is not a multiple of 4 in 4..=256"
            )));
        }
        if !(1..=65536).contains(&value_bytes) {
            return Err(Error::InvalidConfig(format!("value size {value_bytes} is outside 1..=65536")));
        }
        let slots = slots_for(key_bytes);
        if slots == 0 {
            return Err(Error::InvalidConfig(format!(
                "the cpu baseline holds keys of at most {} bytes in its 256-byte buckets, not {key_bytes}",
                BUCKET_BYTES - 20
            )));
        }
        let wanted_slots = ((capacity as f64 / MAX_LOAD).ceil() as u64).max(1);
        let total_buckets = usize::try_from(wanted_slots.div_ceil(slots as u64))
            .map_err(|_| Error::InvalidConfig(format!("capacity {capacity} is too large")))?;
        let shards = if shards == 0 {
            let mut s = (4 * threads.max(1)).next_power_of_two().min(MAX_SHARDS);
            while s > 1 && total_buckets / s < MIN_BUCKETS_PER_SHARD {
                s /= 2;
            }
            s
        } else if shards.is_power_of_two() && shards <= MAX_SHARDS {
            shards
        } else {
            return Err(Error::InvalidConfig(format!(
                "{shards} shards: not a power of two up to {MAX_SHARDS}"
            )));
        };
        let buckets = total_buckets.div_ceil(shards).max(1);
        Self::assemble(key_bytes, value_bytes, slots, shards, buckets, buckets.min(MAX_PROBE), seed)
    }

    fn assemble(
        key_bytes: usize,
        value_bytes: usize,
        slots: usize,
        shards: usize,
        buckets: usize,
        probe: usize,
        seed: u64,
    ) -> Result<Geometry> {
        let seeds = Seeds::new(seed, 1);
        let cells = buckets * slots + buckets;
        let g = Geometry {
            key_bytes,
            value_bytes,
            slots,
            slot_bytes: key_bytes + 4,
            meta_bytes: (8 + slots).next_multiple_of(8),
            cell_bytes: value_bytes.div_ceil(4) * 4,
            shards,
            buckets,
            cells,
            probe,
            seed,
            shard_seed: seeds.locations[0],
            bucket_seed: seeds.fingerprint,
        };
        if (g.shards * g.cells) as u64 >= u32::MAX as u64 {
            return Err(Error::InvalidConfig(format!(
                "{} value cells do not fit 32-bit cell indices",
                g.shards * g.cells
            )));
        }
        Ok(g)
    }

    /// Key width in 32-bit words.
    pub fn key_words(&self) -> usize {
        self.key_bytes / 4
    }

    /// Value cell in 32-bit words (the width of a value in batches).
    pub fn cell_words(&self) -> usize {
        self.cell_bytes / 4
    }

    /// Bytes of the table region's content.
    pub fn table_bytes(&self) -> u64 {
        (self.shards * self.buckets * BUCKET_BYTES) as u64
    }

    /// Bytes of the heap region's content.
    pub fn heap_bytes(&self) -> u64 {
        (self.shards * self.cells * self.cell_bytes) as u64
    }

    /// Total slots of the table.
    pub fn total_slots(&self) -> u64 {
        (self.shards * self.buckets * self.slots) as u64
    }

    /// Mask of the valid bits of a metadata word.
    pub fn slot_mask(&self) -> u64 {
        (1u64 << self.slots) - 1
    }

    /// Offset of slot `i` inside its bucket.
    pub fn slot_offset(&self, i: usize) -> usize {
        self.meta_bytes + i * self.slot_bytes
    }

    /// Shard, home bucket and tag of a key given as words.
    pub fn place(&self, key: &[u32]) -> Place {
        self.place_with(key, hash_words(key, self.shard_seed))
    }

    /// [`Geometry::place`] when the shard hash is known already.
    pub fn place_with(&self, key: &[u32], shard_hash: u32) -> Place {
        let bucket_hash = hash_words(key, self.bucket_seed);
        Place {
            shard: self.shard_of(shard_hash),
            home: ((bucket_hash as u64 * self.buckets as u64) >> 32) as usize,
            tag: (shard_hash >> 24) as u8,
        }
    }

    /// The shard of a shard hash.
    pub fn shard_of(&self, shard_hash: u32) -> usize {
        shard_hash as usize & (self.shards - 1)
    }

    /// The header of a new pool with this geometry, and the pool's size.
    pub fn header(&self) -> (Header, u64) {
        let (table, heap, total) = host_pm::layout_regions(self.table_bytes(), self.heap_bytes());
        let header = Header {
            version: host_pm::FORMAT_VERSION,
            table: TableConfig {
                key_bytes: self.key_bytes as u32,
                value_bytes: self.value_bytes as u32,
                levels: 1,
                hashes: 2,
                slots: self.slots as u32,
                top_level: self.shards.trailing_zeros(),
                seed: self.seed,
            },
            table_region: table,
            heap_region: heap,
            heap_cells: (self.shards * self.cells) as u64,
            resize: ResizeRecord::default(),
            clean_shutdown: false,
            sequence: 0,
            user: [
                CPU_MAGIC,
                self.buckets as u64,
                self.cells as u64,
                self.probe as u64,
                BUCKET_BYTES as u64,
                LAYOUT_VERSION,
                0,
                0,
            ],
            closed: host_pm::CloseRecord::default(),
        };
        (header, total)
    }

    /// The geometry a pool's header records; [`Error::IncompatiblePool`] (naming `path`) when
    /// the pool is not a CPU-baseline pool of this layout or its regions are too small.
    pub fn from_header(h: &Header, path: &std::path::Path) -> Result<Geometry> {
        let bad = |why: String| Error::IncompatiblePool { path: path.to_path_buf(), why };
        if h.user[0] != CPU_MAGIC {
            return Err(bad("not a cpu-baseline pool (user[0] lacks its magic)".to_string()));
        }
        if h.user[4] != BUCKET_BYTES as u64 || h.user[5] != LAYOUT_VERSION {
            return Err(bad(format!(
                "cpu-baseline layout {} with {}-byte buckets; this build reads layout {LAYOUT_VERSION} with {BUCKET_BYTES}",
                h.user[5], h.user[4]
            )));
        }
        let t = &h.table;
        let slots = slots_for(t.key_bytes as usize);
        if t.slots as usize != slots || slots == 0 || t.levels != 1 || t.hashes != 2 {
            return Err(bad(format!(
                "{} slots per bucket, {} levels, {} hashes for {}-byte keys; expected {slots}, 1, 2",
                t.slots, t.levels, t.hashes, t.key_bytes
            )));
        }
        let shards = 1usize << t.top_level;
        let (buckets, cells, probe) = (h.user[1] as usize, h.user[2] as usize, h.user[3] as usize);
        if shards > MAX_SHARDS || buckets == 0 || probe == 0 || probe > buckets.min(MAX_PROBE) {
            return Err(bad(format!("{shards} shards of {buckets} buckets with probe limit {probe}")));
        }
        let g = Self::assemble(
            t.key_bytes as usize,
            t.value_bytes as usize,
            slots,
            shards,
            buckets,
            probe,
            t.seed,
        )?;
        if cells != g.cells || h.heap_cells != (shards * cells) as u64 {
            return Err(bad(format!(
                "{cells} cells per shard ({} in all); expected {}",
                h.heap_cells, g.cells
            )));
        }
        h.check_regions(g.table_bytes(), g.heap_bytes()).map_err(bad)?;
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fill_the_bucket() {
        assert_eq!(slots_for(4), 27);
        assert_eq!(slots_for(8), 18);
        assert_eq!(slots_for(16), 11);
        assert_eq!(slots_for(32), 6);
        assert_eq!(slots_for(236), 1);
        assert_eq!(slots_for(240), 0);
        for k in (4..=236).step_by(4) {
            let n = slots_for(k);
            assert!((8 + n).next_multiple_of(8) + n * (k + 4) <= BUCKET_BYTES);
            assert!((8 + n + 1).next_multiple_of(8) + (n + 1) * (k + 4) > BUCKET_BYTES || n == MAX_SLOTS);
        }
    }

    #[test]
    fn sizing_and_header_round_trip() {
        let g = Geometry::new(8, 128, 1_000_000, 16, 0, 7).unwrap();
        assert_eq!(g.shards, 64);
        assert!(g.total_slots() as f64 * MAX_LOAD >= 1e6);
        let (h, total) = g.header();
        host_pm::validate_header(&h, total).unwrap();
        assert_eq!(Geometry::from_header(&h, "p".as_ref()).unwrap(), g);
        // Small tables get fewer shards.
        let small = Geometry::new(32, 8, 300, 16, 0, 7).unwrap();
        assert_eq!(small.shards, 1);
        assert!(Geometry::new(8, 8, 100, 1, 3, 0).is_err());
        assert!(Geometry::new(240, 8, 100, 1, 0, 0).is_err());
        let mut foreign = h;
        foreign.user[0] = 0;
        assert!(matches!(Geometry::from_header(&foreign, "p".as_ref()), Err(Error::IncompatiblePool { .. })));
    }

    #[test]
    fn places_spread_over_shards_and_buckets() {
        let g = Geometry::new(8, 8, 100_000, 4, 0, 1).unwrap();
        let mut per_shard = vec![0u32; g.shards];
        for k in 0..100_000u32 {
            let p = g.place(&[k, 0]);
            assert!(p.home < g.buckets);
            per_shard[p.shard] += 1;
        }
        let mean = 100_000 / g.shards as u32;
        assert!(per_shard.iter().all(|&c| c > mean * 9 / 10 && c < mean * 11 / 10), "{per_shard:?}");
    }
}
