//! The slab kernels' WGSL: `shaders/slab_*.wgsl` stitched with the files every table shares
//! (gphash-gpu's `shaders/common/`, the staged write-back kernel) and a generated prelude (the
//! table's constants, bindings and window accessors), by gphash-gpu's preprocessor.

use super::layout::{LOG_HEADER_WORDS, SlabGeometry};
use gphash_gpu::Result;
use gphash_gpu::resources::Binding;
use gphash_gpu::shader::{self, BATCH_BINDINGS, Files, KernelEntry, SHARED, Windows};

/// The slab kernel files.
const KERNELS: Files = &[
    ("slab_common.wgsl", include_str!("../../../shaders/slab_common.wgsl")),
    ("slab_alloc.wgsl", include_str!("../../../shaders/slab_alloc.wgsl")),
    ("slab_log.wgsl", include_str!("../../../shaders/slab_log.wgsl")),
    ("slab_probe.wgsl", include_str!("../../../shaders/slab_probe.wgsl")),
    ("slab_commit.wgsl", include_str!("../../../shaders/slab_commit.wgsl")),
];

/// The first binding of the table windows; heap windows follow them.
pub const FIRST_WINDOW_BINDING: u32 = 5;
/// Control words at the start of the `state` buffer, bound as `control` (twin: `C_*` in
/// `slab_common.wgsl`).
pub const CONTROL_WORDS: u32 = 16;

/// Control word indices (twin: `C_*` in `shaders/slab_common.wgsl`).
pub mod ctl {
    /// Dirty lines appended (`CTRL_DIRTY_COUNT` in `common/ops.wgsl`).
    pub const DIRTY: usize = 0;
    /// Operations that found no free cell.
    pub const NO_CELL: usize = 1;
    /// Insertions that found no free slab.
    pub const NO_SLAB: usize = 2;
    /// Log entries written.
    pub const LOG_COUNT: usize = 3;
    /// Keys published.
    pub const PUBLISHED: usize = 4;
    /// Keys deleted.
    pub const DELETED: usize = 5;
    /// Upserts sent to the next round.
    pub const DEFERRED: usize = 6;
    /// Slabs linked into chains.
    pub const NEW_SLABS: usize = 7;
    /// Operations with an unknown code.
    pub const BAD_KIND: usize = 8;
    /// Operations other than reads.
    pub const MUTATING: usize = 9;
}

/// One compute entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlabKernel {
    /// Fresh cells and the values written into them.
    Alloc,
    /// Give the fresh cells of a batch back.
    Release,
    /// Copy the chains the batch touches into the undo log.
    Log,
    /// A round's walk: reads, finds, claims.
    Probe,
    /// A round's CASes: swing, delete, publish.
    Commit,
    /// Staged placement: gather dirty lines.
    Gather,
}

impl SlabKernel {
    /// Every kernel.
    pub const ALL: [SlabKernel; 6] = [
        SlabKernel::Alloc,
        SlabKernel::Release,
        SlabKernel::Log,
        SlabKernel::Probe,
        SlabKernel::Commit,
        SlabKernel::Gather,
    ];
}

impl KernelEntry for SlabKernel {
    fn file(self) -> &'static str {
        match self {
            SlabKernel::Alloc | SlabKernel::Release => "slab_alloc.wgsl",
            SlabKernel::Log => "slab_log.wgsl",
            SlabKernel::Probe => "slab_probe.wgsl",
            SlabKernel::Commit => "slab_commit.wgsl",
            SlabKernel::Gather => "writeback.wgsl",
        }
    }

    fn entry(self) -> &'static str {
        match self {
            SlabKernel::Alloc => "alloc_cells",
            SlabKernel::Release => "release_cells",
            SlabKernel::Log => "log_chains",
            SlabKernel::Probe => "probe",
            SlabKernel::Commit => "commit",
            SlabKernel::Gather => "main",
        }
    }
}

/// Everything the kernels are specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabShaderConfig {
    /// The table.
    pub geo: SlabGeometry,
    /// Lanes per operation (a power of two, 4 to 32; narrower subgroups use all their lanes).
    pub tile: u32,
    /// Table windows.
    pub table: Windows,
    /// Heap windows.
    pub heap: Windows,
}

impl SlabShaderConfig {
    /// Words of the slab bitmap (pool slabs only; at least one word).
    pub fn slab_bitmap_words(&self) -> u32 {
        self.geo.pool_slabs.div_ceil(32).max(1)
    }

