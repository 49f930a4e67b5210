//! Table geometry: the `aL-bH-cS` layout, how buckets are grouped in the pool, and sizes.
//!
//! The table is an array of buckets in groups. A group holds the buckets of every level that
//! share one bucket `j` of the bottom level: the `2^(L-1)` top-level buckets above it first,
//! then the level below, down to `j` itself (`2^L - 1` buckets). All candidate buckets of one
//! hash location therefore sit in one contiguous run, read with one memory request.
//!
//! A bucket of `S` slots is `S` fingerprints, then `S` state words, then `S` keys:
//!
//! ```text
//! | fp[0..S] (u32) | state[0..S] (u32) | key[0..S] (key_bytes each) |
//! ```
//!
//! The state word is `EMPTY` (0), `INSERTING` (1) or `2 + cell`, the published slot's value
//! cell. Keeping the value reference in the state word makes publish, update and delete single
//! 32-bit CAS transitions on one word (see `docs/protocol.md`).
//!
//! A value cell of the heap is the value's words (zero-padded to whole words), then its
//! checksum ([`crate::hash::value_checksum`]), one contiguous run read with one request:
//!
//! ```text
//! | value[0..value_words] (u32) | checksum (u32) |
//! ```
//!
//! Twin: `shaders/common/table.wgsl` computes the same addresses; change both together.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// State word of an empty slot.
pub(crate) const EMPTY: u32 = 0;
/// State word of a slot claimed by a batch whose phase B has not published it yet.
pub(crate) const INSERTING: u32 = 1;
/// State words at or above this value are published: `state - PUBLISHED` is the value cell.
pub const PUBLISHED: u32 = 2;
/// Most value cells an arena has: a state word names its cell within the arena with 32 bits,
/// above the states of an empty and a claimed slot, and short of `u32::MAX` (`NONE` in the
/// kernels). A heap of one arena (every table whose slots this reaches) has at most this many
/// cells; a heap of `A` arenas at most `A` times this, rounded down to whole words of each.
pub const MAX_CELLS: u64 = (u32::MAX - PUBLISHED) as u64 - 1;
/// Most arenas a heap has, as log2 ([`Geometry::arena_bits`]).
pub(crate) const MAX_ARENA_BITS: u32 = 5;
/// Most cells `2^arena_bits` arenas name: [`MAX_CELLS`] in one, whole bitmap words of each
/// when there are several.
fn most_cells(arena_bits: u32) -> u64 {
    if arena_bits == 0 { MAX_CELLS } else { (MAX_CELLS / 32 * 32) << arena_bits }
}

/// Slots a table has for each arena before a growth deals its values to more arenas: as many
/// as one arena names ([`MAX_CELLS`]), fewer in gphash's own tests
/// (`testing::layout::set_slots_per_arena`), so that small tables grow across arenas.
#[cfg(feature = "testing")]
static SLOTS_PER_ARENA: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(MAX_CELLS);

fn slots_per_arena() -> u64 {
    #[cfg(feature = "testing")]
    return SLOTS_PER_ARENA.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(feature = "testing"))]
    MAX_CELLS
}

/// Has tables made or grown from now on take a new arena for each `slots` slots (see
/// [`slots_per_arena`]); [`MAX_CELLS`] undoes it.
#[cfg(feature = "testing")]
pub fn set_slots_per_arena(slots: u64) {
    SLOTS_PER_ARENA.store(slots.clamp(1, MAX_CELLS), std::sync::atomic::Ordering::Relaxed);
}

/// Largest number of candidate slots per key (`L * H * S`) the kernels support.
pub(crate) const MAX_CANDIDATES: u32 = 128;
/// Fewest candidate slots per key a table may have: with fewer, keys collide while the table
/// is nearly empty, and growing does not help (1L-1H-1S doubled to 864 MB for 2,258 keys).
pub(crate) const MIN_CANDIDATES: u32 = 8;
/// The pool header's user word that records where keys live (0: in their buckets, 1: apart).
pub(crate) const KEYS_APART_WORD: usize = 0;
/// The pool header's user word that records how hash locations share the top level (0: each
/// hashes into all of it, as pools made before 2026-11-26 do; 1: each into a part of its own).
pub(crate) const LOCATIONS_APART_WORD: usize = 1;
/// The pool header's user words that name a sharded table's shard (`src/sharded.rs`): the
/// table's identity, and the shard's number plus one (both 0: not a shard).
pub(crate) const SHARD_TABLE_WORD: usize = 2;
pub(crate) const SHARD_NUMBER_WORD: usize = 3;
/// The pool header's user word that records the heap's arenas, as log2 (0: one arena, as in
/// pools made before arenas).
pub(crate) const ARENA_BITS_WORD: usize = 4;
/// Load factor the table is sized for when created with a capacity.
pub const TARGET_LOAD: f64 = 0.75;

