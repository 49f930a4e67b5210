//! `cpu`: the CPU-assisted baseline (DESIGN §9). Each batch is copied from the GPU to the host,
//! applied by all host threads to a persistent CPU hash table modelled on TurboHash (seed 003)
//! in a host-pm pool of the same kind gphash uses (tmpfs or regular file, devdax, anonymous),
//! and its results are copied back to the GPU.
//!
//! # The table ([`CpuTable`])
//!
//! TurboHash's structure, simplified where a batch-at-a-time baseline allows it:
//!
//! - **Shards.** A 32-bit hash of the key picks its shard (a power of two of them, about four
//!   per thread); a second hash picks its home bucket inside the shard. Each host thread owns
//!   a run of whole shards for the length of a batch, so no locks are taken. The threads are
//!   spawned once and handed a task per batch phase (spawning per phase would cost more than a
//!   4096-operation batch's work); between phases they spin, yielding, for up to 1 ms before
//!   they sleep. A batch uses one thread per 256 operations (at most all, one per shard).
//! - **Buckets** of 256 bytes (4 cache lines, Optane's block): one metadata word (valid bitmap
//!   and an overflow bit), a one-byte tag per slot, then slots holding the key in place and the
//!   index of its value cell. A search reads the metadata line, compares tags, and reads only
//!   the slots whose tag matches. Layout in [`layout`].
//! - **Linear probing** over the following buckets of the same shard, up to 16 (TurboHash's
//!   probing scope). Instead of TurboHash's path-end rule (a bucket with two empty slots) the
//!   table keeps an overflow bit per bucket, set on every bucket an insertion passed over; a
//!   search stops at the first bucket without it, so deletions never break a probe path and a
//!   miss usually reads one metadata line. Recovery recomputes the bits exactly.
//! - **Values** live out of place in fixed-size cells of a value heap, each shard with its own
//!   cells and a volatile free list rebuilt on open from the valid slots.
//! - **No resizing.** The table is sized for `capacity` keys at load 0.75; an insertion whose
//!   probe window is full fails its batch with [`gphash::Error::TableFull`] (nothing applied).
//!   Benchmarks size it for their key count.
//!
//! # A batch
//!
//! Operations are partitioned by shard (each thread hashes a slice of the batch for all), and
//! each thread takes its operations in batch order. Each thread keeps its buffers (partition,
//! overlay, plan) from batch to batch: freed per batch, their pages went back to the kernel
//! and were faulted in again by the next batch, which cost a write batch more than its work.
//!
//! 1. **Plan and write data.** Each operation is applied to a volatile overlay of the keys it
//!    touched (looked up in the table once), which fixes its status and the value a read
//!    returns: the results of one-by-one application in batch order. The lookups are
//!    software-pipelined: home buckets are prefetched 16 operations ahead, the cell a lookup
//!    finds 8 ahead. Then, per distinct key, the net change is written out of place: a new
//!    value cell (insert, update) and, for a key that was absent, its key, cell index and tag
//!    in a slot whose valid bit is clear, plus overflow bits on the buckets it passed over.
//!    Only space no valid slot refers to is written. Persist point 1.
//! 2. **Commit.** Each net change becomes visible with one aligned store: an insert sets its
//!    valid bit and a delete clears it (one 8-byte metadata word per bucket, whatever number
//!    of keys of the bucket change), an update swaps the slot's 4-byte cell index; threads
//!    without a change sit this phase out. Persist point 2. Only now are the replaced and
//!    removed cells freed and results returned.
//!
//! A key inserted and deleted in one batch writes nothing; one deleted and inserted again is
//! an update of its slot. Cells freed by a batch are reused only by later batches.
//!
//! A persist point persists the lines the phase wrote (cache-line flushes and a fence on
//! devdax, `msync` of their pages on a file) or is one fence (tmpfs) or nothing (anonymous
//! memory); the threads write, the calling thread persists once all are done. A batch that
//! finds a full probe window or no free cell is rolled back before persist point 1 (nothing
//! was published; its cells go back to the free lists) and returns the error. A failed persist
//! at point 2 leaves the table refusing batches ([`gphash::Error::Poisoned`]) until reopened.
//!
//! # Crash consistency (log-free)
//!
//! The durable content is: the keys of valid slots, each with the value of the cell its slot
//! names. Consider a crash with any subset of the 8-byte words written since the last persist
//! point reaching the medium:
//!
//! - **During phase 1:** the words written belong to cells no valid slot names, to slots whose
//!   valid bit is clear, or are overflow bits being set (which only make searches longer). The
//!   content is that of the last acknowledged batch.
//! - **During phase 2:** every cell and slot written in phase 1 is durable. Each key's net
//!   change is a single aligned store, so each key is either as before the batch or as after
//!   it: a set valid bit publishes a complete slot, a cleared one removes the key (its slot and
//!   cell stay intact until a later batch), a cell index names either the intact old cell
//!   (not freed before persist point 2) or the durable new one. Keys sharing a metadata word
//!   change together; the other half of the 8-byte word holding a cell index belongs to slot
//!   bytes that phase 2 does not change. No key can be published twice: a new slot is used
//!   only for a key absent before the batch.
//! - **After persist point 2** the batch is durable; only then does `execute` return.
//!
//! [`CpuTable::open`] needs no log: it rebuilds the free cells from the valid slots (cells of
//! an interrupted batch that no valid slot names become free), makes the overflow bits exact
//! (clearing an unneeded bit or setting a needed one leaves every key reachable, at every
//! crash point of the repair too), and refuses damage it can see (a cell outside the slot's
//! shard or named twice, a key in the wrong shard, beyond its probe window or with the wrong
//! tag). The pool header is host-pm's A/B header; `clean_shutdown` tells whether the table was
//! closed.
//!
//! # Traffic model ([`System::traffic`])
//!
//! Host-memory cache lines touched per operation, each one request of 64 bytes: a search reads
//! the metadata line of each bucket it probes (the mean probe length is measured from the
//! overflow bits, [`CpuTable::probe_buckets`]), the lines of each slot whose tag matches (the
//! key's own slot on a hit, and false tag matches at `keys per bucket / 256` per probed
//! bucket), and a read hit the lines of its value cell. Writes: an insertion writes its value
//! cell, its slot, and its bucket's metadata line twice (tag in phase 1, valid bit in phase 2);
//! an update writes a value cell and the line of its slot's cell index; a delete writes the
//! metadata line. Slots and cells are counted with the mean number of lines they straddle. The
//! batch's copies over PCIe are not table traffic; [`CpuSystem::transfer`] gives them.

