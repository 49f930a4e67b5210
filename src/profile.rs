//! Where a batch's time goes: a breakdown of [`crate::Activity`]'s engine and host time by
//! stage, kept always (a few clock reads per engine batch), and where asked for
//! (`GpuOptions::time_kernels`) the GPU time of each kernel.

use std::ops::AddAssign;
use std::time::Duration;

/// Time spent per stage since the index was opened. The host stages (`encode`, `fold`,
/// `decode`) add up to `Activity::host_time`; the engine's (`writes` to `lines`) are part of
/// `Activity::engine_time`, whose rest is bookkeeping (cache slices, error scopes, the CPU
/// engine's whole work); `persist` is `Activity::persist_time`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// Encoding operations into the engine's input words.
    pub encode: Duration,
    /// Ordering: grouping a batch's operations by key and folding each repeated key's
    /// operations into their net effect (`execute_ordered`, or a batch split into several;
    /// never a batch that only reads).
    pub fold: Duration,
    /// Queue writes of the input, the parameters and the control block.
    pub writes: Duration,
    /// Recording the command buffers of a submit.
    pub record: Duration,
    /// `Queue::submit`.
    pub submit: Duration,
    /// From the submit until the results are mapped (the kernels run in here).
    pub wait: Duration,
    /// Copying the mapped results (control block, statuses, values) out; for a batch whose
    /// operations are in host memory, only the control block (its results are decoded where
    /// the kernels wrote them).
    pub readback: Duration,
    /// Reading back the list of written lines (and in staged mode their contents).
    pub lines: Duration,
    /// Decoding results into the caller's `BatchResult` (for a batch in host memory, read
    /// from there).
    pub decode: Duration,
    /// Persisting written lines.
    pub persist: Duration,
    /// GPU time per kernel, part of `wait` and on some drivers (lavapipe) of `submit`, which
    /// starts the kernels (zero unless kernels are timed).
    pub kernels: KernelTimes,
    /// The engine's submits of batch kernels through wgpu (a phase's, a tail's).
    pub wgpu_submits: u64,
    /// Those recorded and submitted with Vulkan itself instead (host batches whose operations
    /// are in host memory, untimed, over a pool that needs no write-back; docs/design.md,
    /// "Submits through Vulkan itself").
    pub vulkan_submits: u64,
}

/// GPU time per kernel, from timestamp queries: only where `GpuOptions::time_kernels` asks for
/// it and the device has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelTimes {
    /// Each kernel's time (from its pass's beginning to its end), in the order of
    /// [`KernelTimes::NAMES`].
    pub times: [Duration; KernelTimes::NAMES.len()],
    /// Each timed submit's time from its first kernel's beginning to its last kernel's end,
    /// summed: the kernels and the GPU's time between them.
    pub span: Duration,
    /// Submits timed.
    pub submits: u64,
}

impl KernelTimes {
    /// The kernels of batches, as the GPU engine names them.
    pub const NAMES: [&'static str; 10] = [
        "alloc",
        "phase_a",
        "search",
        "phase_b",
        "free_cells",
        "rollback",
        "writeback",
        "cache_refresh",
        "cache_fill",
        "cache_decay",
    ];

    /// Each kernel with its name.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, Duration)> + '_ {
        Self::NAMES.into_iter().zip(self.times)
    }

    /// The kernels' time.
    pub fn busy(&self) -> Duration {
        self.times.iter().sum()
    }

    /// The GPU's time between the kernels of a submit (barriers, launches, idling).
    pub fn idle(&self) -> Duration {
        self.span.saturating_sub(self.busy())
    }

    fn since(&self, earlier: &KernelTimes) -> KernelTimes {
        KernelTimes {
            times: std::array::from_fn(|i| self.times[i].saturating_sub(earlier.times[i])),
            span: self.span.saturating_sub(earlier.span),
            submits: self.submits.saturating_sub(earlier.submits),
        }
    }
}