/// The `aL-bH-cS` configuration: levels per key, hash locations, slots per bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Levels a key can live in (`L`).
    pub levels: u32,
    /// Hash locations per key (`H`).
    pub hashes: u32,
    /// Slots per bucket (`S`).
    pub slots: u32,
}

impl Default for Layout {
    fn default() -> Self {
        Layout { levels: 2, hashes: 2, slots: 8 }
    }
}

impl Layout {
    /// Candidate buckets of one key (`L * H`).
    pub fn candidate_buckets(&self) -> u32 {
        self.levels * self.hashes
    }

    /// Candidate slots of one key (`L * H * S`).
    pub fn candidates(&self) -> u32 {
        self.candidate_buckets() * self.slots
    }

    /// Buckets in one group (`2^L - 1`).
    pub fn group_buckets(&self) -> u32 {
        (1 << self.levels) - 1
    }

    /// Checks the ranges the kernels support.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidConfig(format!("layout {self}: {why}")));
        if !(1..=6).contains(&self.levels) {
            return bad("levels must be 1 to 6".into());
        }
        if !(1..=8).contains(&self.hashes) {
            return bad("hash locations must be 1 to 8".into());
        }
        if !(1..=32).contains(&self.slots) {
            return bad("slots per bucket must be 1 to 32".into());
        }
        if self.candidates() < MIN_CANDIDATES {
            return bad(format!(
                "{} candidate slots per key (L x H x S); at least {MIN_CANDIDATES} are needed, or keys \
                 collide while the table is nearly empty",
                self.candidates()
            ));
        }
        if self.candidates() > MAX_CANDIDATES {
            return bad(format!(
                "{} candidate slots per key; at most {MAX_CANDIDATES} are supported",
                self.candidates()
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}L-{}H-{}S", self.levels, self.hashes, self.slots)
    }
}

impl FromStr for Layout {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidConfig(format!("layout {s:?} is not of the form 2L-2H-8S"));
        let mut parts = s.trim().split('-');
        let mut field = |suffix: char| -> Result<u32> {
            let p = parts.next().ok_or_else(bad)?;
            let n = p
                .strip_suffix(suffix)
                .or_else(|| p.strip_suffix(suffix.to_ascii_lowercase()))
                .ok_or_else(bad)?;
            n.parse().map_err(|_| bad())
        };
        let layout = Layout { levels: field('L')?, hashes: field('H')?, slots: field('S')? };
        if parts.next().is_some() {
            return Err(bad());
        }
        layout.validate()?;
        Ok(layout)
    }
}

/// Every size and offset of one table, derived from its configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Levels, hash locations, slots per bucket.
    pub layout: Layout,
    /// Key width in bytes (a multiple of 4).
    pub key_bytes: u32,
    /// Value size in bytes.
    pub value_bytes: u32,
    /// log2 of the number of top-level buckets.
    pub top_level: u32,
    /// Value cells in the heap.
    pub cells: u64,
    /// Keys in an array of their own after the buckets, not in the buckets (the layout of the
    /// GPHash paper's predecessors, kept as an ablation: a positive search reads its key apart).
    pub keys_apart: bool,
    /// Each hash location hashes into a part of the top level of its own, named by the top
    /// bucket's highest bits (d-left hashing: [`Geometry::location_bits`]).
    pub locations_apart: bool,
    /// log2 of the heap's arenas. A key's cells are all in the arena its fingerprint's highest
    /// bits name, and its state word names a cell by its number within that arena, so that
    /// 32-bit state words reach `2^arena_bits` times [`MAX_CELLS`] cells and the commit stays
    /// one 32-bit CAS. Bitmap word `w` (cells `32w .. 32w + 31`) belongs to arena `w mod A`:
    /// [`Geometry::cell_index`].
    pub arena_bits: u32,
}

