//! One interface for every system a workload runs against: gphash in its placements
//! (`index`) and the baselines gphash is compared with (DESIGN §9: `slab`, `cpu`; and `cpu_map`, a
//! volatile concurrent map on the host's threads). Batches live
//! in device buffers, as a GPU-resident application holds them; a system reads them there and
//! writes its results there.

pub mod cpu;
pub mod cpu_map;
pub mod index;
pub mod slab;

use std::sync::Arc;
use std::time::{Duration, Instant};

use wgpu::util::DeviceExt;

use gphash::Batch;
use gphash::DeviceBatch;
use gphash::Gpu;
use gphash::{Error, Result};
use gphash::{OpKind, Status};

use crate::answers::Check;
use crate::ycsb::Op;
pub use gphash_gpu::resources::download_words;

/// Memory traffic of one operation in the memory the system's table lives in, by kind of
/// request (over PCIe each costs about the same up to 512 bytes, but reads, posted writes and
/// atomics run at different rates).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    /// Separate reads.
    pub reads: f64,
    /// Separate writes.
    pub writes: f64,
    /// Atomic read-modify-writes (compare-and-swap).
    pub atomics: f64,
    /// Bytes moved.
    pub bytes: f64,
}

impl Traffic {
    /// All requests.
    pub fn requests(&self) -> f64 {
        self.reads + self.writes + self.atomics
    }

    /// The sum of two traffics.
    pub fn plus(self, o: Traffic) -> Traffic {
        Traffic {
            reads: self.reads + o.reads,
            writes: self.writes + o.writes,
            atomics: self.atomics + o.atomics,
            bytes: self.bytes + o.bytes,
        }
    }

    /// This traffic `n` times.
    pub fn times(self, n: f64) -> Traffic {
        Traffic {
            reads: self.reads * n,
            writes: self.writes * n,
            atomics: self.atomics * n,
            bytes: self.bytes * n,
        }
    }
}

/// A key-value system driven with batches in device buffers.
///
/// Semantics every system gives: a batch's results and final state equal applying its
/// operations one by one in some order; when `run` returns, the batch is durable (as far as
/// the system persists at all) and its results are in the batch's output buffers. Status codes
/// and value words are those of [`DeviceBatch`].
pub trait System {
    /// Short name for tables and plots (`gphash-zc`, `slab`, `cpu`, ...).
    fn name(&self) -> String;
    /// Device, memory placement and persistence, for the report.
    fn setting(&self) -> String;
    /// Untimed, before `run`: a system whose application holds its batches in host memory
    /// (`cpu`, `cpu-map`) takes its copy of `batch` here; the GPU systems' batches are in device
    /// memory already.
    fn stage(&mut self, _batch: &DeviceBatch) -> Result<()> {
        Ok(())
    }
    /// Runs one batch.
    fn run(&mut self, batch: &DeviceBatch) -> Result<()>;
    /// Untimed, after `run`: such a system puts the batch's results in its device buffers,
    /// where the suite checks them.
    fn settle(&mut self, _batch: &DeviceBatch) -> Result<()> {
        Ok(())
    }
    /// Runs `batches` in order, as many in flight as the system allows (one at a time unless it
    /// has a pipeline), `stage` and `settle` untimed around each one run alone.
    fn run_in_flight(&mut self, batches: &[DeviceBatch]) -> Result<Timed> {
        one_at_a_time(self, batches)
    }
    /// Closes the system's pool cleanly where it has one (dropping it leaves the pool as a
    /// crash would).
    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
    /// Published keys.
    fn len(&self) -> u64;
    /// Whether the table is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Modelled traffic of one operation of `kind` that finds (`hit`) or misses its key.
    fn traffic(&self, kind: OpKind, hit: bool) -> Traffic;
}

/// The times of batches run together.
#[derive(Clone, Debug, Default)]
pub struct Timed {
    /// Each batch's latency: from the start of its run (or submit) to its end.
    pub latencies: Vec<Duration>,
    /// The time the system spent running them: their latencies' sum when they ran one at a
    /// time, the span from the first submit to the last end when they overlapped.
    pub busy: Duration,
}