pub mod layout;
pub mod table;
mod workers;

use std::path::Path;
use std::sync::Arc;

pub use table::{CpuConfig, CpuTable, Recovery};

use crate::systems::{HostBatches, System, Traffic};
use gphash::DeviceBatch;
use gphash::Gpu;
use gphash::OpKind;
use gphash::Result;

/// The `cpu` baseline as a [`System`]: batches copied to the host, applied by a [`CpuTable`],
/// results copied back.
pub struct CpuSystem {
    table: CpuTable,
    host: HostBatches,
}

impl std::fmt::Debug for CpuSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuSystem")
            .field("table", &self.table)
            .field("gpu", &self.host.gpu().info.name)
            .finish()
    }
}

impl CpuSystem {
    /// A new table for `capacity` keys (at load 0.75) in a new pool at `path` (`None`:
    /// anonymous memory), run by `threads` host threads (0 = all), fed from `gpu`.
    pub fn create(
        path: Option<&Path>,
        key_bytes: u32,
        value_bytes: u32,
        capacity: u64,
        gpu: Arc<Gpu>,
        threads: usize,
    ) -> Result<Self> {
        let (key_bytes, value_bytes) = (key_bytes as usize, value_bytes as usize);
        let config = CpuConfig { key_bytes, value_bytes, capacity, threads, ..CpuConfig::default() };
        Ok(CpuSystem::from_table(CpuTable::create(path, &config)?, gpu))
    }

    /// Opens (and recovers) an existing pool.
    pub fn open(path: &Path, gpu: Arc<Gpu>, threads: usize) -> Result<Self> {
        Ok(CpuSystem::from_table(CpuTable::open(path, threads)?, gpu))
    }

    /// A system over a table built some other way.
    pub fn from_table(table: CpuTable, gpu: Arc<Gpu>) -> Self {
        let g = table.geometry();
        let host = HostBatches::new(gpu, g.key_words(), g.cell_words());
        CpuSystem { table, host }
    }

    /// The table.
    pub fn table(&self) -> &CpuTable {
        &self.table
    }

    /// The table, writable (thread count, persist mode).
    pub fn table_mut(&mut self) -> &mut CpuTable {
        &mut self.table
    }

    /// Clean close of the table.
    pub fn close(self) -> Result<()> {
        self.table.close()
    }

