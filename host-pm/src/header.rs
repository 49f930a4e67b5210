//! The pool header: in-memory form, on-media encoding, and validation.
//!
//! Two copies of [`HEADER_COPY_BYTES`] bytes sit at pool offsets 0 and 4096. Layout of one copy
//! (all integers little-endian):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `b"GPHASHPM"` |
//! | 8 | 4 | version |
//! | 12 | 4 | clean_shutdown (0 or 1) |
//! | 16 | 8 | sequence |
//! | 24 | 4×6 | key_bytes, value_bytes, levels, hashes, slots, top_level |
//! | 48 | 8 | seed |
//! | 56 | 16 | table_region (offset, bytes) |
//! | 72 | 16 | heap_region (offset, bytes) |
//! | 88 | 8 | heap_cells |
//! | 96 | 4 | resize.state |
//! | 100 | 4 | resize.new_top_level |
//! | 104 | 16 | resize.new_table (offset, bytes) |
//! | 120 | 16 | resize.new_heap (offset, bytes) |
//! | 136 | 64 | user words |
//! | 200 | 8 | pool_bytes: pool length when the copy was written |
//! | 208 | 8 | max_bytes: growth limit, 0 = none |
//! | 216 | 16 | closed.saved (offset, bytes): what the table crate saved at close |
//! | 232 | 8 | closed.items |
//! | 240 | 4 | closed.checksum: CRC32 of the saved region's bytes |
//! | 244 | 3848 | reserved, zero |
//! | 4092 | 4 | CRC32 of bytes 0..4092 |

use crate::{FORMAT_VERSION, HEADER_AREA, PoolError, READABLE_VERSIONS, REGION_ALIGN, Result};

/// Bytes of one header copy. Copy `i` lives at pool offset `i * HEADER_COPY_BYTES`.
pub const HEADER_COPY_BYTES: u64 = 4096;
/// The first bytes of every header copy.
pub const MAGIC: [u8; 8] = *b"GPHASHPM";

/// One copy's size as an index bound.
const COPY: usize = HEADER_COPY_BYTES as usize;

/// Field offsets inside one copy (see the module docs).
mod off {
    pub(super) const MAGIC: usize = 0;
    pub(super) const VERSION: usize = 8;
    pub(super) const CLEAN: usize = 12;
    pub(super) const SEQUENCE: usize = 16;
    pub(super) const KEY_BYTES: usize = 24;
    pub(super) const VALUE_BYTES: usize = 28;
    pub(super) const LEVELS: usize = 32;
    pub(super) const HASHES: usize = 36;
    pub(super) const SLOTS: usize = 40;
    pub(super) const TOP_LEVEL: usize = 44;
    pub(super) const SEED: usize = 48;
    pub(super) const TABLE_REGION: usize = 56;
    pub(super) const HEAP_REGION: usize = 72;
    pub(super) const HEAP_CELLS: usize = 88;
    pub(super) const RESIZE_STATE: usize = 96;
    pub(super) const RESIZE_TOP: usize = 100;
    pub(super) const RESIZE_TABLE: usize = 104;
    pub(super) const RESIZE_HEAP: usize = 120;
    pub(super) const USER: usize = 136;
    pub(super) const POOL_BYTES: usize = 200;
    pub(super) const MAX_BYTES: usize = 208;
    pub(super) const CLOSED_SAVED: usize = 216;
    pub(super) const CLOSED_ITEMS: usize = 232;
    pub(super) const CLOSED_CHECKSUM: usize = 240;
    pub(super) const RESERVED: usize = 244;
    pub(super) const CHECKSUM: usize = super::COPY - 4;
}

/// A byte range of the pool. Empty regions are `Region::default()` (offset 0, 0 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Region {
    /// Pool offset of the first byte.
    pub offset: u64,
    /// Length in bytes.
    pub bytes: u64,
}

impl Region {
    /// One past the last byte (saturating, so a garbage region never overflows).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.bytes)
    }

    /// True when the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Whether the two share a byte.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.offset < other.end() && other.offset < self.end()
    }
}

