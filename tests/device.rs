//! Batches in device buffers: keys and results never leave the GPU.

mod common;
// Only the tests of device batches build it: it needs wgpu, which not every includer of
// `common` links.
#[path = "common/device.rs"]
mod device_buffers;

use device_buffers::download;

use gphash::{CacheOptions, Config, DeviceBatch, Error, GpuOptions, Mode, OpKind, Status};
use wgpu::util::DeviceExt;

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// A storage buffer holding `contents`.
fn storage(device: &wgpu::Device, contents: &[u32]) -> wgpu::Buffer {
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(contents),
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    })
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
    let buffer = |contents: &[u32]| storage(dev, contents);
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
    assert!(download(&gpu, &statuses).iter().all(|&s| s == Status::Ok as u32));
    let host = t.get(&keys).unwrap();
    for i in 0..n as usize {
        assert_eq!(host.value(i), Some(&values[i * 16..i * 16 + 16]));
    }
    // Reads from device buffers return what the host wrote, into device buffers.
    let gets = buffer(&vec![OpKind::Get as u32; n as usize]);
    let batch = DeviceBatch { kinds: &gets, ..batch };
    t.execute_device(&batch).unwrap();
    assert!(download(&gpu, &statuses).iter().all(|&s| s == Status::Ok as u32));
    assert_eq!(download(&gpu, &found), words(&values));
    assert_eq!(t.len(), n as u64);
    assert!(t.check().ok());

    // The same gets, declared reads-only (phase A alone, kept bind group): the same results,
    // twice over the same buffers.
    for _ in 0..2 {
        let clear = vec![0u8; n as usize * 16];
        queue.write_buffer(&found, 0, &clear);
        queue.write_buffer(&statuses, 0, &clear[..n as usize * 4]);
        t.execute_device(&DeviceBatch { reads_only: true, ..batch }).unwrap();
        assert!(download(&gpu, &statuses).iter().all(|&s| s == Status::Ok as u32));
        assert_eq!(download(&gpu, &found), words(&values));
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
    let got = download(&gpu, &statuses);
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

/// A batch of gets larger than a search dispatch over host memory takes (2^16 invocations: each
/// lane then serves several operations in turn) finds what the host API finds (after inserts
/// and updates of every key in one batch each), and counts every operation that is not a get,
/// wherever it falls.
#[test]
fn large_batches_over_host_memory() {
    let Some(gpu) = common::gpu() else {
        panic!("device batches need a GPU");
    };
    let (stored, n) = (140_000u64, 150_000usize);
    let dir = common::pool_dir();
    let cfg = Config { capacity: stored, value_bytes: 8, ..Default::default() };
    // No cache: the searches read the pool.
    let cache = CacheOptions { ratio: Some(0.0), ..Default::default() };
    let options = common::gpu_options(GpuOptions { cache, ..Default::default() });
    let t = common::table(&dir, "large", &cfg, &options);
    // The cap is for tables the searches read in host memory.
    assert_eq!(t.stats().mode, Mode::ZeroCopy, "the pool must be imported (pools go on /dev/shm)");
    assert!(t.stats().max_batch > stored as usize, "one engine batch for all the inserts");
    // Inserts, then updates, of every key in one batch each (phase A, uncapped, alongside).
    let stored_keys: Vec<u8> = (0..stored).flat_map(|k| common::key(k, 8)).collect();
    let first: Vec<u8> = (0..stored).flat_map(|k| (!k).to_le_bytes()).collect();
    assert!(t.insert(&stored_keys, &first).unwrap().iter().all(|&s| s == Status::Ok));
    let value = |k: u64| (k * 0x9E37_79B9).to_le_bytes();
    let values: Vec<u8> = (0..stored).flat_map(value).collect();
    assert!(t.update(&stored_keys, &values).unwrap().iter().all(|&s| s == Status::Ok));
    assert!(t.check().ok(), "{}", t.check());
    assert_eq!(t.cells_used().unwrap(), stored, "the updates freed every old cell");
    // Keys present and absent, shuffled by a stride coprime with n.
    let ids: Vec<u64> = (0..n as u64).map(|i| (i * 7_919) % (stored + 10_000)).collect();
    let keys: Vec<u8> = ids.iter().flat_map(|&k| common::key(k, 8)).collect();
    let dev = &gpu.device;
    let buffer = |contents: &[u32]| storage(dev, contents);
    let gets = buffer(&vec![OpKind::Get as u32; n]);
    let (keys_buf, values_buf) = (buffer(&words(&keys)), buffer(&vec![0; 2 * n]));
    let (statuses, found) = (buffer(&vec![0; n]), buffer(&vec![0; 2 * n]));
    let batch = DeviceBatch {
        len: n as u32,
        kinds: &gets,
        keys: &keys_buf,
        values: &values_buf,
        statuses: &statuses,
        found: &found,
        reads_only: true,
    };
    // Each lane serves two or three operations at 150,000, one or two at 100,000.
    for len in [n, 100_000] {
        t.execute_device(&DeviceBatch { len: len as u32, ..batch }).unwrap();
        let (got, got_values) = (download(&gpu, &statuses), download(&gpu, &found));
        let want = t.get(&keys[..len * 8]).unwrap();
        for i in 0..len {
            assert_eq!(got[i], want.statuses[i] as u32, "{len} gets, operation {i} (key {}): status", ids[i]);
            let stored_key = if ids[i] < stored { Status::Ok } else { Status::NotFound };
            assert_eq!(
                got[i], stored_key as u32,
                "{len} gets, operation {i} (key {}): found iff stored",
                ids[i]
            );
            if let Some(v) = want.value(i) {
                assert_eq!(v, value(ids[i]), "{len} gets, operation {i}: the updated value");
                assert_eq!(&got_values[2 * i..2 * i + 2], &words(v)[..], "{len} gets, operation {i}: value");
            }
        }
        if len == n {
            let hits = want.statuses.iter().filter(|&&s| s == Status::Ok).count();
            assert_eq!(hits, stored as usize, "every stored key once, and 10,000 absent ones");
        }
    }
    // Deletes among the gets, in every lane's later turns too: counted, not run.
    let mut kinds = vec![OpKind::Get as u32; n];
    let refused: Vec<usize> = (0..n).step_by(9_973).collect();
    for &i in &refused {
        kinds[i] = OpKind::Delete as u32;
    }
    let kinds = buffer(&kinds);
    match t.execute_device(&DeviceBatch { kinds: &kinds, ..batch }) {
        Err(Error::NotReadsOnly { count }) => assert_eq!(count, refused.len() as u64),
        other => panic!("a reads-only batch with deletes gave {other:?}"),
    }
    assert_eq!(t.len(), stored, "nothing was deleted");
}

/// Re-runs the device-batch tests (reads-only batches and their refusals among them, batches
/// larger than a search dispatch) at the subgroup sizes lavapipe can be given.
#[test]
fn subgroup_sizes_4_to_128() {
    common::rerun_at_subgroup_sizes(
        &["device_batches_match_the_host_api", "large_batches_over_host_memory"],
        2,
    );
}