    /// Offset of the slab bitmap in `state`.
    pub fn slab_bitmap(&self) -> u32 {
        CONTROL_WORDS
    }

    /// Offset of the cell bitmap in `state`.
    pub fn cell_bitmap(&self) -> u32 {
        self.slab_bitmap() + self.slab_bitmap_words()
    }

    /// Offset of the bucket marks (the batch that logged each bucket last) in `state`.
    pub fn marks(&self) -> u32 {
        self.cell_bitmap() + self.geo.cell_bitmap_words()
    }

    /// Words of `state`.
    pub fn state_words(&self) -> u64 {
        self.marks() as u64 + self.geo.buckets as u64
    }

    /// The storage bindings of group 0 (each window its own; the batch's are group 1).
    pub fn bindings(&self) -> Vec<Binding> {
        Binding::plain(FIRST_WINDOW_BINDING + self.table.count + self.heap.count, |_| false)
    }
}

/// Parameters of one dispatch (immediates); twin of `Params` in the generated prelude.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SlabParams {
    /// Operations of the batch.
    pub n: u32,
    /// Batch sequence (never 0): bucket marks and allocator start words.
    pub seq: u32,
    /// Entries the dirty list holds.
    pub dirty_cap: u32,
    /// Entries of the claim registry - 1 (a power of two).
    pub claims_mask: u32,
    /// 1: record dirty lines; 0: the host only fences.
    pub track_lines: u32,
    /// Pool offset of the table region, in dirty lines.
    pub table_line_base: u32,
    /// Pool offset of the heap region, in dirty lines.
    pub heap_line_base: u32,
    /// Dirty lines of the table region.
    pub table_lines: u32,
    /// Words of a dirty line (16: 64 bytes, up to 256 GiB pools).
    pub line_words: u32,
    /// 1: the probe serves reads only (before the undo log is durable).
    pub reads_only: u32,
}

impl SlabParams {
    /// Bytes of the immediates that carry them.
    pub const BYTES: u32 = std::mem::size_of::<SlabParams>() as u32;
}

fn prelude(cfg: &SlabShaderConfig) -> String {
    let g = &cfg.geo;
    let mut s = String::new();
    let consts: [(&str, u64); 14] = [
        ("ENTRY_WORDS", g.entry_words() as u64),
        ("ENTRIES", g.entries() as u64),
        ("BUCKETS", g.buckets as u64),
        ("POOL_SLABS", g.pool_slabs as u64),
        ("CELLS", g.cells as u64),
        ("SEED", g.seed as u64),
        ("SLAB_BASE", LOG_HEADER_WORDS as u64),
        ("LOG_BASE", g.log_base() as u64),
        ("LOG_CAP", g.log_capacity() as u64),
        ("SLAB_BITMAP", cfg.slab_bitmap() as u64),
        ("SLAB_BITMAP_WORDS", cfg.slab_bitmap_words() as u64),
        ("CELL_BITMAP", cfg.cell_bitmap() as u64),
        ("CELL_BITMAP_WORDS", g.cell_bitmap_words() as u64),
        ("MARKS", cfg.marks() as u64),
    ];
    // The baseline's cells hold the value only, as SlabHash's do: no checksum word.
    shader::write_consts(&mut s, cfg.tile, g.key_words(), (g.cell_words(), g.cell_words()), &consts);
    s.push_str(
        "
struct Params {
    n: u32,                // operations in the batch
    seq: u32,              // batch sequence, never 0
    dirty_cap: u32,        // entries the dirty list holds
    claims_mask: u32,      // entries of the claim registry - 1
    track_lines: u32,      // 1: record dirty lines
    table_line_base: u32,  // pool offset of the table region, in dirty lines
    heap_line_base: u32,   // pool offset of the heap region, in dirty lines
    table_lines: u32,      // dirty lines of the table region
    line_words: u32,       // words of a dirty line
    reads_only: u32,       // 1: the probe serves reads only
}
",
    );
    s.push_str(BATCH_BINDINGS);
    s.push_str(
        "@group(0) @binding(0) var<storage, read_write> opstate: array<atomic<u32>>;
@group(0) @binding(1) var<storage, read_write> control: array<atomic<u32>>;  // the state buffer
@group(0) @binding(2) var<storage, read_write> claims: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> dirty: array<u32>;
@group(0) @binding(4) var<storage, read_write> staging: array<u32>;
",
    );
    shader::write_windows(
        &mut s,
        FIRST_WINDOW_BINDING,
        &[("table", true, cfg.table), ("heap", false, cfg.heap)],
        shader::Reach::default(),
    );
    s
}