impl Geometry {
    /// Validates a configuration, with as many arenas as name a cell for every slot and `cells`
    /// rounded up to whole bitmap words of each. Kernels name buckets and a cell within its arena
    /// with 32 bits: fewer than 2^31 buckets, at most [`MAX_CELLS`] (2^32 - 4) cells an arena.
    /// Word addresses are 64 bits where a region exceeds 2^32 words (16 GiB), on devices that
    /// have them.
    pub fn new(layout: Layout, key_bytes: u32, value_bytes: u32, top_level: u32, cells: u64) -> Result<Self> {
        layout.validate()?;
        let bad = |why: String| Err(Error::InvalidConfig(why));
        if key_bytes == 0 || !key_bytes.is_multiple_of(4) || key_bytes > 256 {
            return bad(format!("key width {key_bytes} bytes: must be a multiple of 4, 4 to 256"));
        }
        if value_bytes == 0 || value_bytes > 65536 {
            return bad(format!("value size {value_bytes} bytes: must be 1 to 65536"));
        }
        // Locations apart where the level splits evenly among them.
        let hashes = layout.hashes;
        let locations_apart = hashes > 1 && hashes.is_power_of_two();
        let g = Geometry {
            layout,
            key_bytes,
            value_bytes,
            top_level,
            cells,
            keys_apart: false,
            locations_apart,
            arena_bits: 0,
        };
        g.with_heap_of(g.needed_arena_bits(), cells)
    }

    /// The same table with its keys in an array of their own (`apart`) or in their buckets.
    pub fn with_keys_apart(self, apart: bool) -> Result<Self> {
        Geometry { keys_apart: apart, ..self }.checked()
    }

    /// The same table with each hash location in a part of the top level of its own (`apart`)
    /// or every location hashing into all of it.
    pub fn with_locations_apart(self, apart: bool) -> Result<Self> {
        Geometry { locations_apart: apart, ..self }.checked()
    }

    /// The same table with `2^bits` arenas in its heap, whose cells are rounded up to whole
    /// bitmap words of each arena.
    pub fn with_arena_bits(self, bits: u32) -> Result<Self> {
        self.with_heap_of(bits, self.cells)
    }

    /// The same table with `2^bits` arenas and at least `cells` cells: whole bitmap words of
    /// each arena where there are several.
    fn with_heap_of(self, bits: u32, cells: u64) -> Result<Self> {
        let words = if bits == 0 { 1 } else { 32 << bits.min(MAX_ARENA_BITS) };
        self.with_heap(bits, cells.div_ceil(words) * words)
    }

    /// The fewest arenas, as log2, that name a cell for every slot: 0 up to [`MAX_CELLS`] slots.
    fn needed_arena_bits(&self) -> u32 {
        let names_all = |a: u32| most_cells(a).min(slots_per_arena() << a) >= self.slots();
        (0..MAX_ARENA_BITS).find(|&a| names_all(a)).unwrap_or(MAX_ARENA_BITS)
    }

    /// Most cells the heap's arenas name.
    pub fn most_cells(&self) -> u64 {
        most_cells(self.arena_bits)
    }

    /// The same table with a heap of `cells` cells in `2^arena_bits` arenas.
    pub fn with_heap(self, arena_bits: u32, cells: u64) -> Result<Self> {
        Geometry { arena_bits, cells, ..self }.checked()
    }

    /// Arenas of the heap.
    pub fn arenas(&self) -> u64 {
        1 << self.arena_bits
    }

    /// The arena of the key whose fingerprint is `fp`: its highest `arena_bits` bits.
    pub fn arena_of(&self, fp: u32) -> u32 {
        ((fp as u64) >> (32 - self.arena_bits)) as u32
    }

    /// Cells of each arena.
    pub fn arena_cells(&self) -> u64 {
        self.cells >> self.arena_bits
    }