/// Table configuration numbers; host-pm stores and range-checks them, the table crate interprets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableConfig {
    /// Key width in bytes: 4..=256, a multiple of 4.
    pub key_bytes: u32,
    /// Value size in bytes: 1..=65536.
    pub value_bytes: u32,
    /// Number of levels: 1..=8.
    pub levels: u32,
    /// Hash locations per key: 1..=8.
    pub hashes: u32,
    /// Slots per bucket: 1..=64.
    pub slots: u32,
    /// log2 of the top level's bucket count: `levels - 1 <= top_level <= 40`.
    pub top_level: u32,
    /// Hash seed.
    pub seed: u64,
}

/// State of a resize in progress, persisted so that a crash can resume it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ResizeRecord {
    /// 0 = no resize; [`ResizeRecord::BUILDING`]: a grown table is being built in `new_table` and
    /// `new_heap`; other values (at most 15) are the table crate's to refuse.
    pub state: u32,
    /// Top level of the table being built (0..=40); meaningful when `state != 0`.
    pub new_top_level: u32,
    /// Region being built: `Region::default()` when `state == 0`, else a valid region that
    /// overlaps no other.
    pub new_table: Region,
    /// New heap: `Region::default()` when `state == 0`; may stay empty when `state != 0`.
    pub new_heap: Region,
}

impl ResizeRecord {
    /// Resize state while the table of `new_top_level` is being built in `new_table` and
    /// `new_heap`: the old table is still the one the header names.
    pub const BUILDING: u32 = 1;
}

/// What the table crate saved when the pool was last closed cleanly, so that the next open
/// can start from it instead of scanning the table: empty (`CloseRecord::default()`) unless
/// `clean_shutdown` is set, and cleared by the first write after an open
/// ([`crate::Pool::mark_dirty`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CloseRecord {
    /// The region holding the saved bytes; empty when nothing was saved.
    pub saved: Region,
    /// A count the table crate keeps beside them (gphash: its published keys).
    pub items: u64,
    /// CRC-32 of the saved region's bytes.
    pub checksum: u32,
}

/// The pool header, as the table crate sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Format version: [`FORMAT_VERSION`].
    pub version: u32,
    /// Table configuration.
    pub table: TableConfig,
    /// The hash table's region.
    pub table_region: Region,
    /// The value heap's region.
    pub heap_region: Region,
    /// Cells in the heap (the cell size is the table crate's business); must be > 0.
    pub heap_cells: u64,
    /// Resize in progress, if any.
    pub resize: ResizeRecord,
    /// True when the pool was closed cleanly (no recovery needed).
    pub clean_shutdown: bool,
    /// Bumped by every header write; the copy with the highest valid sequence wins on open.
    pub sequence: u64,
    /// Opaque words for the table crate (counters, ...): stored, not interpreted.
    pub user: [u64; 8],
    /// What was saved at the last clean close (format version 3; empty in version 2 pools).
    pub closed: CloseRecord,
}

impl Header {
    /// Refuses a header whose table and heap regions are smaller than `table_bytes` and
    /// `heap_bytes` (a table's needs); the error says why.
    pub fn check_regions(&self, table_bytes: u64, heap_bytes: u64) -> std::result::Result<(), String> {
        if self.table_region.bytes < table_bytes || self.heap_region.bytes < heap_bytes {
            return Err(format!(
                "regions of {} and {} bytes are smaller than the {table_bytes} and {heap_bytes} bytes the table needs",
                self.table_region.bytes, self.heap_region.bytes
            ));
        }
        Ok(())
    }
}

/// Pool facts stored beside the [`Header`] in each copy but not part of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extras {
    /// Pool length when the copy was written (a devdax pool's length; a file must be at least this long).
    pub pool_bytes: u64,
    /// Growth limit, 0 = none.
    pub max_bytes: u64,
}