/// The complete source of a kernel.
pub fn source(kernel: SlabKernel, cfg: &SlabShaderConfig) -> Result<String> {
    shader::stitch(kernel.file(), &prelude(cfg), &[SHARED, KERNELS])
}

/// Parses and validates a kernel with naga, as wgpu will; the error names the kernel.
pub fn validate(kernel: SlabKernel, cfg: &SlabShaderConfig) -> Result<naga::Module> {
    shader::check(kernel.file(), &source(kernel, cfg)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(key_bytes: u32, value_bytes: u32, windows: u32, pool: u32, tile: u32) -> SlabShaderConfig {
        let geo = SlabGeometry::new(key_bytes, value_bytes, 100, pool, 5000, 9).unwrap();
        let per = |words: u64| (words * 4).div_ceil(windows as u64).next_power_of_two();
        SlabShaderConfig {
            geo,
            tile,
            table: Windows::cover(geo.table_words(), per(geo.table_words())),
            heap: Windows::cover(geo.heap_words(), per(geo.heap_words())),
        }
    }

    /// A broken slab shader fails here, not in a user's run.
    #[test]
    fn every_slab_kernel_validates() {
        for (k, v, w, pool, tile) in [
            (8, 8, 1, 50, 32),
            (32, 128, 3, 0, 4),
            (4, 1, 2, 7, 8),
            (120, 100, 4, 1000, 16),
            (16, 20, 1, 33, 32),
        ] {
            let cfg = config(k, v, w, pool, tile);
            for kernel in SlabKernel::ALL {
                if let Err(e) = validate(kernel, &cfg) {
                    panic!("key {k} value {v} windows {w}: {e}");
                }
            }
        }
    }

    /// Every control word `C_*` of `slab_common.wgsl` has its twin in [`ctl`], with the value
    /// naga reads from a stitched kernel.
    #[test]
    fn wgsl_control_words_match_rust() {
        let rust = [
            ("CTRL_DIRTY_COUNT", ctl::DIRTY),
            ("C_NO_CELL", ctl::NO_CELL),
            ("C_NO_SLAB", ctl::NO_SLAB),
            ("C_LOG_COUNT", ctl::LOG_COUNT),
            ("C_PUBLISHED", ctl::PUBLISHED),
            ("C_DELETED", ctl::DELETED),
            ("C_DEFERRED", ctl::DEFERRED),
            ("C_NEW_SLABS", ctl::NEW_SLABS),
            ("C_BAD_KIND", ctl::BAD_KIND),
            ("C_MUTATING", ctl::MUTATING),
        ];
        let (_, common) = KERNELS.iter().find(|(f, _)| *f == "slab_common.wgsl").unwrap();
        for name in shader::declared_consts(common).into_iter().filter(|n| n.starts_with("C_")) {
            assert!(rust.iter().any(|(n, _)| *n == name), "{name} has no twin in `ctl`");
        }
        let module = validate(SlabKernel::Probe, &config(8, 8, 1, 10, 32)).unwrap();
        let wgsl = shader::u32_consts(&module);
        for (name, v) in rust {
            assert_eq!(wgsl.get(name), Some(&(v as u32)), "WGSL {name} differs from its Rust twin");
        }
        assert!((ctl::MUTATING as u32) < CONTROL_WORDS);
    }

    /// The immediates the host writes have the layout the kernels read: same fields, offsets, size.
    #[test]
    fn params_layout_matches_wgsl() {
        let module = validate(SlabKernel::Probe, &config(8, 8, 1, 10, 32)).unwrap();
        let rust = gphash_gpu::rust_layout!(SlabParams {
            n,
            seq,
            dirty_cap,
            claims_mask,
            track_lines,
            table_line_base,
            heap_line_base,
            table_lines,
            line_words,
            reads_only,
        });
        assert_eq!(shader::wgsl_layout(&module, "Params"), Some(rust));
    }

    #[test]
    fn includes_expand_once() {
        let src = source(SlabKernel::Probe, &config(8, 8, 1, 10, 32)).unwrap();
        assert_eq!(src.matches("fn fmix(").count(), 1);
        assert_eq!(src.matches("fn tile_of(").count(), 1);
        assert!(!src.contains("#include"));
    }
}