    /// The heap's cell `local` of arena `arena` (what a state word names, less [`PUBLISHED`]):
    /// arena `p` has bitmap words `p, p + A, p + 2A, ..`.
    pub fn cell_index(&self, arena: u32, local: u32) -> u64 {
        (((local as u64 >> 5) << self.arena_bits) + arena as u64) * 32 + (local & 31) as u64
    }

    /// The heap cell that published state word `state` names in a slot whose fingerprint is
    /// `fp`, or why it names none (a damaged state word: a number beyond its arena).
    pub fn published_cell(&self, fp: u32, state: u32) -> std::result::Result<u64, String> {
        let (arena, local) = (self.arena_of(fp), state - PUBLISHED);
        if (local as u64) < self.arena_cells() {
            Ok(self.cell_index(arena, local))
        } else if self.arena_bits == 0 {
            Err(format!("value cell {local} beyond the heap of {} cells", self.cells))
        } else {
            Err(format!(
                "value cell {local} of arena {arena} beyond the {} cells of an arena",
                self.arena_cells()
            ))
        }
    }

    /// The arena and the number within it of heap cell `cell` (inverse of [`Self::cell_index`]).
    #[cfg(test)]
    pub fn cell_local(&self, cell: u64) -> (u32, u32) {
        let word = cell / 32;
        let arena = (word & (self.arenas() - 1)) as u32;
        (arena, (((word >> self.arena_bits) * 32) + cell % 32) as u32)
    }

    /// The top-level bucket's highest bits that name its hash location: log2 `H` for tables
    /// whose locations are apart, else 0. An insertion fills the least-loaded candidate
    /// bucket, ties going to the first; with the locations apart that is d-left hashing, and
    /// 2L-2H-8S first finds no slot at a load of 0.913 instead of 0.896 at 25 M slots
    /// (`docs/protocol.md`, "Locations apart").
    pub fn location_bits(&self) -> u32 {
        if self.locations_apart { self.layout.hashes.ilog2() } else { 0 }
    }

    /// Checks the sizes the kernels can address.
    fn checked(self) -> Result<Self> {
        let (g, cells) = (self, self.cells);
        let bad = |why: String| Err(Error::InvalidConfig(why));
        let (levels, top_level) = (g.layout.levels, g.top_level);
        if top_level + 1 < levels || top_level > 30 {
            return bad(format!(
                "top level {top_level}: must be at least levels - 1 = {} and at most 30",
                levels - 1
            ));
        }
        let hashes = g.layout.hashes;
        if g.locations_apart && !hashes.is_power_of_two() {
            return bad(format!("{hashes} hash locations cannot each have an equal part of the top level"));
        }
        if g.arena_bits > MAX_ARENA_BITS {
            return bad(format!("2^{} arenas: at most 2^{MAX_ARENA_BITS}", g.arena_bits));
        }
        let (arenas, most) = (g.arenas(), g.most_cells());
        // Buckets are numbered with 32 bits (fewer than 2^(t+1) <= 2^31 of them); the heap must
        // be able to grow to a cell for every slot.
        if g.slots() > most {
            return bad(format!(
                "table of {} slots: a heap of {arenas} arena(s) names at most {most} cells, one a slot",
                g.slots()
            ));
        }
        if cells == 0 || cells > most {
            return bad(format!("{cells} value cells: must be 1 to {most} in {arenas} arenas"));
        }
        if arenas > 1 && !cells.is_multiple_of(32 * arenas) {
            return bad(format!("{cells} value cells: not whole bitmap words of each of {arenas} arenas"));
        }
        Ok(g)
    }

    /// The smallest table of this layout with room for `capacity` keys at [`TARGET_LOAD`], and
    /// a heap for `capacity` values.
    pub fn for_capacity(layout: Layout, key_bytes: u32, value_bytes: u32, capacity: u64) -> Result<Self> {
        layout.validate()?;
        let want = (capacity.max(1) as f64 / TARGET_LOAD).ceil() as u64;
        let mut top = layout.levels - 1;
        let slots_at = |top: u32| {
            (1u64 << (top + 1 - layout.levels)) * layout.group_buckets() as u64 * layout.slots as u64
        };
        while slots_at(top) < want && top < 30 {
            top += 1;
        }
        Geometry::new(layout, key_bytes, value_bytes, top, Self::cells_for_keys(capacity.max(1)))
    }