/// Why one header copy could not be used.
#[derive(Debug)]
pub(crate) enum CopyError {
    /// The copy does not start with [`MAGIC`].
    BadMagic,
    /// The stored CRC does not match the bytes (a torn or damaged copy).
    Checksum { stored: u32, computed: u32 },
    /// Intact (magic and checksum fine) but written by another format version.
    Version(u32),
    /// Intact, this version, but a field fails validation.
    Invalid { sequence: u64, error: PoolError },
}

impl CopyError {
    /// A short reason for error messages that name both copies.
    pub(crate) fn reason(&self) -> String {
        match self {
            CopyError::BadMagic => "bad magic".to_string(),
            CopyError::Checksum { stored, computed } => {
                format!("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")
            }
            CopyError::Version(v) => format!("unsupported version {v}"),
            CopyError::Invalid { error, .. } => error.to_string(),
        }
    }
}

fn corrupt(what: impl Into<String>) -> PoolError {
    PoolError::Corrupt { what: what.into() }
}

/// Lay out a table region and a heap region after the header area, each rounded up to
/// [`REGION_ALIGN`]. Returns `(table, heap, total_pool_bytes)`.
///
/// Sizes so large that the layout would pass `u64::MAX` saturate; [`validate_header`] then
/// rejects the result, so nothing is ever mapped from it.
pub fn layout_regions(table_bytes: u64, heap_bytes: u64) -> (Region, Region, u64) {
    let align = |b: u64| b.div_ceil(REGION_ALIGN).saturating_mul(REGION_ALIGN);
    let table = Region { offset: HEADER_AREA, bytes: align(table_bytes) };
    let heap = Region { offset: table.end(), bytes: align(heap_bytes) };
    (table, heap, heap.end())
}

fn validate_config(c: &TableConfig) -> Result<()> {
    if !(4..=256).contains(&c.key_bytes) || !c.key_bytes.is_multiple_of(4) {
        return Err(corrupt(format!("table.key_bytes {} is not a multiple of 4 in 4..=256", c.key_bytes)));
    }
    let ranges = [
        ("value_bytes", c.value_bytes, 1, 65536),
        ("levels", c.levels, 1, 8),
        ("hashes", c.hashes, 1, 8),
        ("slots", c.slots, 1, 64),
    ];
    for (name, value, lo, hi) in ranges {
        if !(lo..=hi).contains(&value) {
            return Err(corrupt(format!("table.{name} {value} is outside {lo}..={hi}")));
        }
    }
    // levels is already known to be >= 1 here.
    if c.top_level < c.levels - 1 || c.top_level > 40 {
        return Err(corrupt(format!(
            "table.top_level {} is outside {}..=40 (levels {})",
            c.top_level,
            c.levels - 1,
            c.levels
        )));
    }
    Ok(())
}

/// Shape checks of one non-empty region that do not depend on the file size.
fn check_region_shape(name: &str, r: Region) -> Result<()> {
    if r.is_empty() {
        return Err(corrupt(format!("{name} is empty (offset {:#x})", r.offset)));
    }
    if !r.offset.is_multiple_of(REGION_ALIGN) || !r.bytes.is_multiple_of(REGION_ALIGN) {
        return Err(corrupt(format!(
            "{name} (offset {:#x}, {:#x} bytes) is not aligned to {REGION_ALIGN:#x}",
            r.offset, r.bytes
        )));
    }
    if r.offset < HEADER_AREA {
        return Err(corrupt(format!(
            "{name} offset {:#x} overlaps the header area (first {HEADER_AREA:#x} bytes)",
            r.offset
        )));
    }
    if r.offset.checked_add(r.bytes).is_none() {
        return Err(corrupt(format!(
            "{name} (offset {:#x}, {:#x} bytes) ends beyond 2^64",
            r.offset, r.bytes
        )));
    }
    Ok(())
}

