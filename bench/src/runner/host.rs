//! The suite's workloads through gphash's public host API (`gphash-host`): the caller's batches
//! in host memory, handed to [`GpHash::pipeline`] (two in flight, the way the API lets a host
//! program keep the GPU busy), the results back in host memory. Pool and cache as `gphash-zc`.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use super::{Driven, How, Measured, Report, Stream, Suite, SystemKind, TrafficTable, WARM_UP, drive};
use crate::systems::System;
use crate::systems::index::{GpHashSystem, traffic};
use crate::ycsb::{Op, batch_of};
use gphash::{Batch, BatchResult, Config, GpHash, Gpu, Placement, Result};

/// Runs the suite's workloads on a new zero-copy table with `key_bytes`-byte keys made for
/// `capacity` keys, its pool in `dir`.
pub(super) fn run(
    suite: &Suite,
    gpu: &Arc<Gpu>,
    dir: &Path,
    key_bytes: u32,
    capacity: u64,
    progress: &dyn Fn(u64),
    report: &mut Report<'_>,
) -> Result<()> {
    let name = SystemKind::Host.name();
    let config = Config { key_bytes, value_bytes: suite.value_bytes, capacity, ..Config::default() };
    let path = dir.join(format!("{name}-{key_bytes}.pool"));
    let system =
        GpHashSystem::create(name, Some(&path), &config, gpu, Placement::ZeroCopy, suite.tile, suite.cache)?;
    let mut api = HostApi { system, suite, key_bytes: key_bytes as usize, progress };
    drive(suite, &mut api, &suite.batches, report)?;
    Box::new(api.system).close()?;
    if !suite.keep_pools {
        std::fs::remove_file(&path)
            .map_err(|source| gphash::Error::Io { what: format!("removing {}", path.display()), source })?;
    }
    Ok(())
}

/// gphash's host API as the suite drives it.
struct HostApi<'a> {
    system: GpHashSystem,
    suite: &'a Suite,
    key_bytes: usize,
    progress: &'a dyn Fn(u64),
}

impl HostApi<'_> {
    fn index(&self) -> &GpHash {
        self.system.index()
    }

    /// Reads of the keys of `batch` for [`WARM_UP`], untimed, through the pipeline as the
    /// timed batches run, so that the GPU runs at its clock under load and both of the
    /// pipeline's slots hold buffers for the batch's size when the timing starts.
    fn warm_up(&self, batch: &Batch) -> Result<()> {
        let mut reads = Batch::new(batch.key_bytes(), batch.value_bytes());
        for i in 0..batch.len() {
            reads.get(batch.op(i).1)?;
        }
        let started = Instant::now();
        let mut pipeline = self.index().pipeline();
        while started.elapsed() < WARM_UP {
            pipeline.submit(reads.clone())?;
            if pipeline.pending() > 1 {
                pipeline.next().expect("a batch in flight")?;
            }
        }
        pipeline.try_for_each(|r| r.map(drop))
    }
}

impl Driven for HostApi<'_> {
    fn name(&self) -> String {
        SystemKind::Host.name().into()
    }

    fn setting(&self) -> String {
        format!("{} | host batches, two in flight (GpHash::pipeline)", self.system.setting())
    }

    fn measure(&mut self, stream: Stream<'_>, how: How) -> Result<Measured> {
        let (kb, vb, seed) = (self.key_bytes, self.suite.value_bytes as usize, stream.seed);
        // The caller's batches, made before the clock starts as its requests would be.
        let (mut ops, mut batches, mut transactions) = (vec![], vec![], 0);
        for (o, t) in stream.batches() {
            batches.push(batch_of(&o, kb, vb, seed));
            ops.push(o);
            transactions += t;
        }
        if let Some(first) = batches.first() {
            self.warm_up(first)?;
        }
        let n = batches.len();
        let (mut latencies, mut results): (Vec<_>, Vec<BatchResult>) = (vec![], Vec::with_capacity(n));
        let mut submitted = Vec::with_capacity(n);
        let started = Instant::now();
        {
            let mut pipeline = self.index().pipeline();
            for b in batches {
                submitted.push(Instant::now());
                pipeline.submit(b)?;
                if pipeline.pending() > 1 {
                    results.push(pipeline.next().expect("a batch in flight")?);
                    latencies.push(submitted[results.len() - 1].elapsed());
                }
            }
            for r in pipeline {
                results.push(r?);
                latencies.push(submitted[results.len() - 1].elapsed());
            }
        }
        let busy = started.elapsed();
        let check = &how.check;
        let unexpected = ops
            .par_iter()
            .zip(&results)
            .map(|(ops, r)| {
                let wrong = ops.iter().enumerate().filter(|&(i, op)| {
                    let status = r.statuses.get(i).map_or(u8::MAX, |&s| s as u8);
                    !check.accepts(op, status, r.value(i))
                });
                wrong.count() as u64
            })
            .sum();
        (self.progress)(transactions);
        let geo = self.index().geometry();
        let table = TrafficTable::new(|k, hit| traffic(&geo, k, hit));
        let traffic = ops.iter().fold(Default::default(), |t: crate::systems::Traffic, o| {
            t.plus(table.of_batch(o, how.negative))
        });
        Ok(Measured { transactions, latencies, busy, traffic, unexpected })
    }

    fn restore(&mut self, undo: &[Op]) -> Result<()> {
        let (kb, vb, seed) = (self.key_bytes, self.suite.value_bytes as usize, self.suite.seed);
        for chunk in undo.chunks(self.suite.load_batch.max(1)) {
            self.index().execute(&batch_of(chunk, kb, vb, seed))?;
        }
        Ok(())
    }
}
