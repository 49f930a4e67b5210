//! A GPU started in the background ([`crate::GpuStartMode::Background`]): the index opens
//! as soon as its pool does and runs on the CPU model while another thread opens the device,
//! imports the pool and builds the engine; the index takes the engine over between two calls
//! (docs/design.md, "Opening without waiting for the GPU").

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gphash_gpu::Gpu;
use gphash_gpu::resources::{PoolRef, staged_reason};
use host_pm::{Mapping, Region};

use super::Options;
use crate::error::{Error, Result};
use crate::gpu::engine::GpuEngine;
use crate::hash::Seeds;
use crate::layout::Geometry;

/// The table a background start builds its engine for.
pub(super) struct Target {
    pub geo: Geometry,
    pub seeds: Seeds,
    /// The pool's mapping: its owner keeps it in place until the start is joined.
    pub mapping: Mapping,
    pub regions: [Region; 2],
}

/// What the background thread made.
pub(super) struct Started {
    /// The device, or why none opened.
    pub gpu: std::result::Result<Arc<Gpu>, String>,
    /// The engine, when the pool could be imported zero-copy (a pool that must be copied to
    /// the device is copied by the index, which owns its bytes, when it takes the GPU over).
    pub engine: Option<Result<GpuEngine>>,
    /// From the thread's start (once the open's own work was done) until it was done.
    pub took: Duration,
}

/// The thread, joined when dropped: the engine it may hold references the pool's mapping,
/// which must stay in place until then.
pub(super) struct Starting(Option<JoinHandle<Started>>);

impl Starting {
    /// Starts the device (or takes `options.device`) and, where the pool is imported
    /// zero-copy, the engine for `target`.
    pub(super) fn spawn(options: &Options, target: Target) -> Result<Starting> {
        let options = options.clone();
        let since = Instant::now();
        let thread = std::thread::Builder::new().name("gphash-gpu-start".into());
        let handle = thread.spawn(move || {
            let gpu = match &options.device {
                Some(g) => Ok(g.clone()),
                None => Gpu::new().map_err(|e| e.to_string()),
            };
            let Target { geo, seeds, mapping, regions } = target;
            let zero_copy = staged_reason(mapping.backend(), options.gpu.placement.into()).is_none();
            let engine = match &gpu {
                Ok(gpu) if zero_copy => Some(GpuEngine::new(
                    gpu.clone(),
                    (geo, seeds),
                    PoolRef::Mapping(mapping),
                    regions,
                    &options.gpu,
                    options.verify_values,
                    None,
                )),
                _ => None,
            };
            let took = since.elapsed();
            #[cfg(feature = "testing")]
            if let Some(gate) = &options.gpu_start_gate {
                gate.wait();
            }
            Started { gpu, engine, took }
        });
        match handle {
            Ok(handle) => Ok(Starting(Some(handle))),
            Err(e) => Err(Error::Gpu(format!("no thread could start the GPU: {e}"))),
        }
    }

    /// Whether the thread is done (joining it will not wait).
    pub(super) fn finished(&self) -> bool {
        self.0.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the thread and takes what it made.
    pub(super) fn join(mut self) -> Started {
        let handle = self.0.take().expect("joined once");
        handle.join().unwrap_or_else(|_| Started {
            gpu: Err("the thread starting the GPU panicked".into()),
            engine: None,
            took: Duration::ZERO,
        })
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            // What it made is dropped here, its imports released, before the pool can move.
            drop(handle.join());
        }
    }
}