/// Range-check a header on its own: every field; regions aligned, non-empty (table and heap),
/// inside `file_bytes`, overlapping neither each other nor the header area; resize regions
/// likewise when `resize.state != 0` and `Region::default()` when it is 0; `heap_cells > 0`;
/// the [`TableConfig`] ranges.
///
/// A region that ends beyond `file_bytes` gives [`PoolError::Truncated`] (checked last, so a
/// header that is wrong in another way is reported as such); a wrong version gives
/// [`PoolError::UnsupportedVersion`]; anything else [`PoolError::Corrupt`] naming the field.
pub fn validate_header(h: &Header, file_bytes: u64) -> Result<()> {
    if !READABLE_VERSIONS.contains(&h.version) {
        return Err(PoolError::UnsupportedVersion { found: h.version, supported: FORMAT_VERSION });
    }
    validate_config(&h.table)?;
    if h.heap_cells == 0 {
        return Err(corrupt("heap_cells is 0"));
    }
    let mut regions = vec![("table_region", h.table_region), ("heap_region", h.heap_region)];
    let r = &h.resize;
    if r.state > 15 {
        return Err(corrupt(format!("resize.state {} is above 15", r.state)));
    }
    if r.new_top_level > 40 {
        return Err(corrupt(format!("resize.new_top_level {} is above 40", r.new_top_level)));
    }
    if r.state == 0 {
        for (name, region) in [("resize.new_table", r.new_table), ("resize.new_heap", r.new_heap)] {
            if region != Region::default() {
                return Err(corrupt(format!(
                    "{name} (offset {:#x}, {:#x} bytes) must be empty when resize.state is 0",
                    region.offset, region.bytes
                )));
            }
        }
    } else {
        regions.push(("resize.new_table", r.new_table));
        // An empty new heap must be the canonical empty region, not a stray offset.
        if r.new_heap != Region::default() {
            regions.push(("resize.new_heap", r.new_heap));
        }
    }
    if h.closed != CloseRecord::default() {
        if !h.clean_shutdown {
            return Err(corrupt("a close record in a pool that is not cleanly closed"));
        }
        regions.push(("closed.saved", h.closed.saved));
    }
    for &(name, region) in &regions {
        check_region_shape(name, region)?;
    }
    for (i, &(a_name, a)) in regions.iter().enumerate() {
        for &(b_name, b) in &regions[i + 1..] {
            if a.overlaps(&b) {
                return Err(corrupt(format!(
                    "{a_name} ({:#x}..{:#x}) overlaps {b_name} ({:#x}..{:#x})",
                    a.offset,
                    a.end(),
                    b.offset,
                    b.end()
                )));
            }
        }
    }
    let needed = regions.iter().map(|(_, r)| r.end()).max().unwrap_or(0);
    if needed > file_bytes {
        return Err(PoolError::Truncated { file_bytes, needed });
    }
    Ok(())
}

/// End of the last region the header uses (at least the header area).
fn header_extent(h: &Header) -> u64 {
    [
        HEADER_AREA,
        h.table_region.end(),
        h.heap_region.end(),
        h.resize.new_table.end(),
        h.resize.new_heap.end(),
        h.closed.saved.end(),
    ]
    .into_iter()
    .max()
    .unwrap_or(HEADER_AREA)
}

/// Encode one header copy ([`HEADER_COPY_BYTES`] bytes, checksum included).
///
/// The pool length stored beside the header is the end of the header's last region, and no
/// growth limit; [`crate::Pool`] stores its real length and limit.
pub fn encode_header(h: &Header) -> Vec<u8> {
    encode_raw(h, Extras { pool_bytes: header_extent(h), max_bytes: 0 })
}