/// Runs `batches` through `system` one at a time, `stage` and `settle` untimed around each.
pub fn one_at_a_time<S: System + ?Sized>(system: &mut S, batches: &[DeviceBatch]) -> Result<Timed> {
    let mut timed = Timed::default();
    for b in batches {
        system.stage(b)?;
        let t = Instant::now();
        system.run(b)?;
        let latency = t.elapsed();
        timed.latencies.push(latency);
        timed.busy += latency;
        system.settle(b)?;
    }
    Ok(timed)
}

/// The buffers of one batch on the device, made from a host [`Batch`].
pub struct DeviceOps {
    len: u32,
    kinds: wgpu::Buffer,
    keys: wgpu::Buffer,
    values: wgpu::Buffer,
    statuses: wgpu::Buffer,
    found: wgpu::Buffer,
    value_bytes: usize,
    /// Every operation is a get (the batch says so to the index: phase A alone).
    reads_only: bool,
}

impl DeviceOps {
    /// Uploads a batch (keys and values as the host API encodes them).
    pub fn new(gpu: &Gpu, batch: &Batch) -> DeviceOps {
        let cell_words = batch.value_bytes().div_ceil(4);
        let n = batch.len();
        let mut encoded = gphash::Encoded::default();
        batch.encode(&mut encoded);
        if encoded.values.is_empty() {
            encoded.values = vec![0; n * cell_words];
        }
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let init = |label, words: &[u32]| {
            let words: &[u32] = if words.is_empty() { &[0] } else { words };
            gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::cast_slice(words),
                usage,
            })
        };
        DeviceOps {
            len: n as u32,
            kinds: init("kinds", &encoded.kinds),
            keys: init("keys", &encoded.keys),
            values: init("values", &encoded.values),
            statuses: init("statuses", &vec![0; n]),
            found: init("found", &vec![0; n * cell_words]),
            value_bytes: batch.value_bytes(),
            reads_only: encoded.read_only(),
        }
    }

    /// Uploads another batch into these buffers (made anew where they are too small); the
    /// statuses are cleared, so that an operation no system answered shows as status 0.
    pub fn load(&mut self, gpu: &Gpu, batch: &Batch) {
        let cell_words = batch.value_bytes().div_ceil(4);
        let n = batch.len();
        let fits = |b: &wgpu::Buffer, words: usize| b.size() >= (words.max(1) * 4) as u64;
        let key_words = batch.key_bytes().div_ceil(4);
        if batch.value_bytes() != self.value_bytes
            || !fits(&self.keys, n * key_words)
            || !fits(&self.found, n * cell_words)
            || !fits(&self.statuses, n)
        {
            *self = DeviceOps::new(gpu, batch);
            return;
        }
        let mut encoded = gphash::Encoded::default();
        batch.encode(&mut encoded);
        gpu.queue.write_buffer(&self.kinds, 0, bytemuck::cast_slice(&encoded.kinds));
        gpu.queue.write_buffer(&self.keys, 0, bytemuck::cast_slice(&encoded.keys));
        if !encoded.values.is_empty() {
            gpu.queue.write_buffer(&self.values, 0, bytemuck::cast_slice(&encoded.values));
        }
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        enc.clear_buffer(&self.statuses, 0, Some((n as u64 * 4).next_multiple_of(4).max(4)));
        gpu.submit([enc.finish()]);
        self.len = n as u32;
        self.reads_only = encoded.read_only();
    }

    /// `batch` uploaded into the buffers kept in `slot` (made there by the first call).
    pub fn reuse<'a>(slot: &'a mut Option<DeviceOps>, gpu: &Gpu, batch: &Batch) -> &'a DeviceOps {
        match slot {
            Some(d) => {
                d.load(gpu, batch);
                d
            }
            None => slot.insert(DeviceOps::new(gpu, batch)),
        }
    }

    /// The batch, for [`System::run`].
    pub fn batch(&self) -> DeviceBatch<'_> {
        DeviceBatch {
            len: self.len,
            kinds: &self.kinds,
            keys: &self.keys,
            values: &self.values,
            statuses: &self.statuses,
            found: &self.found,
            reads_only: self.reads_only,
        }
    }

    /// Downloads the status codes.
    pub fn statuses(&self, gpu: &Gpu) -> Result<Vec<u32>> {
        Ok(download_words(gpu, &self.statuses, self.len as u64)?)
    }

    /// The operations of `ops`, the batch these buffers hold, whose results `check` does not
    /// accept (statuses, and the values reads found).
    pub fn unexpected(&self, gpu: &Gpu, ops: &[Op], check: &Check) -> Result<u64> {
        let statuses = self.statuses(gpu)?;
        let reads = ops.iter().any(|o| o.kind == OpKind::Get);
        let found = if reads { download(gpu, &self.found)? } else { vec![] };
        let cell_bytes = self.value_bytes.div_ceil(4) * 4;
        let bytes: &[u8] = bytemuck::cast_slice(&found);
        let wrong = ops.iter().zip(&statuses).enumerate().filter(|&(i, (op, &s))| {
            let found = op.kind == OpKind::Get && s == Status::Ok as u32;
            let value = found.then(|| &bytes[i * cell_bytes..i * cell_bytes + self.value_bytes]);
            !check.accepts(op, u8::try_from(s).unwrap_or(u8::MAX), value)
        });
        Ok(wrong.count() as u64 + ops.len().saturating_sub(statuses.len()) as u64)
    }

    /// Downloads the results: a status per operation and the value each found (for reads that
    /// found their key; `None` otherwise).
    pub fn results(&self, gpu: &Gpu, batch: &Batch) -> Result<Vec<(Status, Option<Vec<u8>>)>> {
        let statuses = download(gpu, &self.statuses)?;
        let found = download(gpu, &self.found)?;
        let cell_bytes = self.value_bytes.div_ceil(4) * 4;
        let bytes: &[u8] = bytemuck::cast_slice(&found);
        (0..self.len as usize)
            .map(|i| {
                let s = Status::from_code(statuses[i])
                    .ok_or_else(|| Error::Gpu(format!("operation {i}: status code {}", statuses[i])))?;
                let read = (batch.op(i).0 == OpKind::Get && s == Status::Ok)
                    .then(|| bytes[i * cell_bytes..i * cell_bytes + self.value_bytes].to_vec());
                Ok((s, read))
            })
            .collect()
    }
}

