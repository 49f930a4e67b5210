//! WGSL sources: gphash's kernels in `shaders/`, stitched by `gphash_gpu`'s `#include`
//! preprocessor with the files every table shares and a generated prelude (the table's
//! constants, bindings and window accessors).

use std::fmt::Write;

use gphash_gpu::resources::{Binding, check_bindings};
use gphash_gpu::shader::{
    BATCH_BINDINGS, BATCH_BUFFERS, Files, KernelEntry, Reach, SHARED, Windows, accessor, declare_windows,
    stitch, write_consts, write_windows,
};
use gphash_gpu::{DeviceInfo, Error, Result};

use crate::hash::Seeds;
use crate::layout::Geometry;

/// gphash's storage buffers in bind group 0 (the batch's are group 1, [`BATCH_BINDINGS`]), in
/// binding order from 0: name, WGSL element type, read-only. Windows of the table, the heap,
/// the cache's group copies, the cache's values and the cell allocator's bitmap (and, for
/// resize kernels, the old table) follow them.
pub(crate) const TABLE_BINDINGS: [(&str, &str, bool); 10] = [
    ("opstate", "atomic<u32>", false),
    ("control", "atomic<u32>", false),
    ("dirty", "u32", false),
    // The allocator's summary (bit w set: bitmap word w is full, so a scan skips it) and a
    // next-fit cursor per arena from word ALLOC_CURSOR on (`Bitmap::allocator_words`). One
    // binding: a heap of 2^35 cells has 128 MiB of summary, lavapipe's binding size.
    ("allocator", "atomic<u32>", false),
    ("staging", "u32", false),
    ("claims", "atomic<u32>", false),
    // BktCache: group -> entry, entry -> group, per-group access counts, a loading slice.
    ("cache_map", "u32", false),
    ("cache_owner", "u32", false),
    ("cache_counts", "atomic<u32>", false),
    ("cache_plan", "u32", true),
];

/// Binding of the first table window.
pub(crate) const FIRST_WINDOW_BINDING: u32 = TABLE_BINDINGS.len() as u32;

/// gphash's kernel files, and the code only they share (`shaders/common/`).
const KERNELS: Files = &[
    ("alloc.wgsl", include_str!("../../shaders/alloc.wgsl")),
    ("phase_a.wgsl", include_str!("../../shaders/phase_a.wgsl")),
    ("phase_b.wgsl", include_str!("../../shaders/phase_b.wgsl")),
    ("release.wgsl", include_str!("../../shaders/release.wgsl")),
    ("resize.wgsl", include_str!("../../shaders/resize.wgsl")),
    ("cache.wgsl", include_str!("../../shaders/cache.wgsl")),
    ("common/cells.wgsl", include_str!("../../shaders/common/cells.wgsl")),
    ("common/probe.wgsl", include_str!("../../shaders/common/probe.wgsl")),
    ("common/protocol.wgsl", include_str!("../../shaders/common/protocol.wgsl")),
    ("common/table.wgsl", include_str!("../../shaders/common/table.wgsl")),
];

/// One compute entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    /// Phase A, first step: allocate value cells and write the values.
    Alloc,
    /// Phase A: look up, claim.
    PhaseA,
    /// Phase A of a batch of gets: the lookups alone.
    Search,
    /// Phase B: swing, delete, resolve, publish.
    PhaseB,
    /// After phase B: release replaced and unused cells.
    FreeCells,
    /// Undo phase A of a batch that cannot complete.
    Rollback,
    /// After phase B or a rollback: write the slots it changed through to their cached copies.
    CacheRefresh,
    /// A slice of a cache loading phase: copy groups (and their values) into entries.
    CacheFill,
    /// At a loading phase: halve the access counts (LFU ageing).
    CacheDecay,
    /// Staged mode: gather dirty lines for the host.
    Writeback,
    /// Resizing: copy the kept buckets of the old table to the new one.
    Relocate,
    /// Resizing: insert the keys of the old bottom level into the new table.
    Rehash,
}

impl Kernel {
    /// The kernels of batches.
    pub(crate) const BATCH: [Kernel; 10] = [
        Kernel::Alloc,
        Kernel::PhaseA,
        Kernel::Search,
        Kernel::PhaseB,
        Kernel::FreeCells,
        Kernel::Rollback,
        Kernel::Writeback,
        Kernel::CacheRefresh,
        Kernel::CacheFill,
        Kernel::CacheDecay,
    ];

