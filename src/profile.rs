//! Where a batch's time goes: a breakdown of [`crate::Activity`]'s engine and host time by
//! stage, kept always (a few clock reads per engine batch).

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
    /// operations into their net effect (`execute_ordered`, or a batch split into several).
    pub fold: Duration,
    /// Queue writes of the input, the parameters and the control block.
    pub writes: Duration,
    /// Recording the command buffers of a submit.
    pub record: Duration,
    /// `Queue::submit`.
    pub submit: Duration,
    /// From the submit until the results are mapped (the kernels run in here).
    pub wait: Duration,
    /// Copying the mapped results (control block, statuses, values) out.
    pub readback: Duration,
    /// Reading back the list of written lines (and in staged mode their contents).
    pub lines: Duration,
    /// Decoding results into the caller's `BatchResult`.
    pub decode: Duration,
    /// Persisting written lines.
    pub persist: Duration,
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
    }
}