pub(crate) fn encode_raw(h: &Header, x: Extras) -> Vec<u8> {
    let mut b = vec![0u8; COPY];
    let mut put = |at: usize, bytes: &[u8]| b[at..at + bytes.len()].copy_from_slice(bytes);
    let region = |r: Region| {
        let mut a = [0u8; 16];
        a[..8].copy_from_slice(&r.offset.to_le_bytes());
        a[8..].copy_from_slice(&r.bytes.to_le_bytes());
        a
    };
    put(off::MAGIC, &MAGIC);
    put(off::VERSION, &h.version.to_le_bytes());
    put(off::CLEAN, &u32::from(h.clean_shutdown).to_le_bytes());
    put(off::SEQUENCE, &h.sequence.to_le_bytes());
    put(off::KEY_BYTES, &h.table.key_bytes.to_le_bytes());
    put(off::VALUE_BYTES, &h.table.value_bytes.to_le_bytes());
    put(off::LEVELS, &h.table.levels.to_le_bytes());
    put(off::HASHES, &h.table.hashes.to_le_bytes());
    put(off::SLOTS, &h.table.slots.to_le_bytes());
    put(off::TOP_LEVEL, &h.table.top_level.to_le_bytes());
    put(off::SEED, &h.table.seed.to_le_bytes());
    put(off::TABLE_REGION, &region(h.table_region));
    put(off::HEAP_REGION, &region(h.heap_region));
    put(off::HEAP_CELLS, &h.heap_cells.to_le_bytes());
    put(off::RESIZE_STATE, &h.resize.state.to_le_bytes());
    put(off::RESIZE_TOP, &h.resize.new_top_level.to_le_bytes());
    put(off::RESIZE_TABLE, &region(h.resize.new_table));
    put(off::RESIZE_HEAP, &region(h.resize.new_heap));
    for (i, w) in h.user.iter().enumerate() {
        put(off::USER + 8 * i, &w.to_le_bytes());
    }
    put(off::POOL_BYTES, &x.pool_bytes.to_le_bytes());
    put(off::MAX_BYTES, &x.max_bytes.to_le_bytes());
    put(off::CLOSED_SAVED, &region(h.closed.saved));
    put(off::CLOSED_ITEMS, &h.closed.items.to_le_bytes());
    put(off::CLOSED_CHECKSUM, &h.closed.checksum.to_le_bytes());
    let crc = crc32fast::hash(&b[..off::CHECKSUM]);
    b[off::CHECKSUM..].copy_from_slice(&crc.to_le_bytes());
    b
}

