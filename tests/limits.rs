//! Batches beyond what one engine batch can hold on the device: the GPU runs them as several
//! engine batches and gives the CPU executor's results; a device batch too large is refused
//! with a typed error; a buffer beyond a device limit is a GPU error, never a panic.

mod common;

use gphash::{Batch, Config, DeviceBatch, Error, GpHash, GpuOptions, OpKind, Options, Placement, Status};
use wgpu::util::DeviceExt;

/// The value of key `k`: distinct bytes per key and position.
fn value_of(k: u64, value_bytes: usize) -> Vec<u8> {
    (0..value_bytes).map(|i| (k as usize * 31 + i * 7 + i / 251) as u8).collect()
}

/// What a workload saw: every status, every value read, and the content at the end.
#[derive(PartialEq, Eq)]
struct Seen {
    statuses: Vec<Status>,
    found: Vec<Option<Vec<u8>>>,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Inserts `n` keys with `value_bytes`-byte values in one call, reads them back in one
/// call, then runs an ordered call that updates and deletes some and reads them.
fn workload(t: &GpHash, n: u64, value_bytes: usize) -> Seen {
    let keys: Vec<u8> = (0..n).flat_map(|k| common::key(k, 8)).collect();
    let values: Vec<u8> = (0..n).flat_map(|k| value_of(k, value_bytes)).collect();
    let mut statuses = t.insert(&keys, &values).unwrap();
    let read = t.get(&keys).unwrap();
    for k in 0..n as usize {
        assert_eq!(read.value(k), Some(&values[k * value_bytes..(k + 1) * value_bytes]), "key {k}");
    }
    let mut found: Vec<Option<Vec<u8>>> =
        (0..n as usize).map(|k| read.value(k).map(<[u8]>::to_vec)).collect();
    statuses.extend(&read.statuses);
    let mut batch = Batch::new(8, value_bytes);
    for k in (0..n).step_by(7) {
        let key = common::key(k, 8);
        batch.update(&key, &value_of(k + 1, value_bytes)).unwrap();
        batch.get(&key).unwrap();
        if k % 2 == 0 {
            batch.delete(&key).unwrap();
        }
    }
    let r = t.execute_ordered(&batch).unwrap();
    statuses.extend(&r.statuses);
    found.extend((0..batch.len()).map(|i| r.value(i).map(<[u8]>::to_vec)));
    let mut entries = t.entries();
    entries.sort();
    Seen { statuses, found, entries }
}

/// The documented largest values (64 KiB) with 2049 operations, and 1 KiB values with
/// 131 073, on the GPU (their buffers exceed a 128 MiB binding limit in one engine batch) and
/// on the CPU: the same results and content. Anonymous pools: memory only. Devices with a
/// larger limit (an H200 binds 4 GiB) are told 128 MiB, lavapipe's, so that every device
/// splits the calls.
#[test]
fn batches_beyond_the_binding_limit_match_the_cpu() {
    let real = common::gpu().expect("the binding limit is the GPU's").info.max_binding;
    let gpu = common::gpu_with_binding_limit(real.min(128 << 20));
    eprintln!("binding limit {} bytes (the device's: {real})", gpu.info.max_binding);
    let cases = [
        (65_536usize, 2049u64, Placement::ZeroCopy),
        (65_536, 2049, Placement::Staged),
        (1024, 131_073, Placement::ZeroCopy),
    ];
    for (value_bytes, n, placement) in cases {
        let cfg = Config { capacity: n, value_bytes: value_bytes as u32, ..Default::default() };
        let what = format!("{value_bytes}-byte values x {n}, {placement:?}");
        let options = Options {
            device: Some(gpu.clone()),
            ..common::gpu_options(GpuOptions { placement, ..GpuOptions::default() })
        };
        let g = GpHash::create(None, &cfg, &options).unwrap();
        let max = g.stats().max_batch;
        assert!((max as u64) < n, "{what}: one engine batch of {max} holds the call");
        let on_gpu = workload(&g, n, value_bytes);
        assert!(g.check().ok(), "{what}: {}", g.check());
        drop(g);
        let c = GpHash::create(None, &cfg, &common::cpu_options()).unwrap();
        let on_cpu = workload(&c, n, value_bytes);
        drop(c);
        assert!(on_gpu.statuses == on_cpu.statuses, "{what}: statuses differ");
        assert!(on_gpu.found == on_cpu.found, "{what}: values read differ");
        assert!(on_gpu.entries == on_cpu.entries, "{what}: contents differ");
        eprintln!("{what}: engine batches of up to {max}, same as the CPU");
    }
}

/// A device that claims a binding limit larger than it has (an oversized binding): the
/// engine's buffers of a batch exceed the real limit, wgpu refuses them, and the call returns
/// a GPU error (the index is then poisoned), never garbage results or a panic.
#[test]
fn an_oversized_binding_is_a_gpu_error() {
    let real = common::gpu().expect("a binding limit needs a GPU").info.max_binding;
    let liar = common::gpu_with_binding_limit(real * 8);
    let options = Options {
        device: Some(liar),
        ..common::gpu_options(GpuOptions {
            // The table's windows stay within the real limit; the batch buffers do not.
            max_window_bytes: Some(real / 2),
            ..GpuOptions::default()
        })
    };
    let value_bytes = 65_536usize;
    let n = (real / value_bytes as u64) as usize + 1;
    let cfg = Config { capacity: n as u64, value_bytes: value_bytes as u32, ..Default::default() };
    let t = GpHash::create(None, &cfg, &options).unwrap();
    assert!(t.stats().max_batch >= n, "the engine believes the device takes the batch whole");
    let keys: Vec<u8> = (0..n as u64).flat_map(|k| common::key(k, 8)).collect();
    let values = vec![7u8; n * value_bytes];
    match t.insert(&keys, &values) {
        Err(Error::Gpu(why)) => eprintln!("refused: {why}"),
        other => panic!("an oversized binding gave {other:?}"),
    }
    assert!(matches!(t.get(&keys[..8]), Err(Error::Poisoned(_))), "a GPU error poisons the index");
    assert!(t.stats().poisoned.is_some());
}

/// A device batch larger than one engine batch holds is refused with `BatchTooLarge` before
/// anything runs (it used to run on buffers wgpu had refused, and report success); the index
/// stays usable.
#[test]
fn a_device_batch_too_large_is_refused() {
    let gpu = common::gpu().expect("device batches need a GPU");
    let value_bytes = 65_536usize;
    let cfg = Config { capacity: 4096, value_bytes: value_bytes as u32, ..Default::default() };
    let t = GpHash::create(None, &cfg, &common::gpu_options(GpuOptions::default())).unwrap();
    let max = t.stats().max_batch;
    let n = max + 1;
    let (dev, cw) = (&gpu.device, value_bytes / 4);
    let buffer = |words: usize, fill: u32| {
        dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytemuck::cast_slice(&vec![fill; words]),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        })
    };
    let keys: Vec<u32> = (0..n as u32).flat_map(|k| [k, 0]).collect();
    let keys = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&keys),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let (kinds, values) = (buffer(n, OpKind::Insert as u32), buffer(n * cw, 5));
    let (statuses, found) = (buffer(n, 0), buffer(n * cw, 0));
    let mut batch = DeviceBatch {
        len: n as u32,
        kinds: &kinds,
        keys: &keys,
        values: &values,
        statuses: &statuses,
        found: &found,
        reads_only: false,
    };
    match t.execute_device(&batch) {
        Err(Error::BatchTooLarge { len, max: m }) => assert_eq!((len, m), (n as u64, max as u64)),
        other => panic!("a device batch of {n} (engine batches of {max}) gave {other:?}"),
    }
    assert_eq!(t.len(), 0, "nothing was applied");
    // The same buffers, as far as one engine batch reaches, run.
    batch.len = max as u32;
    t.execute_device(&batch).unwrap();
    assert_eq!(t.len(), max as u64);
    assert!(t.check().ok());
}
