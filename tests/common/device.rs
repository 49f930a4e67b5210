//! Batches in device buffers, for the tests of `execute_device` and the device pipeline.
#![allow(dead_code, unreachable_pub)]

use gphash::{Batch, DeviceBatch, Encoded, Gpu};
use wgpu::util::DeviceExt;

/// A batch's buffers on the device, made from its encoding: kinds, keys, values, statuses
/// (each `u32::MAX` until written), found values.
pub struct Buffers {
    pub len: u32,
    pub reads_only: bool,
    pub buffers: [wgpu::Buffer; 5],
}

impl Buffers {
    /// The buffers of `b`; `reads_only` is what the batch declares.
    pub fn new(gpu: &Gpu, b: &Batch, reads_only: bool) -> Buffers {
        let mut e = Encoded::default();
        b.encode(&mut e);
        let n = b.len();
        let vw = b.value_bytes().div_ceil(4);
        if e.values.is_empty() {
            e.values = vec![0; n * vw];
        }
        let buffer = |words: &[u32]| {
            let words = if words.is_empty() { &[0][..] } else { words };
            gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytemuck::cast_slice(words),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            })
        };
        let (statuses, found) = (vec![u32::MAX; n], vec![0; n * vw]);
        let buffers = [&e.kinds, &e.keys, &e.values, &statuses, &found].map(|w| buffer(w));
        Buffers { len: n as u32, reads_only, buffers }
    }

    pub fn batch(&self) -> DeviceBatch<'_> {
        let [kinds, keys, values, statuses, found] = &self.buffers;
        DeviceBatch { len: self.len, kinds, keys, values, statuses, found, reads_only: self.reads_only }
    }
}

/// The words of a device buffer.
pub fn download(gpu: &Gpu, buf: &wgpu::Buffer) -> Vec<u32> {
    gphash_gpu::resources::download_words(gpu, buf, buf.size() / 4).unwrap()
}
