//! Batches in device buffers: keys and results never leave the GPU.

mod common;

use gphash::{Config, DeviceBatch, Error, OpKind, Status};
use wgpu::util::DeviceExt;

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn read(device: &wgpu::Device, queue: &wgpu::Queue, buf: &wgpu::Buffer) -> Vec<u32> {
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: buf.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buf, 0, &staging, 0, buf.size());
    queue.submit([enc.finish()]);
    staging.slice(..).map_async(wgpu::MapMode::Read, |r| r.unwrap());
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    bytemuck::cast_slice(&staging.slice(..).get_mapped_range().unwrap()).to_vec()
}

#[test]
fn device_batches_match_the_host_api() {
    let Some(gpu) = common::gpu() else {
        panic!("device batches need a GPU");
    };
    let dir = common::pool_dir();
    let cfg = Config { capacity: 4000, value_bytes: 16, ..Default::default() };
    let t = common::gpu_table(&dir, &cfg);
    let (dev, queue) = (&gpu.device, &gpu.queue);
    let buffer = |contents: &[u32]| {
        dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytemuck::cast_slice(contents),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        })
    };
    let n = 2000u32;
    let keys: Vec<u8> = (0..n as u64).flat_map(|k| common::key(k, 8)).collect();
    let values: Vec<u8> = (0..n as u64 * 16).map(|i| (i * 7 % 251) as u8).collect();
    // Inserts from device buffers, then the host sees them.
    let kinds = buffer(&vec![OpKind::Insert as u32; n as usize]);
    let (keys_buf, values_buf) = (buffer(&words(&keys)), buffer(&words(&values)));
    let statuses = buffer(&vec![0; n as usize]);
    let found = buffer(&vec![0; n as usize * 4]);
    let batch = DeviceBatch {
        len: n,
        kinds: &kinds,
        keys: &keys_buf,
        values: &values_buf,
        statuses: &statuses,
        found: &found,
        reads_only: false,
    };
    t.execute_device(&batch).unwrap();
    assert!(read(dev, queue, &statuses).iter().all(|&s| s == Status::Ok as u32));
    let host = t.get(&keys).unwrap();
    for i in 0..n as usize {
        assert_eq!(host.value(i), Some(&values[i * 16..i * 16 + 16]));
    }
    // Reads from device buffers return what the host wrote, into device buffers.
    let gets = buffer(&vec![OpKind::Get as u32; n as usize]);
    let batch = DeviceBatch { kinds: &gets, ..batch };
    t.execute_device(&batch).unwrap();
    assert!(read(dev, queue, &statuses).iter().all(|&s| s == Status::Ok as u32));
    assert_eq!(read(dev, queue, &found), words(&values));
    assert_eq!(t.len(), n as u64);
    assert!(t.check().ok());

    // The same gets, declared reads-only (phase A alone, kept bind group): the same results,
    // twice over the same buffers.
    for _ in 0..2 {
        let clear = vec![0u8; n as usize * 16];
        queue.write_buffer(&found, 0, &clear);
        queue.write_buffer(&statuses, 0, &clear[..n as usize * 4]);
        t.execute_device(&DeviceBatch { reads_only: true, ..batch }).unwrap();
        assert!(read(dev, queue, &statuses).iter().all(|&s| s == Status::Ok as u32));
        assert_eq!(read(dev, queue, &found), words(&values));
    }
    // A reads-only batch that holds other operations: they are not run, the call says how many,
    // and the gets among them ran.
    let mut mixed = vec![OpKind::Get as u32; n as usize];
    let absent: Vec<u8> = (n as u64..2 * n as u64).flat_map(|k| common::key(k, 8)).collect();
    let mixed_keys = {
        let mut k = keys.clone();
        for i in (0..n as usize).step_by(4) {
            mixed[i] = [OpKind::Insert, OpKind::Delete, OpKind::Upsert][i / 4 % 3] as u32;
            k[i * 8..i * 8 + 8].copy_from_slice(&absent[i * 8..i * 8 + 8]);
        }
        k
    };
    let (mixed_kinds, mixed_keys) = (buffer(&mixed), buffer(&words(&mixed_keys)));
    queue.write_buffer(&statuses, 0, &vec![0u8; n as usize * 4]);
    let bad = DeviceBatch { kinds: &mixed_kinds, keys: &mixed_keys, reads_only: true, ..batch };
    match t.execute_device(&bad) {
        Err(Error::NotReadsOnly { count }) => assert_eq!(count, n as u64 / 4),
        other => panic!("a reads-only batch with writes gave {other:?}"),
    }
    let got = read(dev, queue, &statuses);
    for (i, &s) in got.iter().enumerate() {
        let want = if i % 4 == 0 { 0 } else { Status::Ok as u32 };
        assert_eq!(s, want, "operation {i}: status");
    }
    assert_eq!(t.len(), n as u64, "nothing was written");
    let (absent_now, present_now) = (t.get(&absent).unwrap(), t.get(&keys).unwrap());
    for i in 0..n as usize {
        assert_eq!(absent_now.value(i), None, "no insert or upsert took effect");
        assert_eq!(present_now.value(i), Some(&values[i * 16..i * 16 + 16]), "no delete took effect");
    }
    assert!(t.check().ok());

    // A buffer too small for the batch is refused before anything runs.
    let small = buffer(&[0; 4]);
    let bad = DeviceBatch { keys: &small, ..batch };
    assert!(matches!(t.execute_device(&bad), Err(Error::InvalidConfig(_))));
    assert_eq!(t.len(), n as u64, "a refused batch changes nothing");

    // The CPU executor cannot take device buffers.
    let c = common::table(&dir, "c", &cfg, &common::cpu_options());
    assert!(matches!(c.execute_device(&batch), Err(Error::MissingFeature(_))));
}

/// Re-runs the device-batch test (reads-only batches and their refusals among them) at the
/// subgroup sizes lavapipe can be given.
#[test]
fn subgroup_sizes_4_to_128() {
    common::rerun_at_subgroup_sizes(&["device_batches_match_the_host_api"], 1);
}