    /// The kernels of a resize (they need a [`KernelConfig::source`]).
    pub(crate) const RESIZE: [Kernel; 2] = [Kernel::Relocate, Kernel::Rehash];

    /// Its place in [`Kernel::BATCH`], which [`crate::KernelTimes::NAMES`] follows (`None`: a
    /// resize kernel, never timed).
    pub(crate) fn batch_index(self) -> Option<usize> {
        Kernel::BATCH.iter().position(|&k| k == self)
    }

    /// Whether the kernel writes the pool's regions (staged mode then gathers dirty lines).
    pub(crate) fn writes_pool(self) -> bool {
        matches!(self, Kernel::Alloc | Kernel::PhaseA | Kernel::PhaseB | Kernel::Rollback)
    }
}

impl KernelEntry for Kernel {
    fn file(self) -> &'static str {
        match self {
            Kernel::Alloc => "alloc.wgsl",
            Kernel::PhaseA | Kernel::Search => "phase_a.wgsl",
            Kernel::PhaseB => "phase_b.wgsl",
            Kernel::FreeCells | Kernel::Rollback => "release.wgsl",
            Kernel::Writeback => "writeback.wgsl",
            Kernel::Relocate | Kernel::Rehash => "resize.wgsl",
            Kernel::CacheRefresh | Kernel::CacheFill | Kernel::CacheDecay => "cache.wgsl",
        }
    }

    fn entry(self) -> &'static str {
        match self {
            Kernel::Search => "search",
            Kernel::FreeCells => "free_cells",
            Kernel::Rollback => "rollback",
            Kernel::Relocate => "relocate",
            Kernel::Rehash => "rehash",
            Kernel::CacheRefresh => "refresh",
            Kernel::CacheFill => "fill",
            Kernel::CacheDecay => "decay",
            _ => "main",
        }
    }
}

/// Everything a kernel is specialised on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KernelConfig {
    /// Table geometry.
    pub geo: Geometry,
    /// Hash seeds.
    pub seeds: Seeds,
    /// Lanes per operation (a power of two, 4 to 32); narrower subgroups use all their lanes.
    pub tile: u32,
    /// Table bindings.
    pub table: Windows,
    /// Heap bindings.
    pub heap: Windows,
    /// Bindings of the value-cell allocator's bitmap (device memory; a heap of 2^32 cells has
    /// 512 MiB of it, past one binding on many devices).
    pub bitmap: Windows,
    /// The bucket cache.
    pub cache: CacheConfig,
    /// The old table of a resize, read-only (resize kernels only).
    pub source: Option<Source>,
    /// Reads check their value's checksum (see `Options::verify_values`).
    pub verify_values: bool,
    /// How the kernels reach the pool (see [`KernelConfig::settle_reach`]).
    pub reach: Reach,
}

/// How the kernels see the bucket cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheConfig {
    /// Entries (0: no cache; the kernels then never read the cache's buffers).
    pub entries: u32,
    /// How phase A records accesses ([`crate::cache::Policy::count_mode`]).
    pub count_mode: u32,
    /// Bindings of the entries' group copies.
    pub table: Windows,
    /// Bindings of the entries' values.
    pub heap: Windows,
}

impl CacheConfig {
    /// No cache: one tiny window each, never read.
    pub(crate) fn off() -> Self {
        let tiny = Windows::cover(16, 64);
        CacheConfig { entries: 0, count_mode: 0, table: tiny, heap: tiny }
    }
}

/// The table a resize reads from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Source {
    /// Its bindings.
    pub windows: Windows,
    /// Its top level.
    pub top_level: u32,
    /// Word offset of its key array (keys apart).
    pub keys_base: u64,
    /// Its words.
    pub words: u64,
    /// Slots of its bottom level (its groups' last buckets), which `rehash` inserts anew.
    pub bottom_slots: u64,
}

impl KernelConfig {
    /// Words of the allocation bitmap.
    pub(crate) fn bitmap_words(&self) -> u32 {
        self.geo.cells.div_ceil(32) as u32
    }

    /// The bindings of group 0 in order: the table's buffers, then each region's windows (a
    /// binding each, or one binding array as `reach` says).
    pub(crate) fn bindings(&self) -> Vec<Binding> {
        let mut bindings = Binding::plain(FIRST_WINDOW_BINDING, |i| TABLE_BINDINGS[i as usize].2);
        let regions = self.windows().map(|(_, _, w)| (w, false));
        for (w, read_only) in regions.into_iter().chain(self.source.map(|s| (s.windows, true))) {
            match self.reach.arrays {
                true => bindings.push(Binding { read_only, array: Some(w.count) }),
                false => bindings.extend((0..w.count).map(|_| Binding { read_only, array: None })),
            }
        }
        bindings
    }

