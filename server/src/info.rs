//! What INFO reports: the server, its clients, its batches and the keyspace.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gphash::GpHash;
use hdrhistogram::Histogram;

/// Counters the connections keep.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) connected: AtomicU64,
    pub(crate) connections: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) commands: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// What the server is, for INFO's server section.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) port: u16,
    pub(crate) pool: String,
    pub(crate) started: Instant,
    /// Threads of the runtime that serves the connections.
    pub(crate) io_threads: usize,
}

/// Batches and request latencies, kept by the batcher.
pub(crate) struct Record {
    /// Operations per batch.
    sizes: Histogram<u64>,
    /// Microseconds a batch took: building, the ordered call with its persists, and replies.
    batch_us: Histogram<u64>,
    /// Microseconds from a request's arrival at the batcher (with the requests its connection
    /// read with it) to its outcome leaving the batcher.
    request_us: Histogram<u64>,
    pub(crate) failed: u64,
    /// Batches of reads run through the pipeline.
    pub(crate) pipelined: u64,
    /// The batcher thread's time by what it did.
    pub(crate) time: BatcherTime,
}

/// The batcher thread's time since the server started, by step: what bounds a server whose
/// batcher is never idle (INFO's `gphash_batcher_usec_*`; with the index's own stages,
/// `gphash_index_usec_*`, where the time of its calls goes).
#[derive(Debug, Default)]
pub(crate) struct BatcherTime {
    /// Taking the requests queued into a batch (not the wait for a first one; with a batch
    /// deadline, the wait for more).
    pub(crate) gather: Duration,
    /// Building the batch's operations from its jobs.
    pub(crate) build: Duration,
    /// The index's calls: ordered batches with their persists, pipelined submits and waits.
    pub(crate) index: Duration,
    /// Handing each job its share of the results, the latency records, and the replies to
    /// INFO, DBSIZE and failed batches.
    pub(crate) reply: Duration,
}

impl BatcherTime {
    /// Runs `f`, adding its time to the step `step` picks.
    pub(crate) fn timed<R>(&mut self, step: fn(&mut Self) -> &mut Duration, f: impl FnOnce() -> R) -> R {
        let started = Instant::now();
        let r = f();
        *step(self) += started.elapsed();
        r
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits are valid")
}

impl Record {
    pub(crate) fn new() -> Self {
        Record {
            sizes: histogram(),
            batch_us: histogram(),
            request_us: histogram(),
            failed: 0,
            pipelined: 0,
            time: BatcherTime::default(),
        }
    }

    pub(crate) fn batch(&mut self, ops: usize, took: Duration) {
        self.sizes.record(ops as u64).expect("auto-resizing histogram");
        self.batch_us.record(took.as_micros() as u64).expect("auto-resizing histogram");
    }

    /// `n` requests answered `took` after their group reached the batcher.
    pub(crate) fn requests(&mut self, took: Duration, n: usize) {
        self.request_us.record_n(took.as_micros() as u64, n as u64).expect("auto-resizing histogram");
    }

    /// INFO's text for `sections` (none, `default`, `all` or `everything`: every section).
    pub(crate) fn info(&self, sections: &[String], index: &GpHash, c: &Counters, id: &Identity) -> String {
        let all = sections.is_empty()
            || sections.iter().any(|s| ["default", "all", "everything"].contains(&s.as_str()));
        let wants = |s: &str| all || sections.iter().any(|x| x == s);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = Text::default();
        if wants("server") {
            let s = index.stats();
            out.section("Server");
            // The protocol level the server speaks, for clients that check it.
            out.line("redis_version", &"7.0.0");
            out.line("gphash_version", &env!("CARGO_PKG_VERSION"));
            out.line("redis_mode", &"standalone");
            out.line("arch_bits", &64);
            out.line("process_id", &std::process::id());
            out.line("tcp_port", &id.port);
            out.line("uptime_in_seconds", &id.started.elapsed().as_secs());
            out.line("gphash_io_threads", &id.io_threads);
            out.line("gphash_pool", &id.pool);
            out.line("gphash_mode", &s.mode);
            out.line("gphash_adapter", &s.adapter.as_deref().unwrap_or("none"));
            out.line("gphash_key_bytes", &s.key_bytes);
            out.line("gphash_value_bytes", &s.value_bytes);
            out.line("gphash_load_factor", &format!("{:.4}", s.load_factor));
            out.line("gphash_poisoned", &s.poisoned.as_deref().unwrap_or("no"));
        }
        if wants("clients") {
            out.section("Clients");
            out.line("connected_clients", &load(&c.connected));
        }
        if wants("stats") {
            out.section("Stats");
            out.line("total_connections_received", &load(&c.connections));
            out.line("total_commands_processed", &load(&c.commands));
            out.line("rejected_connections", &load(&c.rejected));
            out.line("total_error_replies_protocol", &load(&c.protocol_errors));
            out.line("gphash_batches", &self.sizes.len());
            out.line("gphash_batches_failed", &self.failed);
            out.line("gphash_batches_pipelined", &self.pipelined);
            let h = &self.sizes;
            out.line("gphash_batch_ops_mean", &format!("{:.1}", h.mean()));
            for (name, h) in [
                ("batch_ops", &self.sizes),
                ("batch_usec", &self.batch_us),
                ("request_usec", &self.request_us),
            ] {
                for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
                    out.line(&format!("gphash_{name}_{label}"), &h.value_at_quantile(q));
                }
                out.line(&format!("gphash_{name}_max"), &h.max());
            }
            let t = &self.time;
            for (step, took) in
                [("gather", t.gather), ("build", t.build), ("index", t.index), ("reply", t.reply)]
            {
                out.line(&format!("gphash_batcher_usec_{step}"), &took.as_micros());
            }
            for (stage, took) in index.activity().profile.stages() {
                out.line(&format!("gphash_index_usec_{stage}"), &took.as_micros());
            }
        }
        if wants("keyspace") {
            out.section("Keyspace");
            let keys = index.len();
            if keys > 0 {
                out.line("db0", &format!("keys={keys},expires=0,avg_ttl=0"));
            }
        }
        out.0
    }
}

/// INFO's text: sections of `key:value` lines, an empty line between sections.
#[derive(Default)]
struct Text(String);

impl Text {
    fn section(&mut self, name: &str) {
        if !self.0.is_empty() {
            self.0.push_str("\r\n");
        }
        let _ = write!(self.0, "# {name}\r\n");
    }

    fn line(&mut self, key: &str, value: &dyn std::fmt::Display) {
        let _ = write!(self.0, "{key}:{value}\r\n");
    }
}