    /// Heap cells for a table meant to hold `keys` keys: one each, plus a sixteenth (and 1,024)
    /// for the new values of updates, whose old cells are freed only after their batch is
    /// persisted. At that load about 6% of the cells are unused; insertions beyond it grow the
    /// heap (`src/heap.rs`).
    pub fn cells_for_keys(keys: u64) -> u64 {
        keys + keys / 16 + 1024
    }

    /// The same table with a heap of at least `cells` cells: whole bitmap words of each arena
    /// where there are several.
    pub fn with_cells(&self, cells: u64) -> Result<Geometry> {
        self.with_heap_of(self.arena_bits, cells)
    }

    /// 32-bit words of one key.
    pub fn key_words(&self) -> u32 {
        self.key_bytes / 4
    }

    /// 32-bit words of one bucket: fingerprints and state words, and the keys unless apart.
    pub fn bucket_words(&self) -> u32 {
        self.layout.slots * (2 + if self.keys_apart { 0 } else { self.key_words() })
    }

    /// Word offset of the key array (the end of the buckets) when keys are apart.
    pub fn keys_base(&self) -> u64 {
        self.buckets() * self.bucket_words() as u64
    }

    /// Bytes of one group (the run one hash location reads).
    pub fn group_bytes(&self) -> u64 {
        self.group_words() * 4
    }

    /// 32-bit words of one group.
    pub fn group_words(&self) -> u64 {
        self.layout.group_buckets() as u64 * self.bucket_words() as u64
    }

    /// Slots of one group.
    pub fn group_slots(&self) -> u64 {
        self.layout.group_buckets() as u64 * self.layout.slots as u64
    }

    /// Groups in the table (buckets of the bottom level).
    pub fn groups(&self) -> u64 {
        1 << (self.top_level + 1 - self.layout.levels)
    }

    /// Buckets in the table.
    pub fn buckets(&self) -> u64 {
        self.groups() * self.layout.group_buckets() as u64
    }

    /// Slots in the table.
    pub fn slots(&self) -> u64 {
        self.buckets() * self.layout.slots as u64
    }

    /// Words of the table region.
    pub fn table_words(&self) -> u64 {
        self.keys_base() + if self.keys_apart { self.slots() * self.key_words() as u64 } else { 0 }
    }

    /// Bytes of the table region.
    pub fn table_bytes(&self) -> u64 {
        self.table_words() * 4
    }

    /// 32-bit words of one value (its bytes zero-padded): what batches carry per operation.
    pub fn value_words(&self) -> u32 {
        self.value_bytes.div_ceil(4)
    }

    /// 32-bit words of one value cell: the value words, then the checksum word.
    pub fn cell_words(&self) -> u32 {
        self.value_words() + 1
    }

    /// Words of the value heap.
    pub fn heap_words(&self) -> u64 {
        self.cells * self.cell_words() as u64
    }

    /// Bytes of the value heap.
    pub fn heap_bytes(&self) -> u64 {
        self.heap_words() * 4
    }

    /// Where candidate `c` (`0 .. L*H*S`) of a key with top-level buckets `tops` lives.
    pub fn candidate(&self, tops: &[u32], c: u32) -> Candidate {
        let Layout { levels, slots, .. } = self.layout;
        let cb = c / slots;
        let (h, level) = (cb / levels, cb % levels);
        let top = tops[h as usize];
        let group = (top >> (levels - 1)) as u64;
        // Level `level` (0 = top) starts after the 2^(L-1) + .. + 2^(L-level) buckets above it.
        let level_start = (1u32 << levels) - (1u32 << (levels - level));
        let local = (top >> level) & ((1u32 << (levels - 1 - level)) - 1);
        let bucket = group * self.layout.group_buckets() as u64 + (level_start + local) as u64;
        Candidate { bucket, slot: c % slots }
    }

    /// Word offset of the fingerprint of slot `slot` in bucket `bucket`.
    pub fn fp_word(&self, bucket: u64, slot: u32) -> u64 {
        bucket * self.bucket_words() as u64 + slot as u64
    }

    /// Word offset of the state word of a slot.
    pub fn state_word(&self, bucket: u64, slot: u32) -> u64 {
        self.fp_word(bucket, slot) + self.layout.slots as u64
    }