    /// Chooses how the kernels reach the pool and checks that the device can: 64-bit word
    /// addresses where a region exceeds 2^32 words (16 GiB), binding arrays where its windows
    /// need more storage bindings than the device has; both where `large` asks for them (the
    /// arrays where the device has them).
    pub(crate) fn settle_reach(&mut self, info: &DeviceInfo, large: bool) -> Result<()> {
        let words = [self.geo.table_words(), self.geo.heap_words(), self.source.map_or(0, |s| s.words)];
        let largest = words.into_iter().max().unwrap_or(0);
        let wide = large || largest > u32::MAX as u64;
        if wide && !info.int64 {
            return Err(Error::MissingFeature(format!(
                "{} has no 64-bit integers in shaders (wgpu::Features::SHADER_INT64), which a region of \
                 {} bytes needs: without them a table and its heap are limited to 16 GiB each",
                info.name,
                largest * 4
            )));
        }
        self.reach = Reach { wide, arrays: false };
        let separate = self.bindings().len() as u32 + BATCH_BUFFERS;
        let arrays = (large && info.binding_arrays > 0) || separate > info.max_storage_buffers;
        if arrays && info.binding_arrays == 0 {
            return Err(Error::MissingFeature(format!(
                "the pool needs {separate} storage bindings; {} allows {} and has no binding arrays of \
                 storage buffers (wgpu::Features::BUFFER_BINDING_ARRAY and STORAGE_RESOURCE_BINDING_ARRAY)",
                info.name, info.max_storage_buffers
            )));
        }
        let most = self.windows().iter().map(|w| w.2.count).chain(self.source.map(|s| s.windows.count)).max();
        if arrays && most.unwrap_or(0) > info.binding_arrays {
            return Err(Error::InvalidConfig(format!(
                "a region of the pool needs {} windows; {} binds at most {} in an array",
                most.unwrap_or(0),
                info.name,
                info.binding_arrays
            )));
        }
        self.reach = Reach { wide, arrays };
        check_bindings("the table", self.bindings().len() as u32 + BATCH_BUFFERS, info)
    }

    /// The read-write windows in binding order: table, heap, cache copies, cache values, the
    /// allocator's bitmap (name, whether its words are atomic, windows).
    pub(crate) fn windows(&self) -> [(&'static str, bool, Windows); 5] {
        [
            ("table", true, self.table),
            ("heap", false, self.heap),
            ("ctable", true, self.cache.table),
            ("cheap", false, self.cache.heap),
            ("cellmap", true, self.bitmap),
        ]
    }
}

/// Parameters of one dispatch (immediates); twin of `Params` in the generated prelude.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    /// Operations (invocations) of the dispatch.
    pub n: u32,
    /// Entries the dirty list holds.
    pub dirty_cap: u32,
    /// Pool offset of the table region, in dirty lines (64 bytes up to 256 GiB; see
    /// `gphash_gpu::resources::line_shift`).
    pub table_line_base: u32,
    /// Pool offset of the heap region, in dirty lines.
    pub heap_line_base: u32,
    /// Dirty lines of the table region.
    pub table_lines: u32,
    /// Words of a dirty line (16 << the line shift).
    pub line_words: u32,
    /// Entries of the claim registry - 1 (a power of two).
    pub claims_mask: u32,
    /// 1: record dirty lines; 0: the host only fences.
    pub track_lines: u32,
    /// The batch's number (LRU access stamps).
    pub stamp: u32,
    /// Phase A counts one access in this many for the cache (0: none); see [`crate::cache::counted`].
    pub count_every: u32,
    /// Phase A's invocations per operation (a power of two up to its tile); see
    /// `GpuEngine::phase_a_lanes`.
    pub spread: u32,
    /// Lanes of phase A's tiles (`GpuEngine::phase_a_lanes`).
    pub tile: u32,
}

impl Params {
    /// Bytes of the immediates that carry them.
    pub(crate) const BYTES: u32 = std::mem::size_of::<Params>() as u32;
}

