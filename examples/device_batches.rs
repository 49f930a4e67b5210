//! Device batches: keys, values and results in wgpu buffers on the index's GPU, for
//! applications whose data already lives there; nothing is copied through the host.
//!
//! `cargo run --release --example device_batches`

use std::error::Error;

use gphash::{DeviceBatch, OpKind, Status, TypedIndex};
use wgpu::util::DeviceExt;

fn main() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir())?;
    let map = TypedIndex::<u64, u64>::create(dir.path().join("device.pool"), 10_000)?;

    // Device batches need the GPU the index runs on, which starts while the open returns;
    // without one the index runs on the CPU model.
    let gpu = match map.index().wait_for_gpu() {
        Ok(gpu) => gpu.clone(),
        Err(why) => {
            println!("No GPU ({why}): device batches need one, and this index runs on the CPU model.");
            println!("mode: {}", map.stats().mode);
            return Ok(map.close()?);
        }
    };
    println!("GPU: {} ({})", gpu.info.name, gpu.info.driver);
    let device = &gpu.device;

    // Buffers as an application would hold them: one u32 kind per operation, then keys and
    // values as 4-byte words (a u64 is two), and room for a status and a value per operation.
    let n = 1000u32;
    let keys: Vec<u64> = (0..n as u64).map(|i| i * 7919).collect();
    let values: Vec<u64> = keys.iter().map(|k| k + 1).collect();
    let buffer = |contents: &[u8]| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        })
    };
    let inserts = buffer(bytemuck::cast_slice(&vec![OpKind::Insert as u32; n as usize]));
    let gets = buffer(bytemuck::cast_slice(&vec![OpKind::Get as u32; n as usize]));
    let keys_buf = buffer(bytemuck::cast_slice(&keys));
    let values_buf = buffer(bytemuck::cast_slice(&values));
    let statuses = buffer(&vec![0; n as usize * 4]);
    let found = buffer(&vec![0; n as usize * 8]);

    // Insert from device buffers: acknowledged (persisted) when `execute_device` returns.
    let batch = DeviceBatch {
        len: n,
        kinds: &inserts,
        keys: &keys_buf,
        values: &values_buf,
        statuses: &statuses,
        found: &found,
        reads_only: false,
    };
    map.index().execute_device(&batch)?;
    // The host API sees them.
    assert_eq!(map.len(), n as u64);
    assert_eq!(map.get(&keys[3])?, Some(values[3]));

    // Read them back into `found`, on the device: a batch of gets only, which says so, runs as
    // one kernel. Copied to the host here only to check them.
    map.index().execute_device(&DeviceBatch { kinds: &gets, reads_only: true, ..batch })?;
    let status_codes: Vec<u32> = read_back(&gpu, &statuses)?;
    assert!(status_codes.iter().all(|&s| s == Status::Ok as u32));
    assert_eq!(read_back::<u64>(&gpu, &found)?, values);
    println!("{n} inserts and {n} reads ran from device buffers; every value read back matches");

    map.close()?;
    Ok(())
}

/// Copies a buffer to the host (through a mappable staging buffer).
fn read_back<T: bytemuck::Pod>(gpu: &gphash::Gpu, buffer: &wgpu::Buffer) -> Result<Vec<T>, Box<dyn Error>> {
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: buffer.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, buffer.size());
    // Through the device's queue lock: the index submits to the same queue (Gpu::submit).
    gpu.submit([encoder.finish()]);
    staging.slice(..).map_async(wgpu::MapMode::Read, |r| r.expect("map the staging buffer"));
    gpu.device.poll(wgpu::PollType::wait_indefinitely())?;
    Ok(bytemuck::pod_collect_to_vec(&staging.slice(..).get_mapped_range()?))
}