fn rd_u32(b: &[u8; COPY], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn rd_u64(b: &[u8; COPY], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn rd_region(b: &[u8; COPY], at: usize) -> Region {
    Region { offset: rd_u64(b, at), bytes: rd_u64(b, at + 8) }
}

/// Decode one copy; the error says how far the copy got (magic, checksum, version, fields).
pub(crate) fn decode_raw(raw: &[u8], file_bytes: u64) -> std::result::Result<(Header, Extras), CopyError> {
    let Ok(b) = <&[u8; COPY]>::try_from(raw) else {
        return Err(CopyError::Invalid {
            sequence: 0,
            error: corrupt(format!("a header copy is {HEADER_COPY_BYTES} bytes, got {}", raw.len())),
        });
    };
    if b[off::MAGIC..off::MAGIC + MAGIC.len()] != MAGIC {
        return Err(CopyError::BadMagic);
    }
    let stored = rd_u32(b, off::CHECKSUM);
    let computed = crc32fast::hash(&b[..off::CHECKSUM]);
    if stored != computed {
        return Err(CopyError::Checksum { stored, computed });
    }
    let version = rd_u32(b, off::VERSION);
    if !READABLE_VERSIONS.contains(&version) {
        return Err(CopyError::Version(version));
    }
    let sequence = rd_u64(b, off::SEQUENCE);
    let invalid = |error| CopyError::Invalid { sequence, error };
    let clean_shutdown = match rd_u32(b, off::CLEAN) {
        0 => false,
        1 => true,
        v => {
            return Err(invalid(corrupt(format!("clean_shutdown is {v}, not 0 or 1"))));
        }
    };
    if let Some(pos) = b[off::RESERVED..off::CHECKSUM].iter().position(|&x| x != 0) {
        return Err(invalid(corrupt(format!("reserved header byte {} is not zero", off::RESERVED + pos))));
    }
    let mut user = [0u64; 8];
    for (i, w) in user.iter_mut().enumerate() {
        *w = rd_u64(b, off::USER + 8 * i);
    }
    let h = Header {
        version,
        table: TableConfig {
            key_bytes: rd_u32(b, off::KEY_BYTES),
            value_bytes: rd_u32(b, off::VALUE_BYTES),
            levels: rd_u32(b, off::LEVELS),
            hashes: rd_u32(b, off::HASHES),
            slots: rd_u32(b, off::SLOTS),
            top_level: rd_u32(b, off::TOP_LEVEL),
            seed: rd_u64(b, off::SEED),
        },
        table_region: rd_region(b, off::TABLE_REGION),
        heap_region: rd_region(b, off::HEAP_REGION),
        heap_cells: rd_u64(b, off::HEAP_CELLS),
        resize: ResizeRecord {
            state: rd_u32(b, off::RESIZE_STATE),
            new_top_level: rd_u32(b, off::RESIZE_TOP),
            new_table: rd_region(b, off::RESIZE_TABLE),
            new_heap: rd_region(b, off::RESIZE_HEAP),
        },
        clean_shutdown,
        sequence,
        user,
        closed: CloseRecord {
            saved: rd_region(b, off::CLOSED_SAVED),
            items: rd_u64(b, off::CLOSED_ITEMS),
            checksum: rd_u32(b, off::CLOSED_CHECKSUM),
        },
    };
    let x = Extras { pool_bytes: rd_u64(b, off::POOL_BYTES), max_bytes: rd_u64(b, off::MAX_BYTES) };
    validate_extras(&h, x, file_bytes).map_err(invalid)?;
    validate_header(&h, file_bytes).map_err(invalid)?;
    Ok((h, x))
}

fn validate_extras(h: &Header, x: Extras, file_bytes: u64) -> Result<()> {
    if !x.pool_bytes.is_multiple_of(REGION_ALIGN) || x.pool_bytes < HEADER_AREA {
        return Err(corrupt(format!(
            "pool_bytes {:#x} is not a multiple of {REGION_ALIGN:#x} of at least {HEADER_AREA:#x}",
            x.pool_bytes
        )));
    }
    let extent = header_extent(h);
    if x.pool_bytes < extent {
        return Err(corrupt(format!(
            "pool_bytes {:#x} is smaller than the end of the header's regions {extent:#x}",
            x.pool_bytes
        )));
    }
    if x.max_bytes != 0 && (!x.max_bytes.is_multiple_of(REGION_ALIGN) || x.max_bytes < x.pool_bytes) {
        return Err(corrupt(format!(
            "max_bytes {:#x} is not a multiple of {REGION_ALIGN:#x} of at least pool_bytes {:#x}",
            x.max_bytes, x.pool_bytes
        )));
    }
    // A file shorter than the pool it once was has lost data, even past the regions.
    if x.pool_bytes > file_bytes {
        return Err(PoolError::Truncated { file_bytes, needed: x.pool_bytes });
    }
    Ok(())
}

/// Decode a header copy from raw bytes (exactly [`HEADER_COPY_BYTES`], as stored): checks the
/// magic, the checksum, the version, then every field ([`validate_header`] against
/// `file_bytes`). Never panics, whatever the input.
pub fn decode_header(raw: &[u8], file_bytes: u64) -> Result<Header> {
    decode_raw(raw, file_bytes).map(|(h, _)| h).map_err(|e| match e {
        CopyError::BadMagic => PoolError::NotAPool { path: Default::default() },
        CopyError::Checksum { .. } => corrupt(e.reason()),
        CopyError::Version(found) => PoolError::UnsupportedVersion { found, supported: FORMAT_VERSION },
        CopyError::Invalid { error, .. } => error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        let (t, h, _) = layout_regions(1 << 20, 1 << 18);
        Header {
            version: FORMAT_VERSION,
            table: TableConfig {
                key_bytes: 8,
                value_bytes: 128,
                levels: 2,
                hashes: 2,
                slots: 8,
                top_level: 12,
                seed: 0xdead_beef,
            },
            table_region: t,
            heap_region: h,
            heap_cells: 1000,
            resize: ResizeRecord::default(),
            clean_shutdown: true,
            sequence: 7,
            user: [1, 2, 3, 4, 5, 6, 7, u64::MAX],
            closed: CloseRecord::default(),
        }
    }

    #[test]
    fn regions_smaller_than_a_table_needs_are_refused() {
        let h = sample();
        let (t, heap) = (h.table_region.bytes, h.heap_region.bytes);
        assert!(h.check_regions(t, heap).is_ok());
        assert!(h.check_regions(t + 1, heap).unwrap_err().contains("smaller than"));
        assert!(h.check_regions(t, heap + 1).is_err());
    }

    #[test]
    fn layout_is_fixed() {
        // The layout table in the module docs is the format; pin it.
        assert_eq!(off::CLOSED_SAVED, off::MAX_BYTES + 8);
        assert_eq!(off::RESERVED, off::CLOSED_CHECKSUM + 4);
        assert_eq!(off::USER + 64, off::POOL_BYTES);
        assert_eq!(off::CHECKSUM, 4092);
        let raw = encode_header(&sample());
        assert_eq!(raw.len(), COPY);
        assert_eq!(&raw[..8], b"GPHASHPM");
        assert_eq!(raw[off::VERSION], 5);
        assert_eq!(raw[off::CLEAN], 1);
        assert_eq!(raw[off::SEQUENCE], 7);
        assert_eq!(&raw[off::SEED..off::SEED + 4], &[0xef, 0xbe, 0xad, 0xde]);
        assert!(raw[off::RESERVED..off::CHECKSUM].iter().all(|&b| b == 0));
    }

    #[test]
    fn round_trip_with_extras() {
        let h = sample();
        let x = Extras { pool_bytes: 1 << 24, max_bytes: 1 << 30 };
        let raw = encode_raw(&h, x);
        let (h2, x2) = decode_raw(&raw, 1 << 24).expect("valid copy");
        assert_eq!(h2, h);
        assert_eq!(x2, x);
        // The public encoder records the regions' extent as the pool length.
        let (_, x3) = decode_raw(&encode_header(&h), 1 << 24).expect("valid copy");
        assert_eq!(x3.pool_bytes, h.heap_region.end());
        assert_eq!(x3.max_bytes, 0);
    }

    #[test]
    fn extras_are_checked() {
        let h = sample();
        let end = h.heap_region.end();
        let cases = [
            (Extras { pool_bytes: end + 1, max_bytes: 0 }, "pool_bytes"),
            (Extras { pool_bytes: end - REGION_ALIGN, max_bytes: 0 }, "smaller than the end"),
            (Extras { pool_bytes: end, max_bytes: end - REGION_ALIGN }, "max_bytes"),
            (Extras { pool_bytes: end, max_bytes: end + 7 }, "max_bytes"),
        ];
        for (x, needle) in cases {
            match decode_raw(&encode_raw(&h, x), 1 << 30) {
                Err(CopyError::Invalid { error: PoolError::Corrupt { what }, sequence: 7 }) => {
                    assert!(what.contains(needle), "{what:?} lacks {needle:?}")
                }
                other => panic!("{x:?}: expected Corrupt, got {other:?}"),
            }
        }
        let x = Extras { pool_bytes: end + REGION_ALIGN, max_bytes: 0 };
        match decode_raw(&encode_raw(&h, x), end) {
            Err(CopyError::Invalid { error: PoolError::Truncated { file_bytes, needed }, .. }) => {
                assert_eq!((file_bytes, needed), (end, end + REGION_ALIGN))
            }
            other => panic!("expected Truncated, got {other:?}"),
        }
    }

    #[test]
    fn clean_flag_and_reserved_bytes_are_checked() {
        let h = sample();
        let reseal = |mut raw: Vec<u8>| {
            let crc = crc32fast::hash(&raw[..off::CHECKSUM]);
            raw[off::CHECKSUM..].copy_from_slice(&crc.to_le_bytes());
            raw
        };
        let mut raw = encode_header(&h);
        raw[off::CLEAN] = 2;
        let err = decode_header(&reseal(raw), 1 << 30).unwrap_err();
        assert!(err.to_string().contains("clean_shutdown is 2"), "{err}");
        let mut raw = encode_header(&h);
        raw[off::RESERVED + 100] = 1;
        let err = decode_header(&reseal(raw), 1 << 30).unwrap_err();
        assert!(err.to_string().contains("reserved header byte 344"), "{err}");
    }

    #[test]
    fn close_record_round_trips_and_is_checked() {
        let mut h = sample();
        let saved = Region { offset: h.heap_region.end(), bytes: REGION_ALIGN };
        h.closed = CloseRecord { saved, items: 12345, checksum: 0xfeed_f00d };
        let x = Extras { pool_bytes: saved.end(), max_bytes: 0 };
        let (back, _) = decode_raw(&encode_raw(&h, x), saved.end()).expect("valid copy");
        assert_eq!(back.closed, h.closed);
        let refused = |h: &Header, needle: &str| match decode_raw(&encode_raw(h, x), saved.end()) {
            Err(CopyError::Invalid { error: PoolError::Corrupt { what }, .. }) => {
                assert!(what.contains(needle), "{what:?} lacks {needle:?}")
            }
            other => panic!("expected Corrupt with {needle:?}, got {other:?}"),
        };
        // Only a cleanly closed pool may hold one: the first write after an open clears it.
        refused(&Header { clean_shutdown: false, ..h }, "not cleanly closed");
        // Its region is checked like every other one.
        let overlapping = Region { offset: h.heap_region.offset, bytes: REGION_ALIGN };
        refused(&Header { closed: CloseRecord { saved: overlapping, ..h.closed }, ..h }, "overlaps");
        refused(&Header { closed: CloseRecord { saved: Region::default(), ..h.closed }, ..h }, "empty");
        // A record beyond the file is a truncated pool.
        match decode_raw(&encode_raw(&h, x), saved.offset) {
            Err(CopyError::Invalid { error: PoolError::Truncated { .. }, .. }) => {}
            other => panic!("expected Truncated, got {other:?}"),
        }
    }

    #[test]
    fn version_2_reads_with_an_empty_close_record() {
        let mut raw = encode_header(&sample());
        raw[off::VERSION] = 2;
        let crc = crc32fast::hash(&raw[..off::CHECKSUM]);
        raw[off::CHECKSUM..].copy_from_slice(&crc.to_le_bytes());
        let h = decode_header(&raw, 1 << 30).expect("version 2 is readable");
        assert_eq!((h.version, h.closed), (2, CloseRecord::default()));
        raw[off::VERSION] = 1;
        let crc = crc32fast::hash(&raw[..off::CHECKSUM]);
        raw[off::CHECKSUM..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            decode_header(&raw, 1 << 30),
            Err(PoolError::UnsupportedVersion { found: 1, supported: FORMAT_VERSION })
        ));
    }

    #[test]
    fn wrong_length_is_corrupt() {
        for len in [0, 1, 4095, 4097] {
            let raw = vec![0u8; len];
            assert!(matches!(decode_header(&raw, 1 << 30), Err(PoolError::Corrupt { .. })));
        }
    }

    #[test]
    fn layout_regions_rounds_and_saturates() {
        let (t, h, total) = layout_regions(1, REGION_ALIGN + 1);
        assert_eq!(t, Region { offset: HEADER_AREA, bytes: REGION_ALIGN });
        assert_eq!(h, Region { offset: HEADER_AREA + REGION_ALIGN, bytes: 2 * REGION_ALIGN });
        assert_eq!(total, HEADER_AREA + 3 * REGION_ALIGN);
        let (_, _, total) = layout_regions(u64::MAX, u64::MAX);
        assert_eq!(total, u64::MAX);
    }
}