/// The generated prelude: constants, bindings and window accessors.
fn prelude(cfg: &KernelConfig) -> String {
    let g = &cfg.geo;
    let l = &g.layout;
    let mut s = cfg.reach.enables().to_string();
    let consts: [(&str, u64); 21] = [
        ("SLOTS", l.slots as u64),
        ("LEVELS", l.levels as u64),
        ("HASHES", l.hashes as u64),
        ("TOP_LEVEL", g.top_level as u64),
        ("CANDIDATES", l.candidates() as u64),
        ("CANDIDATE_BUCKETS", l.candidate_buckets() as u64),
        ("GROUP_BUCKETS", l.group_buckets() as u64),
        ("BUCKET_WORDS", g.bucket_words() as u64),
        ("GROUP_WORDS", g.group_words()),
        ("GROUP_SLOTS", g.group_slots()),
        ("GROUPS", g.groups()),
        ("ALLOC_CURSOR", crate::model::Bitmap::summary_words(cfg.bitmap_words() as usize) as u64),
        ("ARENAS", g.arenas()),
        ("ARENA_BITS", g.arena_bits as u64),
        ("ARENA_CELLS", g.arena_cells()),
        ("ARENA_WORDS", g.arena_cells().div_ceil(32)),
        ("KEYS_APART", g.keys_apart as u64),
        ("LOCATION_BITS", g.location_bits() as u64),
        ("CACHE_ENTRIES", cfg.cache.entries as u64),
        ("CACHE_COUNT", cfg.cache.count_mode as u64),
        ("VERIFY_VALUES", cfg.verify_values as u64),
    ];
    write_consts(&mut s, cfg.tile, g.key_words(), (g.value_words(), g.cell_words()), &consts);
    let seeds: Vec<String> = cfg.seeds.locations.iter().map(|v| format!("{v}u")).collect();
    writeln!(s, "const LOCATION_SEEDS = array<u32, {}>({});", seeds.len(), seeds.join(", ")).unwrap();
    writeln!(s, "const FINGERPRINT_SEED: u32 = {}u;", cfg.seeds.fingerprint).unwrap();
    s.push_str(
        "
struct Params {
    n: u32,                // operations in the batch
    dirty_cap: u32,        // entries the dirty list holds
    table_line_base: u32,  // pool offset of the table region, in dirty lines
    heap_line_base: u32,   // pool offset of the heap region, in dirty lines
    table_lines: u32,      // dirty lines of the table region
    line_words: u32,       // words of a dirty line (16: 64 bytes, up to 256 GiB pools)
    claims_mask: u32,      // entries of the claim registry - 1 (a power of two)
    track_lines: u32,      // 1: record dirty lines (the host persists them); 0: it only fences
    stamp: u32,            // the batch's number (LRU access stamps)
    count_every: u32,      // the cache counts one access in this many (0: none)
    spread: u32,           // phase A's invocations per operation
    tile: u32,             // lanes of phase A's tiles
}
",
    );
    s.push_str(BATCH_BINDINGS);
    for (i, (name, ty, read_only)) in TABLE_BINDINGS.iter().enumerate() {
        let access = if *read_only { "read" } else { "read_write" };
        writeln!(s, "@group(0) @binding({i}) var<storage, {access}> {name}: array<{ty}>;").unwrap();
    }
    let word = |v: u64| cfg.reach.word(v);
    writeln!(s, "const KEYS_BASE: Word = {};", word(g.keys_base())).unwrap();
    let binding = write_windows(&mut s, FIRST_WINDOW_BINDING, &cfg.windows(), cfg.reach);
    if let Some(src) = cfg.source {
        writeln!(s, "const SOURCE_TOP_LEVEL: u32 = {}u;", src.top_level).unwrap();
        writeln!(s, "const SOURCE_KEYS_BASE: Word = {};", word(src.keys_base)).unwrap();
        writeln!(s, "const SOURCE_WORDS: Word = {};", word(src.words)).unwrap();
        writeln!(s, "const SOURCE_BOTTOM_SLOTS: Word = {};", word(src.bottom_slots)).unwrap();
        declare_windows(&mut s, binding, "source", (false, true), src.windows, cfg.reach);
        accessor(&mut s, "source_load(a: Word) -> u32", "return {word};", ("source", src.windows), cfg.reach);
    }
    s
}

/// The complete source of a kernel for a configuration.
pub(crate) fn source(kernel: Kernel, cfg: &KernelConfig) -> Result<String> {
    stitch(kernel.file(), &prelude(cfg), &[SHARED, KERNELS])
}