impl AddAssign for KernelTimes {
    fn add_assign(&mut self, o: KernelTimes) {
        for (t, o) in self.times.iter_mut().zip(o.times) {
            *t += o;
        }
        self.span += o.span;
        self.submits += o.submits;
    }
}

impl Profile {
    /// The engine's stages that are timed one by one.
    pub fn engine_stages(&self) -> Duration {
        self.writes + self.record + self.submit + self.wait + self.readback + self.lines
    }

    /// Every stage, with its name.
    pub fn stages(&self) -> [(&'static str, Duration); 10] {
        [
            ("encode", self.encode),
            ("fold", self.fold),
            ("writes", self.writes),
            ("record", self.record),
            ("submit", self.submit),
            ("wait", self.wait),
            ("readback", self.readback),
            ("lines", self.lines),
            ("decode", self.decode),
            ("persist", self.persist),
        ]
    }

    /// The time of each stage since `earlier` (a profile of the same index taken before).
    pub fn since(&self, earlier: &Profile) -> Profile {
        let d = |a: Duration, b: Duration| a.saturating_sub(b);
        Profile {
            encode: d(self.encode, earlier.encode),
            fold: d(self.fold, earlier.fold),
            writes: d(self.writes, earlier.writes),
            record: d(self.record, earlier.record),
            submit: d(self.submit, earlier.submit),
            wait: d(self.wait, earlier.wait),
            readback: d(self.readback, earlier.readback),
            lines: d(self.lines, earlier.lines),
            decode: d(self.decode, earlier.decode),
            persist: d(self.persist, earlier.persist),
            kernels: self.kernels.since(&earlier.kernels),
            wgpu_submits: self.wgpu_submits.saturating_sub(earlier.wgpu_submits),
            vulkan_submits: self.vulkan_submits.saturating_sub(earlier.vulkan_submits),
        }
    }
}

impl AddAssign for Profile {
    fn add_assign(&mut self, o: Profile) {
        self.encode += o.encode;
        self.fold += o.fold;
        self.writes += o.writes;
        self.record += o.record;
        self.submit += o.submit;
        self.wait += o.wait;
        self.readback += o.readback;
        self.lines += o.lines;
        self.decode += o.decode;
        self.persist += o.persist;
        self.kernels += o.kernels;
        self.wgpu_submits += o.wgpu_submits;
        self.vulkan_submits += o.vulkan_submits;
    }
}

/// Wall time of the steps of one long operation (open, growth), logged at debug level when it
/// ends: where such an operation's time goes, without a profiler.
pub(crate) struct Laps {
    what: &'static str,
    last: std::time::Instant,
    laps: Vec<(&'static str, Duration)>,
}

impl Laps {
    pub(crate) fn start(what: &'static str) -> Laps {
        Laps { what, last: std::time::Instant::now(), laps: vec![] }
    }

    /// Ends the step `name` (it began when the previous one ended).
    pub(crate) fn lap(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.laps.push((name, now - self.last));
        self.last = now;
    }

    /// Adds `took` to the step `name`, one that recurs (a scan's rounds), made its own the
    /// first time.
    pub(crate) fn add(&mut self, name: &'static str, took: Duration) {
        match self.laps.iter_mut().find(|(n, _)| *n == name) {
            Some((_, d)) => *d += took,
            None => self.laps.push((name, took)),
        }
    }
}

impl Drop for Laps {
    fn drop(&mut self) {
        // Every sharded batch keeps laps: format them only when they are logged.
        if !log::log_enabled!(log::Level::Debug) {
            return;
        }
        let total: Duration = self.laps.iter().map(|l| l.1).sum();
        let steps: Vec<String> =
            self.laps.iter().map(|(n, d)| format!("{n} {:.2}", d.as_secs_f64() * 1e3)).collect();
        log::debug!("{}: {:.2} ms ({})", self.what, total.as_secs_f64() * 1e3, steps.join(", "));
    }
}