    /// Bytes one operation of `kind` moves over PCIe (`requests` = the two copies of a batch
    /// shared by its operations are not counted): down its code, key and value words; up its
    /// status and, for a read, the value found. Batches with no read skip the upload of values.
    pub fn transfer(&self, kind: OpKind) -> Traffic {
        let g = self.table.geometry();
        let down = 4 + g.key_bytes + g.cell_bytes;
        let up = 4 + if kind == OpKind::Get { g.cell_bytes } else { 0 };
        Traffic { bytes: (down + up) as f64, ..Traffic::default() }
    }
}

impl System for CpuSystem {
    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn setting(&self) -> String {
        let pool = self.table.pool();
        format!("{} host threads | pool {:?} ({})", self.table.threads(), pool.backend(), pool.persist_mode())
    }

    fn stage(&mut self, batch: &DeviceBatch) -> Result<()> {
        self.host.stage(batch)
    }

    /// Executes the batch on the host through [`HostBatches`] (durable on return).
    fn run(&mut self, batch: &DeviceBatch) -> Result<()> {
        let table = &mut self.table;
        self.host.run(batch, |kinds, keys, values| table.execute(kinds, keys, values))
    }

    fn settle(&mut self, batch: &DeviceBatch) -> Result<()> {
        self.host.settle(batch)
    }

    fn len(&self) -> u64 {
        self.table.len()
    }

    fn traffic(&self, kind: OpKind, hit: bool) -> Traffic {
        traffic(&self.table, kind, hit)
    }
}

/// Mean 64-byte lines spanned by `len` bytes at each of `offsets`.
fn mean_lines(offsets: impl Iterator<Item = usize>, len: usize) -> f64 {
    let (mut lines, mut count) = (0usize, 0usize);
    for at in offsets {
        lines += (at + len).div_ceil(64) - at / 64;
        count += 1;
    }
    lines as f64 / count.max(1) as f64
}

/// The traffic model of the module docs.
pub fn traffic(table: &CpuTable, kind: OpKind, hit: bool) -> Traffic {
    let g = table.geometry();
    let slot_lines = mean_lines((0..g.slots).map(|i| g.slot_offset(i)), g.slot_bytes);
    let period = 64 / gcd(g.cell_bytes, 64);
    let cell_lines = mean_lines((0..period).map(|k| k * g.cell_bytes), g.cell_bytes);
    let (miss_buckets, hit_buckets) = table.probe_buckets();
    let false_tags = table.len() as f64 / (g.shards * g.buckets) as f64 / 256.0;
    let search_hit = hit_buckets * (1.0 + false_tags * slot_lines) + slot_lines;
    let search_miss = miss_buckets * (1.0 + false_tags * slot_lines);
    let insert_writes = cell_lines + slot_lines + 2.0;
    let (reads, writes) = match (kind, hit) {
        (OpKind::Get, true) => (search_hit + cell_lines, 0.0),
        (OpKind::Insert, true) => (search_hit, 0.0),
        (OpKind::Get | OpKind::Update | OpKind::Delete, false) => (search_miss, 0.0),
        (OpKind::Insert | OpKind::Upsert, false) => (search_miss, insert_writes),
        (OpKind::Update | OpKind::Upsert, true) => (search_hit, cell_lines + 1.0),
        (OpKind::Delete, true) => (search_hit, 1.0),
    };
    Traffic { reads, writes, atomics: 0.0, bytes: (reads + writes) * 64.0 }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_means() {
        assert_eq!(mean_lines([0, 64].into_iter(), 64), 1.0);
        assert_eq!(mean_lines([0, 32].into_iter(), 64), 1.5);
        assert_eq!(gcd(12, 64), 4);
    }

    #[test]
    fn traffic_of_an_empty_table() {
        let t =
            CpuTable::create(None, &CpuConfig { capacity: 10_000, value_bytes: 128, ..CpuConfig::default() })
                .unwrap();
        let get = traffic(&t, OpKind::Get, true);
        // Metadata line, one slot (8-byte keys: 12-byte slots, some straddle), two value lines.
        assert!(get.requests() > 4.0 && get.requests() < 4.3, "{get:?}");
        assert_eq!(traffic(&t, OpKind::Get, false).requests(), 1.0);
        assert_eq!(get.bytes, get.requests() * 64.0);
        assert!(traffic(&t, OpKind::Insert, false).requests() > traffic(&t, OpKind::Delete, true).requests());
    }
}
