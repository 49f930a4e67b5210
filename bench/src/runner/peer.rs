//! The suite's workloads through the CPU peer (`cpu-map`): each map crate in turn over its own
//! table, each run one stream of the generator's operations that the host threads split
//! among them; then the best crate of each workload.

use super::{Check, Driven, How, Measured, Report, Stream, Suite, TrafficTable, drive};
use crate::systems::cpu_map::{self, ConcurrentMap, Dash, Papaya, Peer, Scc, Widths};
use crate::ycsb::Op;
use gphash::Result;

/// Runs the suite's workloads on every crate of [`cpu_map::CRATES`] with `key_bytes`-byte keys
/// in maps made for `capacity` keys; `report` hears of each crate's runs (under the system
/// name `cpu-map-<crate>`) and, after them, of the best crate's for each (workload, size),
/// under `cpu-map`.
pub(super) fn run(
    suite: &Suite,
    key_bytes: u32,
    capacity: u64,
    progress: &dyn Fn(u64),
    report: &mut Report<'_>,
) -> Result<()> {
    let mut all: Vec<(String, String, usize, Vec<Measured>, String)> = vec![];
    let mut heard = |system: &str, workload: &str, size: usize, runs: &[Measured], setting: &str| {
        all.push((system.to_string(), workload.to_string(), size, runs.to_vec(), setting.to_string()));
    };
    cpu_map::with_widths(
        key_bytes as usize,
        suite.value_bytes as usize,
        Crates { suite, capacity, progress, heard: &mut heard },
    )??;
    // Each crate's runs under its own name, then the best of each (workload, size).
    let mut best: Vec<(String, usize, usize)> = vec![];
    for (i, (_, workload, size, runs, _)) in all.iter().enumerate() {
        let rate = median_rate(runs);
        match best.iter_mut().find(|(w, s, _)| w == workload && s == size) {
            Some(b) if median_rate(&all[b.2].3) < rate => b.2 = i,
            Some(_) => {}
            None => best.push((workload.clone(), *size, i)),
        }
    }
    for (system, workload, size, runs, setting) in &all {
        report(system, workload, *size, runs, setting);
    }
    for (workload, size, i) in &best {
        let (_, _, _, runs, setting) = &all[*i];
        let setting = format!("best of {}: {setting}", cpu_map::CRATES.join(", "));
        report(BEST, workload, *size, runs, &setting);
    }
    Ok(())
}

/// The system name of the best crate's records.
pub const BEST: &str = "cpu-map";

/// The crate that the setting of a [`BEST`] record names.
pub fn best_crate(setting: &str) -> &str {
    setting.split_once(": ").map_or(setting, |(_, s)| s).split(" |").next().unwrap_or_default().trim()
}

/// The median rate of a workload's runs.
fn median_rate(runs: &[Measured]) -> f64 {
    let mut rates: Vec<f64> =
        runs.iter().map(|m| m.transactions as f64 / m.busy.as_secs_f64().max(1e-12)).collect();
    rates.sort_by(f64::total_cmp);
    rates[(rates.len() - 1) / 2]
}

/// Every crate at the widths [`cpu_map::with_widths`] gives.
struct Crates<'a> {
    suite: &'a Suite,
    capacity: u64,
    progress: &'a dyn Fn(u64),
    heard: &'a mut Report<'a>,
}

impl Widths for Crates<'_> {
    type Out = Result<()>;

    fn call<const K: usize, const V: usize>(self) -> Result<()> {
        let Crates { suite, capacity, progress, heard } = self;
        one_crate::<Scc<K, V>, K, V>(suite, capacity, progress, heard)?;
        one_crate::<Papaya<K, V>, K, V>(suite, capacity, progress, heard)?;
        one_crate::<Dash<K, V>, K, V>(suite, capacity, progress, heard)
    }
}

/// The suite on one crate's map.
fn one_crate<M: ConcurrentMap<K, V>, const K: usize, const V: usize>(
    suite: &Suite,
    capacity: u64,
    progress: &dyn Fn(u64),
    heard: &mut Report<'_>,
) -> Result<()> {
    let mut on_host = OnHost::<M, K, V> { peer: Peer::new(capacity, suite.cpu_threads), suite, progress };
    // The stream is not cut into batches: one size, reported as 0.
    let mut unbatched = |system: &str, w: &str, _size: usize, runs: &[Measured], setting: &str| {
        heard(system, w, 0, runs, setting)
    };
    drive(suite, &mut on_host, &[stream_chunk(suite)], &mut unbatched)
}

/// The generator's operations are drawn in chunks of the suite's largest batch, so that the
/// peer's stream holds the operations the gphash systems' batches hold.
fn stream_chunk(suite: &Suite) -> usize {
    suite.batches.iter().copied().max().unwrap_or(suite.load_batch).max(1)
}

/// One crate's peer as the suite drives it.
struct OnHost<'a, M: ConcurrentMap<K, V>, const K: usize, const V: usize> {
    peer: Peer<M, K, V>,
    suite: &'a Suite,
    progress: &'a dyn Fn(u64),
}

impl<M: ConcurrentMap<K, V>, const K: usize, const V: usize> Driven for OnHost<'_, M, K, V> {
    fn name(&self) -> String {
        format!("{BEST}-{}", M::CRATE)
    }

    fn setting(&self) -> String {
        format!("{} | {} host threads | host DRAM, volatile", M::CRATE, self.suite.cpu_threads.max(1))
    }

    fn measure(&mut self, stream: Stream<'_>, how: How) -> Result<Measured> {
        let seed = stream.seed;
        let (mut ops, mut transactions) = (vec![], 0);
        for (batch, t) in stream.batches() {
            ops.extend(batch);
            transactions += t;
        }
        let check = Check { inserts_race: true, ..how.check };
        let (busy, unexpected) = self.peer.run_ops(&ops, seed, &check);
        (self.progress)(transactions);
        let vb = V;
        let table = TrafficTable::new(|k, hit| cpu_map::traffic(vb, k, hit));
        Ok(Measured {
            transactions,
            latencies: vec![],
            busy,
            traffic: table.of_batch(&ops, how.negative),
            unexpected,
        })
    }

    fn restore(&mut self, undo: &[Op]) -> Result<()> {
        if undo.is_empty() {
            return Ok(());
        }
        let check = Check {
            expect: gphash::Status::Ok,
            records: 0,
            seeds: vec![],
            value_bytes: V,
            inserts_race: false,
        };
        let (_, wrong) = self.peer.run_ops(undo, self.suite.seed, &check);
        if wrong > 0 {
            return Err(gphash::Error::InvalidConfig(format!(
                "cpu-map: {wrong} of {} operations restoring the table did not take effect",
                undo.len()
            )));
        }
        Ok(())
    }
}