/// Reads a whole storage buffer (made with `COPY_SRC`) back to the host.
pub fn download(gpu: &Gpu, buffer: &wgpu::Buffer) -> Result<Vec<u32>> {
    Ok(download_words(gpu, buffer, buffer.size() / 4)?)
}

/// Writes words into a storage buffer (made with `COPY_DST`), in queue order.
pub fn upload(gpu: &Gpu, buffer: &wgpu::Buffer, words: &[u32]) {
    gpu.queue.write_buffer(buffer, 0, bytemuck::cast_slice(words));
}

/// The way the host systems (`cpu`, `cpu-map`) receive a batch: its inputs copied from the
/// device to the host, applied there, its results copied back.
///
/// In the suite a host system plays a CPU application, which holds its batches in host
/// memory: [`System::stage`] copies the inputs over and [`System::settle`] the results back,
/// both untimed, as the GPU systems' uploads are. Called without `stage`, `run` makes both
/// copies itself.
pub struct HostBatches {
    gpu: Arc<Gpu>,
    key_words: usize,
    value_words: usize,
    /// The readback buffer of batches, kept for the next (grown as needed).
    staging: Option<wgpu::Buffer>,
    /// The inputs of the batch `stage` copied (kinds, keys, values), with the batch's kinds
    /// buffer, which names the batch.
    staged: Option<(wgpu::Buffer, [Vec<u32>; 3])>,
    /// The statuses and found values of a staged batch, for `settle`, with its kinds buffer.
    results: Option<(wgpu::Buffer, Vec<u32>, Vec<u32>)>,
}