    /// Word offset of the first key word of a slot.
    pub fn key_word(&self, bucket: u64, slot: u32) -> u64 {
        let kw = self.key_words() as u64;
        if self.keys_apart {
            self.keys_base() + (bucket * self.layout.slots as u64 + slot as u64) * kw
        } else {
            bucket * self.bucket_words() as u64 + 2 * self.layout.slots as u64 + slot as u64 * kw
        }
    }

    /// The table one level taller: top level + 1, twice the groups, a heap of at least as many
    /// cells as the new slots need, and more arenas where the new slots need them (the growth
    /// then deals the values to them: `resize::redeal`).
    pub fn grown(&self) -> Result<Geometry> {
        let g = Geometry { top_level: self.top_level + 1, ..*self };
        let cells = self.cells.max(Self::cells_for_keys((g.slots() as f64 * TARGET_LOAD) as u64));
        g.with_heap_of(self.arena_bits.max(g.needed_arena_bits()), cells)
    }

    /// Where bucket `bucket` of this table sits in the table one level taller, or `None` for a
    /// bucket of the bottom level, whose keys are rehashed instead. Levels keep their buckets:
    /// a level-`l` bucket keeps its index in level `l`; only the grouping changes.
    ///
    /// Twin: `grown_bucket` in `shaders/resize.wgsl`.
    pub fn grown_bucket(&self, bucket: u64) -> Option<u64> {
        let levels = self.layout.levels;
        let gb = self.layout.group_buckets() as u64;
        let depth = self.level_of(bucket);
        if depth == levels - 1 {
            return None;
        }
        let start = |d: u32| (1u64 << levels) - (1u64 << (levels - d));
        let index = bucket / gb * (1 << (levels - 1 - depth)) + (bucket % gb - start(depth));
        let d = depth + 1;
        let group = index >> (levels - 1 - d);
        Some(group * gb + start(d) + (index & ((1 << (levels - 1 - d)) - 1)))
    }

    /// The bottom-level bucket of group `group`.
    pub fn bottom_bucket(&self, group: u64) -> u64 {
        (group + 1) * self.layout.group_buckets() as u64 - 1
    }

    /// The level (0 = top) of a bucket.
    pub fn level_of(&self, bucket: u64) -> u32 {
        let in_group = (bucket % self.layout.group_buckets() as u64) as u32;
        let levels = self.layout.levels;
        (0..levels).find(|&l| in_group < (1u32 << levels) - (1u32 << (levels - 1 - l))).unwrap_or(levels - 1)
    }
}

