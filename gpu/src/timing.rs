//! GPU time per compute pass, from timestamp queries where the device has them: each pass
//! writes a timestamp at its beginning and its end into a query set that every submit reuses;
//! the submit resolves them and copies them into its own readback buffer, so the times come
//! back with the results (no extra round trip).

use std::time::Duration;

use crate::context::Gpu;
use crate::error::Result;
use crate::error::scoped;

/// Bytes of one resolved timestamp.
const TIMESTAMP_BYTES: u64 = 8;

/// The timestamps of up to `max_passes` compute passes of one submit.
pub struct PassTimer {
    queries: wgpu::QuerySet,
    /// Where the queries resolve to (a resolve target cannot be mapped): copied on from here.
    resolved: wgpu::Buffer,
    max_passes: u32,
    /// Nanoseconds per tick.
    period: f64,
}

/// The GPU times of one submit's timed passes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassTimes {
    /// Each pass, from its beginning to its end, in the order recorded.
    pub passes: Vec<Duration>,
    /// From the first pass's beginning to the last pass's end: the passes and the gaps
    /// between them (barriers, idle time).
    pub span: Duration,
}

impl PassTimer {
    /// A timer for submits of up to `max_passes` passes; `None` where the device has no
    /// timestamp queries.
    pub fn new(gpu: &Gpu, max_passes: u32) -> Result<Option<PassTimer>> {
        if !gpu.info.timestamps || max_passes == 0 {
            return Ok(None);
        }
        let dev = &gpu.device;
        scoped(dev, "creating the timestamp queries", || {
            let queries = dev.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("pass timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: max_passes * 2,
            });
            let resolved = dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("pass timestamps"),
                size: Self::bytes(max_passes),
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            Some(PassTimer { queries, resolved, max_passes, period: gpu.info.timestamp_period as f64 })
        })
    }

    /// Bytes the timestamps of `passes` passes take in a readback buffer.
    pub fn bytes(passes: u32) -> u64 {
        passes as u64 * 2 * TIMESTAMP_BYTES
    }

    /// The most passes of one submit that are timed.
    pub fn max_passes(&self) -> u32 {
        self.max_passes
    }

    /// The timestamp writes of pass `pass` of a submit (`None` beyond `max_passes`).
    pub fn writes(&self, pass: u32) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        (pass < self.max_passes).then_some(wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(2 * pass),
            end_of_pass_write_index: Some(2 * pass + 1),
        })
    }

    /// Records the resolve of the first `passes` passes' timestamps and their copy into
    /// `readback` at `at` (after the passes, in the same submit).
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder, passes: u32, readback: &wgpu::Buffer, at: u64) {
        let passes = passes.min(self.max_passes);
        if passes == 0 {
            return;
        }
        enc.resolve_query_set(&self.queries, 0..passes * 2, &self.resolved, 0);
        enc.copy_buffer_to_buffer(&self.resolved, 0, readback, at, Self::bytes(passes));
    }

    /// The times of `passes` passes from their resolved timestamps (`bytes`, as copied by
    /// [`PassTimer::resolve`]).
    pub fn times(&self, bytes: &[u8], passes: u32) -> PassTimes {
        let passes = passes.min(self.max_passes) as usize;
        let ticks: Vec<u64> = bytes[..passes * 2 * TIMESTAMP_BYTES as usize]
            .chunks_exact(TIMESTAMP_BYTES as usize)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        // A clock that went backwards (some drivers reset it) reads as no time, not as years.
        let ns =
            |from: u64, to: u64| Duration::from_nanos((to.saturating_sub(from) as f64 * self.period) as u64);
        PassTimes {
            passes: ticks.chunks_exact(2).map(|t| ns(t[0], t[1])).collect(),
            span: match (ticks.first(), ticks.last()) {
                (Some(&first), Some(&last)) => ns(first, last),
                _ => Duration::ZERO,
            },
        }
    }
}