impl HostBatches {
    /// Batches of `gpu` with keys of `key_words` words and values of `value_words`.
    pub fn new(gpu: Arc<Gpu>, key_words: usize, value_words: usize) -> Self {
        HostBatches { gpu, key_words, value_words, staging: None, staged: None, results: None }
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Copies the inputs of `batch` to the host for the next `run` of the same batch.
    pub fn stage(&mut self, batch: &DeviceBatch) -> Result<()> {
        self.staged = None;
        if batch.len > 0 {
            self.staged = Some((batch.kinds.clone(), self.download(batch)?));
        }
        Ok(())
    }

    /// Has `apply` turn the batch's kinds, keys and values (empty when no operation writes
    /// one) into statuses and found values. A staged batch keeps its results for `settle`;
    /// any other has them uploaded before this returns, as the GPU systems do.
    pub fn run(
        &mut self,
        batch: &DeviceBatch,
        apply: impl FnOnce(&[u32], &[u32], &[u32]) -> Result<(Vec<u32>, Vec<u32>)>,
    ) -> Result<()> {
        // Inputs staged for another batch are dropped, never applied to this one.
        let staged = self.staged.take().filter(|(of, _)| of == batch.kinds);
        if batch.len == 0 {
            return Ok(());
        }
        let (inputs, staged) = match staged {
            Some((_, inputs)) => (inputs, true),
            None => (self.download(batch)?, false),
        };
        let [kinds, keys, values] = &inputs;
        let (statuses, found) = apply(kinds, keys, values)?;
        let reads = kinds.contains(&(OpKind::Get as u32));
        let found = if reads { found } else { vec![] };
        self.results = Some((batch.kinds.clone(), statuses, found));
        if staged { Ok(()) } else { self.settle(batch) }
    }

    /// Uploads the results of the last batch run to its device buffers and waits for them;
    /// an error if `batch` is not the batch they are of.
    pub fn settle(&mut self, batch: &DeviceBatch) -> Result<()> {
        let Some((of, statuses, found)) = self.results.take() else {
            return Ok(());
        };
        if of != *batch.kinds {
            return Err(Error::InvalidConfig("settling a batch other than the one run last".into()));
        }
        upload(&self.gpu, batch.statuses, &statuses);
        if !found.is_empty() {
            upload(&self.gpu, batch.found, &found);
        }
        self.gpu.submit([]);
        Ok(self.gpu.wait()?)
    }

    /// Validates `batch` and copies its kinds and keys (and values when some operation writes
    /// one) to the host.
    fn download(&mut self, batch: &DeviceBatch) -> Result<[Vec<u32>; 3]> {
        let (n, kw, vw) = (batch.len as usize, self.key_words, self.value_words);
        batch.validate(kw as u32, vw as u32)?;
        let mut inputs = self.download_prefixes(&[(batch.kinds, n), (batch.keys, n * kw)])?;
        let writes = inputs[0].iter().any(|&k| OpKind::from_code(k).is_some_and(OpKind::writes_value));
        let values =
            if writes { self.download_prefixes(&[(batch.values, n * vw)])?.remove(0) } else { vec![] };
        let keys = inputs.pop().expect("two prefixes");
        let kinds = inputs.pop().expect("two prefixes");
        Ok([kinds, keys, values])
    }

    /// Copies the first `words` words of each buffer to the host with one submission and one
    /// map, through the kept readback buffer.
    fn download_prefixes(&mut self, buffers: &[(&wgpu::Buffer, usize)]) -> Result<Vec<Vec<u32>>> {
        let total: u64 = buffers.iter().map(|&(_, w)| w as u64 * 4).sum();
        if total == 0 {
            return Ok(buffers.iter().map(|_| vec![]).collect());
        }
        if self.staging.as_ref().is_none_or(|s| s.size() < total) {
            self.staging = Some(self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("host batch download"),
                size: total.next_power_of_two(),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let staging = self.staging.as_ref().expect("made above");
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        let mut at = 0;
        for &(buf, words) in buffers {
            let bytes = words as u64 * 4;
            if bytes > 0 {
                enc.copy_buffer_to_buffer(buf, 0, staging, at, bytes);
            }
            at += bytes;
        }
        self.gpu.submit([enc.finish()]);
        let mut out = vec![];
        gphash_gpu::resources::map_read(&self.gpu, staging, 0..total, |b| {
            let words: &[u32] = bytemuck::cast_slice(b);
            let mut at = 0;
            for &(_, w) in buffers {
                out.push(words[at..at + w].to_vec());
                at += w;
            }
        })?;
        Ok(out)
    }
}

/// Runs `batch` through `system` and returns its results: for tests that hold a system to the
/// oracle, and for loading tables.
pub fn run_host(
    system: &mut dyn System,
    gpu: &Arc<Gpu>,
    batch: &Batch,
) -> Result<Vec<(Status, Option<Vec<u8>>)>> {
    let ops = DeviceOps::new(gpu, batch);
    system.run(&ops.batch())?;
    ops.results(gpu, batch)
}