/// A candidate slot: a bucket of the table and a slot in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Candidate {
    /// Global bucket index.
    pub bucket: u64,
    /// Slot in the bucket.
    pub slot: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips_and_rejects_nonsense() {
        let l: Layout = "4L-2H-16S".parse().unwrap();
        assert_eq!(l, Layout { levels: 4, hashes: 2, slots: 16 });
        assert_eq!(l.to_string(), "4L-2H-16S");
        for bad in ["", "2L-2H", "2L-2H-8S-1X", "2H-2L-8S", "0L-2H-8S", "2L-2H-64S", "4L-4H-16S"] {
            assert!(bad.parse::<Layout>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn layouts_with_fewer_than_eight_candidates_are_refused() {
        for few in ["1L-1H-1S", "1L-1H-4S", "1L-2H-2S", "2L-1H-2S", "1L-1H-7S"] {
            match few.parse::<Layout>() {
                Err(Error::InvalidConfig(why)) => assert!(why.contains("at least 8"), "{few}: {why}"),
                other => panic!("{few}: {other:?}"),
            }
        }
        // The smallest layouts the benchmarks and tests use stay valid.
        for ok in ["1L-1H-8S", "1L-2H-4S", "2L-2H-4S", "1L-2H-8S", "3L-2H-4S"] {
            assert!(ok.parse::<Layout>().is_ok(), "{ok}");
        }
    }

    /// The largest table of every layout (top level 30) numbers its buckets with 32 bits, and
    /// its heap's arenas name a cell for every slot: past [`MAX_CELLS`] slots, several arenas.
    #[test]
    fn the_largest_table_of_every_layout_has_no_more_slots_than_cells() {
        let mut layouts = 0;
        for (levels, hashes, slots) in
            (1..=6).flat_map(|l| (1..=8).flat_map(move |h| (1..=32).map(move |s| (l, h, s))))
        {
            let layout = Layout { levels, hashes, slots };
            if layout.validate().is_err() {
                continue;
            }
            layouts += 1;
            let largest = Geometry::new(layout, 8, 8, 30, 1).unwrap_or_else(|e| panic!("{layout}: {e}"));
            assert!(largest.buckets() < 1 << 32, "{layout}: {} buckets", largest.buckets());
            let (arenas, most) = (largest.arenas(), largest.most_cells());
            assert_eq!(arenas > 1, largest.slots() > MAX_CELLS, "{layout}: {} slots", largest.slots());
            assert!(largest.slots() <= most, "{layout}: {} slots, {arenas} arenas", largest.slots());
            assert!(largest.with_cells(most).is_ok(), "{layout}");
            assert!(largest.with_cells(most + 32 * arenas).is_err(), "{layout}");
        }
        assert!(layouts > 100, "{layouts} layouts");
    }

    /// A table has the arenas its slots need, made or grown: one up to 2^32 - 4 slots, then
    /// each growth doubles them; fewer than the slots need are refused.
    #[test]
    fn arenas_follow_the_slots() {
        let mut g = Geometry::for_capacity(Layout::default(), 8, 8, 1 << 20).unwrap();
        let mut arenas = vec![];
        while g.top_level < 30 {
            let grown = g.grown().unwrap();
            let whole = grown.arenas() == 1 || grown.cells.is_multiple_of(32 * grown.arenas());
            assert!(grown.cells >= g.cells && whole, "{grown:?}");
            g = grown;
            arenas.push((g.top_level, g.slots() > MAX_CELLS, g.arenas()));
        }
        // 3.2 G slots at level 28, 6.4 G at 29, 12.9 G at 30.
        assert_eq!(arenas[arenas.len() - 3..], [(28, false, 1), (29, true, 2), (30, true, 4)]);
        // Made for 3.5 G keys: the top level 29 (6.4 G slots) and two arenas.
        let large = Geometry::for_capacity(Layout::default(), 8, 8, 3_500_000_000).unwrap();
        assert_eq!((large.top_level, large.arenas()), (29, 2));
        let e = large.with_heap(0, MAX_CELLS).unwrap_err().to_string();
        assert!(e.contains("1 arena(s)") && e.contains("one a slot"), "{e}");
    }

    /// Cells of each arena are numbered from 0 in its bitmap words `p, p + A, ..`: the numbering
    /// round-trips, and an arena's cells are its own.
    #[test]
    fn cells_are_numbered_within_their_arena() {
        let g = Geometry::new(Layout::default(), 8, 8, 10, 5000).unwrap().with_arena_bits(3).unwrap();
        assert_eq!((g.arenas(), g.cells % (32 * 8), g.arena_cells()), (8, 0, g.cells / 8));
        for cell in 0..g.cells {
            let (arena, local) = g.cell_local(cell);
            assert_eq!(arena as u64, (cell / 32) % 8, "cell {cell}");
            assert!((local as u64) < g.arena_cells(), "cell {cell}");
            assert_eq!(g.cell_index(arena, local), cell);
        }
        // The arena is the fingerprint's highest bits.
        assert_eq!((g.arena_of(0xE000_0000), g.arena_of(0x1FFF_FFFF)), (7, 0));
        let one = Geometry::new(Layout::default(), 8, 8, 10, 5000).unwrap();
        assert_eq!((one.arenas(), one.arena_of(u32::MAX), one.cell_index(0, 4321)), (1, 0, 4321));
        // A state word beyond its arena names no cell.
        assert!(g.published_cell(0, PUBLISHED + g.arena_cells() as u32).is_err());
        assert_eq!(g.published_cell(0xE000_0000, PUBLISHED + 33), Ok(g.cell_index(7, 33)));
    }

    #[test]
    fn default_groups_are_384_bytes_for_8_byte_keys() {
        let g = Geometry::new(Layout::default(), 8, 8, 10, 100).unwrap();
        assert_eq!(g.bucket_words() * 4, 128);
        assert_eq!(g.group_bytes(), 384);
        assert_eq!(g.groups(), 512);
        assert_eq!(g.slots(), 512 * 3 * 8);
        // An 8-byte value and its checksum.
        assert_eq!((g.value_words(), g.cell_words()), (2, 3));
        let odd = Geometry::new(Layout::default(), 8, 5, 10, 100).unwrap();
        assert_eq!((odd.value_words(), odd.cell_words(), odd.heap_words()), (2, 3, 300));
    }

    #[test]
    fn candidates_of_one_hash_share_a_group_and_follow_inter_level_sharing() {
        let layout = Layout { levels: 3, hashes: 1, slots: 4 };
        let g = Geometry::new(layout, 8, 8, 5, 100).unwrap();
        for top in 0..32u32 {
            let buckets: Vec<u64> = (0..3).map(|l| g.candidate(&[top], l * 4).bucket).collect();
            let group = (top >> 2) as u64;
            for (l, &b) in buckets.iter().enumerate() {
                assert_eq!(b / 7, group, "top {top} level {l}");
                assert_eq!(g.level_of(b), l as u32);
            }
            // Level l holds bucket top >> l of a level with 2^(5-l) buckets.
            assert_eq!(buckets[0] % 7, (top & 3) as u64);
            assert_eq!(buckets[1] % 7, 4 + ((top >> 1) & 1) as u64);
            assert_eq!(buckets[2] % 7, 6);
        }
    }

    #[test]
    fn growing_keeps_every_kept_bucket_a_candidate_of_its_keys() {
        for levels in 1..=4 {
            let layout = Layout { levels, hashes: 2, slots: 4 };
            let old = Geometry::new(layout, 8, 8, 6, 100).unwrap();
            let new = old.grown().unwrap();
            assert_eq!(new.groups(), 2 * old.groups());
            assert!(old.locations_apart && new.locations_apart);
            for h in (0..u32::MAX).step_by(7_654_321) {
                let tops = |g: &Geometry| {
                    let bits = g.location_bits();
                    [0, 1].map(|l| crate::hash::top_bucket(h.rotate_left(16 * l), l, g.top_level, bits))
                };
                let (ot, nt) = (tops(&old), tops(&new));
                for c in 0..layout.candidates() {
                    let from = old.candidate(&ot, c);
                    if let Some(to) = old.grown_bucket(from.bucket) {
                        let candidates: Vec<u64> =
                            (0..layout.candidates()).map(|c| new.candidate(&nt, c).bucket).collect();
                        assert!(
                            candidates.contains(&to),
                            "L{levels}: bucket {} moved to {to}, not a candidate",
                            from.bucket
                        );
                    } else {
                        assert_eq!(old.level_of(from.bucket), levels - 1);
                    }
                }
            }
            // The move is one-to-one.
            let moved: Vec<u64> = (0..old.buckets()).filter_map(|b| old.grown_bucket(b)).collect();
            let distinct: std::collections::HashSet<u64> = moved.iter().copied().collect();
            assert_eq!(distinct.len(), moved.len());
            assert_eq!(moved.len() as u64, old.buckets() - old.groups());
        }
    }

    #[test]
    fn capacity_sizing_leaves_headroom() {
        let g = Geometry::for_capacity(Layout::default(), 8, 8, 1 << 20).unwrap();
        assert!(g.slots() as f64 * TARGET_LOAD >= (1 << 20) as f64);
        assert!(g.slots() as f64 * TARGET_LOAD < (2 << 20) as f64 * 1.01);
        // A cell for each of the keys, and at most 10% more.
        assert!(g.cells > 1 << 20 && (g.cells as f64) < (1 << 20) as f64 / 0.9);
    }

    #[test]
    fn geometry_rejects_bad_widths() {
        let l = Layout::default();
        assert!(Geometry::new(l, 6, 8, 10, 10).is_err());
        assert!(Geometry::new(l, 8, 0, 10, 10).is_err());
        assert!(Geometry::new(l, 8, 8, 0, 10).is_err());
        assert!(Geometry::new(l, 8, 8, 10, 0).is_err());
    }
}
