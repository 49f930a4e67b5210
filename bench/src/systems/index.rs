//! gphash as a benchmark [`System`]: zero-copy, staged and volatile placements, and the
//! `naive` baseline (the same table with one invocation per operation, no subgroup
//! cooperation: a tile of one lane).

use std::path::Path;
use std::sync::Arc;

use std::time::Instant;

use crate::systems::{System, Timed, Traffic};
use gphash::Geometry;
use gphash::Gpu;
use gphash::OpKind;
use gphash::Result;
use gphash::{CacheOptions, CacheStatus};
use gphash::{Config, Executor, GpHash, Options};
use gphash::{DeviceBatch, GpuOptions, Placement};

/// gphash behind the [`System`] interface.
pub struct GpHashSystem {
    name: String,
    index: GpHash,
}

impl GpHashSystem {
    /// A table for `config` in a new pool at `path` (`None`: anonymous memory), on `gpu`.
    pub fn create(
        name: &str,
        path: Option<&Path>,
        config: &Config,
        gpu: &Arc<Gpu>,
        placement: Placement,
        tile: u32,
        cache: CacheOptions,
    ) -> Result<GpHashSystem> {
        let options = Options {
            executor: Executor::Gpu,
            gpu: GpuOptions {
                placement,
                tile,
                max_window_bytes: None,
                cache,
                time_kernels: false,
                ..GpuOptions::default()
            },
            device: Some(gpu.clone()),
            ..Options::default()
        };
        Ok(GpHashSystem { name: name.into(), index: GpHash::create(path, config, &options)? })
    }

    /// The index.
    pub fn index(&self) -> &GpHash {
        &self.index
    }
}

/// Requests and bytes one operation of gphash costs in the table's memory (the model behind
/// the "% of ceiling" figures; `docs/protocol.md` describes the accesses):
///
/// - a probe reads the candidate buckets of each hash location, which lie in one group: `H`
///   requests of the fingerprint and state words of `L` buckets (plus the key of a slot whose
///   fingerprint matches: in the group, or with a request of its own when keys are apart);
/// - a read that finds its key reads its value cell: 1 request;
/// - a new value is written into a fresh cell: 1 request;
/// - a claim is a CAS and a write of fingerprint and key (2 writes when keys are apart):
///   2 or 3 requests; publishing it, and swinging or clearing a found slot, is one CAS.
///
/// The bucket cache is not modelled: its savings are counted by the kernels ([`gphash::CacheStats`]).
pub fn traffic(geo: &Geometry, kind: OpKind, hit: bool) -> Traffic {
    let l = geo.layout;
    let (key, cell) = (geo.key_bytes as f64, (geo.cell_words() * 4) as f64);
    let apart = geo.keys_apart as u32 as f64;
    let probe = Traffic {
        reads: l.hashes as f64 + if hit { apart } else { 0.0 },
        bytes: l.hashes as f64 * geo.group_bytes() as f64 + if hit { key } else { 0.0 },
        ..Traffic::default()
    };
    let t = |reads, writes, atomics, bytes| Traffic { reads, writes, atomics, bytes };
    probe.plus(match (kind, hit) {
        (OpKind::Get, true) => t(1.0, 0.0, 0.0, cell),
        (OpKind::Get | OpKind::Update | OpKind::Delete, false) | (OpKind::Insert, true) => Traffic::default(),
        // Value, fingerprint and key (key apart); claim and publish.
        (OpKind::Insert | OpKind::Upsert, false) => t(0.0, 2.0 + apart, 2.0, cell + 4.0 + key + 8.0),
        (OpKind::Update | OpKind::Upsert, true) => t(0.0, 1.0, 1.0, cell + 4.0),
        (OpKind::Delete, true) => t(0.0, 0.0, 1.0, 4.0),
    })
}

impl System for GpHashSystem {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn setting(&self) -> String {
        let s = self.index.stats();
        let cache = match &s.cache {
            CacheStatus::On(c) => format!("cache of {:.0}% of the groups", c.ratio * 100.0),
            CacheStatus::Off { reason } => format!("no cache ({reason})"),
        };
        let (adapter, mode, backend, persist) =
            (s.adapter.unwrap_or_default(), s.mode, s.backend, s.persist_mode);
        format!("{adapter} | {mode} | pool {backend:?} ({persist}) | {cache}")
    }

    fn run(&mut self, batch: &DeviceBatch) -> Result<()> {
        self.index.execute_device(batch)
    }

    /// Through a device pipeline, the oldest batch taken (its latency known) before a third is
    /// submitted: two in flight. A batch's latency runs from the start of its submit, which
    /// first ends the batch before it when that one writes (so a batch that writes waits for
    /// the one ahead: queueing, counted in its latency).
    fn run_in_flight(&mut self, batches: &[DeviceBatch]) -> Result<Timed> {
        let started = Instant::now();
        let mut submitted: Vec<Instant> = Vec::with_capacity(batches.len());
        let mut timed = Timed::default();
        let mut p = self.index.device_pipeline();
        for b in batches {
            if p.pending() == 2 {
                p.next().expect("a batch in flight")?;
                timed.latencies.push(submitted[timed.latencies.len()].elapsed());
            }
            submitted.push(Instant::now());
            p.submit(*b)?;
        }
        for outcome in p {
            outcome?;
            timed.latencies.push(submitted[timed.latencies.len()].elapsed());
        }
        timed.busy = started.elapsed();
        Ok(timed)
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.index.close()
    }

    fn len(&self) -> u64 {
        self.index.len()
    }

    fn traffic(&self, kind: OpKind, hit: bool) -> Traffic {
        traffic(&self.index.geometry(), kind, hit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gphash::Layout;

    #[test]
    fn a_positive_search_is_three_requests_of_the_default_layout() {
        let g = Geometry::new(Layout::default(), 8, 128, 10, 100).unwrap();
        assert_eq!(traffic(&g, OpKind::Get, true).requests(), 3.0);
        assert_eq!(traffic(&g, OpKind::Get, false).requests(), 2.0);
        let insert = traffic(&g, OpKind::Insert, false);
        assert_eq!((insert.reads, insert.writes, insert.atomics), (2.0, 2.0, 2.0));
        assert_eq!(traffic(&g, OpKind::Update, true).requests(), 4.0);
        let apart = g.with_keys_apart(true).unwrap();
        assert_eq!(traffic(&apart, OpKind::Get, true).requests(), 4.0);
        assert_eq!(traffic(&apart, OpKind::Insert, false).requests(), 7.0);
    }
}