/// Parses and validates a kernel with naga, as wgpu will; the error names the kernel.
#[cfg(test)]
pub(crate) fn validate(kernel: Kernel, cfg: &KernelConfig) -> Result<naga::Module> {
    gphash_gpu::shader::check(kernel.file(), &source(kernel, cfg)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;

    fn config(layout: &str, key_bytes: u32, value_bytes: u32, windows: u32) -> KernelConfig {
        let layout: Layout = layout.parse().unwrap();
        let geo = Geometry::new(layout, key_bytes, value_bytes, 9, 5000).unwrap();
        let table =
            Windows::cover(geo.table_words(), geo.table_bytes().div_ceil(windows as u64).next_power_of_two());
        let heap =
            Windows::cover(geo.heap_words(), geo.heap_bytes().div_ceil(windows as u64).next_power_of_two());
        let source = Some(Source {
            windows: table,
            top_level: geo.top_level - 1,
            keys_base: geo.keys_base() / 2,
            words: geo.table_words() / 2,
            bottom_slots: geo.groups() / 2 * layout.slots as u64,
        });
        let cache = CacheConfig { entries: 3, count_mode: 1, table: heap, heap: table };
        KernelConfig {
            seeds: Seeds::new(7, layout.hashes),
            geo,
            tile: 32,
            table,
            heap,
            bitmap: Windows::cover(geo.cells.div_ceil(32), 64),
            cache,
            source,
            verify_values: value_bytes % 2 == 1,
            reach: Reach { wide: windows.is_multiple_of(2), arrays: windows > 2 },
        }
    }

    /// The profile names the batch kernels in `Kernel::BATCH`'s order.
    #[test]
    fn kernel_times_name_the_batch_kernels() {
        let snake = |k: Kernel| {
            let mut s = String::new();
            for c in format!("{k:?}").chars() {
                if c.is_uppercase() && !s.is_empty() {
                    s.push('_');
                }
                s.push(c.to_ascii_lowercase());
            }
            s
        };
        let names: Vec<String> = Kernel::BATCH.into_iter().map(snake).collect();
        assert_eq!(names, crate::KernelTimes::NAMES);
        for (i, k) in Kernel::BATCH.into_iter().enumerate() {
            assert_eq!(k.batch_index(), Some(i));
        }
        assert!(Kernel::RESIZE.iter().all(|k| k.batch_index().is_none()));
    }

    /// A broken shader fails here, not in a user's run.
    #[test]
    fn every_kernel_validates_for_many_configurations() {
        for (layout, k, v, w) in [
            ("2L-2H-8S", 8, 8, 1),
            ("2L-2H-8S", 32, 128, 3),
            ("1L-1H-8S", 4, 1, 1),
            ("4L-2H-16S", 16, 100, 4),
            ("3L-3H-8S", 256, 7, 2),
        ] {
            let mut cfg = config(layout, k, v, w);
            if k == 16 {
                cfg.geo = cfg.geo.with_keys_apart(true).unwrap();
            }
            for kernel in Kernel::BATCH.into_iter().chain(Kernel::RESIZE) {
                if let Err(e) = validate(kernel, &cfg) {
                    panic!("{layout} key {k} value {v} windows {w}: {e}");
                }
            }
        }
    }

    /// The WGSL protocol constants are kept by hand rather than generated from these: the shared
    /// `common/ops.wgsl` lives in gphash-gpu, below this crate, and serves the slab baseline too.
    /// So every constant of `common/protocol.wgsl` and `common/ops.wgsl` must appear here, with
    /// the value naga reads from the stitched kernel.
    #[test]
    fn wgsl_protocol_constants_match_rust() {
        use crate::layout::{EMPTY, INSERTING, PUBLISHED};
        use crate::protocol::{NONE, OpKind, OpState, Status, control, phase};
        use std::mem::offset_of;
        let word = |bytes: usize| (bytes / 4) as u32;
        let rust: Vec<(&str, u32)> = vec![
            ("OP_GET", OpKind::Get as u32),
            ("OP_INSERT", OpKind::Insert as u32),
            ("OP_UPSERT", OpKind::Upsert as u32),
            ("OP_UPDATE", OpKind::Update as u32),
            ("OP_DELETE", OpKind::Delete as u32),
            ("STATUS_OK", Status::Ok as u32),
            ("STATUS_NOT_FOUND", Status::NotFound as u32),
            ("STATUS_EXISTS", Status::Exists as u32),
            ("STATUS_CORRUPT", Status::Corrupt as u32),
            ("NONE", NONE),
            ("PHASE_DONE", phase::DONE),
            ("PHASE_FOUND", phase::FOUND),
            ("PHASE_CLAIMED", phase::CLAIMED),
            ("PHASE_FULL", phase::FULL),
            ("PHASE_NO_CELL", phase::NO_CELL),
            ("PHASE_JOINED", phase::JOINED),
            ("PHASE_FOLLOWS", phase::FOLLOWS),
            ("EMPTY", EMPTY),
            ("INSERTING", INSERTING),
            ("PUBLISHED", PUBLISHED),
            ("CTRL_DIRTY_COUNT", control::DIRTY_COUNT as u32),
            ("CTRL_NEED_B", control::NEED_B as u32),
            ("CTRL_FULL", control::FULL as u32),
            ("CTRL_NO_CELL", control::NO_CELL as u32),
            ("CTRL_PUBLISHED", control::PUBLISHED as u32),
            ("CTRL_DELETED", control::DELETED as u32),
            ("CTRL_CACHE_TARGETS", control::CACHE_TARGETS as u32),
            ("CTRL_CACHE_HITS", control::CACHE_HITS as u32),
            ("CTRL_CACHE_GROUPS_SAVED", control::CACHE_GROUPS_SAVED as u32),
            ("CTRL_CACHE_VALUES_SAVED", control::CACHE_VALUES_SAVED as u32),
            ("CTRL_CACHE_REFRESHED", control::CACHE_REFRESHED as u32),
            ("CTRL_CACHE_STALE", control::CACHE_STALE as u32),
            ("CTRL_CACHE_FILLED", control::CACHE_FILLED as u32),
            ("CTRL_ALLOCATED", control::ALLOCATED as u32),
            ("CTRL_REFUSED", control::REFUSED as u32),
            ("CTRL_WORDS", control::WORDS as u32),
            ("ST_PHASE", word(offset_of!(OpState, phase))),
            ("ST_BUCKET", word(offset_of!(OpState, bucket))),
            ("ST_CELL", word(offset_of!(OpState, cell))),
            ("ST_FREE", word(offset_of!(OpState, free))),
            ("ST_LAST_WRITE", word(offset_of!(OpState, last_write))),
            ("ST_FIRST_DELETE", word(offset_of!(OpState, first_delete))),
            ("ST_FOUND", word(offset_of!(OpState, found))),
            ("ST_ARENA", word(offset_of!(OpState, arena))),
            ("ST_SLOT", word(offset_of!(OpState, slot))),
            ("ST_WORDS", OpState::WORDS as u32),
        ];
        assert_eq!(OpState::WORDS as usize * 4, std::mem::size_of::<OpState>());
        let module = validate(Kernel::PhaseB, &config("2L-2H-8S", 8, 8, 1)).unwrap();
        let wgsl = gphash_gpu::shader::u32_consts(&module);
        for (file, text) in SHARED.iter().chain(KERNELS) {
            if ["common/ops.wgsl", "common/protocol.wgsl"].contains(file) {
                for name in gphash_gpu::shader::declared_consts(text) {
                    assert!(rust.iter().any(|(n, _)| *n == name), "{file}: {name} has no Rust twin here");
                }
            }
        }
        for (name, v) in rust {
            assert_eq!(wgsl.get(name), Some(&v), "WGSL {name} differs from its Rust twin");
        }
    }

    /// The immediates the host writes have the layout the kernels read: same fields, offsets, size.
    #[test]
    fn params_layout_matches_wgsl() {
        let module = validate(Kernel::PhaseA, &config("2L-2H-8S", 8, 8, 1)).unwrap();
        let rust = gphash_gpu::rust_layout!(Params {
            n,
            dirty_cap,
            table_line_base,
            heap_line_base,
            table_lines,
            line_words,
            claims_mask,
            track_lines,
            stamp,
            count_every,
            spread,
            tile,
        });
        assert_eq!(gphash_gpu::shader::wgsl_layout(&module, "Params"), Some(rust));
    }

    #[test]
    fn includes_expand_once_and_unknown_files_fail() {
        let cfg = config("2L-2H-8S", 8, 8, 1);
        let src = source(Kernel::PhaseA, &cfg).unwrap();
        assert_eq!(src.matches("fn fmix(").count(), 1);
        assert!(!src.contains("#include"));
        assert!(stitch("nope.wgsl", "", &[SHARED]).is_err());
    }
}
