//! The `cpu-map` system (`gphash_bench::systems::cpu_map`): its host path and its System path
//! through the GPU, against the oracle. Without a Vulkan device the test fails under `CI=true`.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::oracle::Oracle;
use gphash::{Batch, OpKind};
use gphash_bench::systems::cpu_map::{Chosen, CpuMapSystem, HostMap};
use gphash_bench::systems::{DeviceOps, System, run_host};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Every map crate the suite can run: the chosen one (scc), papaya and dashmap.
#[test]
fn system_through_the_gpu_matches_the_oracle() {
    through_the_gpu_matches_the_oracle::<Chosen>("cpu-map");
    through_the_gpu_matches_the_oracle::<dashmap::DashMap<_, _, _>>("cpu-map-dashmap");
    through_the_gpu_matches_the_oracle::<papaya::HashMap<_, _, _>>("cpu-map-papaya");
}

fn through_the_gpu_matches_the_oracle<M: HostMap>(name: &str) {
    let gpu = match gphash::Gpu::new() {
        Ok(g) => g,
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("CI=true and no GPU: {e}"),
        Err(e) => {
            eprintln!("\n**********\nWARNING: no GPU ({e}): cpu-map is NOT tested\n**********\n");
            return;
        }
    };
    let seed = common::seed(&format!("{name}_system_through_the_gpu_matches_the_oracle"));
    let mut rng = StdRng::seed_from_u64(seed);
    for (key_bytes, value_bytes, threads) in [(8, 128, 4), (32, 8, 1), (12, 20, 3)] {
        let mut system =
            CpuMapSystem::<M>::create(key_bytes, value_bytes, 5000, gpu.clone(), threads).unwrap();
        assert_eq!(system.name(), name);
        assert_eq!(system.threads(), threads);
        assert!(system.setting().contains("volatile"), "{}", system.setting());
        let mut oracle = Oracle::default();
        for b in 0..8 {
            // Few keys: many repeats in one batch, which must see batch order.
            let batch = common::random_batch(
                &mut rng,
                [1, 500, 2000, 33][b % 4],
                300,
                key_bytes as usize,
                value_bytes as usize,
            );
            // Odd batches as the suite runs them: inputs staged to the host, results settled back.
            let got = if b % 2 == 0 {
                run_host(&mut system, &gpu, &batch).unwrap()
            } else {
                let ops = DeviceOps::new(&gpu, &batch);
                system.stage(&ops.batch()).unwrap();
                system.run(&ops.batch()).unwrap();
                system.settle(&ops.batch()).unwrap();
                ops.results(&gpu, &batch).unwrap()
            };
            assert_eq!(got, oracle.run(&batch), "{name}: seed {seed}, {key_bytes}-byte keys, batch {b}");
            assert_eq!(system.len(), oracle.map.len() as u64);
        }
        let mut reads = Batch::new(key_bytes as usize, value_bytes as usize);
        for k in 0..300 {
            reads.get(&common::key(k, key_bytes as usize)).unwrap();
        }
        assert_eq!(run_host(&mut system, &gpu, &reads).unwrap(), oracle.run(&reads));
        let hit = system.traffic(OpKind::Get, true);
        assert!(hit.reads >= 3.0 && hit.bytes == (hit.reads + hit.writes) * 64.0, "{hit:?}");
    }
}

#[test]
fn bad_widths_and_malformed_batches_are_refused() {
    let gpu = match gphash::Gpu::new() {
        Ok(g) => g,
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("CI=true and no GPU: {e}"),
        Err(_) => return,
    };
    for kb in [0, 6, 36] {
        assert!(
            CpuMapSystem::<gphash_bench::systems::cpu_map::Chosen>::create(kb, 8, 10, gpu.clone(), 1)
                .is_err()
        );
    }
    let s: CpuMapSystem = CpuMapSystem::create(8, 8, 10, gpu, 2).unwrap();
    assert!(s.execute(&[9], &[1, 2], &[3, 4]).is_err());
    assert!(s.execute(&[2], &[1], &[3, 4]).is_err());
    assert!(s.execute(&[2], &[5, 2], &[]).is_err());
    assert_eq!(s.len(), 0);
}

/// Inputs staged for one batch are never applied to another: an empty staged batch, or a
/// batch staged and then not run, leaves the next batch to bring its own inputs; settling a
/// batch other than the one run is an error.
#[test]
fn staged_inputs_belong_to_their_batch() {
    let Some(gpu) = gphash::Gpu::new().ok() else {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true and no GPU");
        return;
    };
    let mut system: CpuMapSystem<Chosen> = CpuMapSystem::create(8, 8, 100, gpu.clone(), 2).unwrap();
    let mut oracle = Oracle::default();
    let mut writes = Batch::new(8, 8);
    for k in 0..20 {
        writes.upsert(&common::key(k, 8), &[k as u8; 8]).unwrap();
    }
    let empty = DeviceOps::new(&gpu, &Batch::new(8, 8));
    system.stage(&empty.batch()).unwrap();
    system.run(&empty.batch()).unwrap();
    assert_eq!(run_host(&mut system, &gpu, &writes).unwrap(), oracle.run(&writes));
    assert_eq!(system.len(), 20, "the batch after an empty staged one was applied");
    let mut reads = Batch::new(8, 8);
    for k in 0..30 {
        reads.get(&common::key(k, 8)).unwrap();
    }
    let staged_not_run = DeviceOps::new(&gpu, &writes);
    system.stage(&staged_not_run.batch()).unwrap();
    assert_eq!(run_host(&mut system, &gpu, &reads).unwrap(), oracle.run(&reads));
    let ops = DeviceOps::new(&gpu, &reads);
    system.stage(&ops.batch()).unwrap();
    system.run(&ops.batch()).unwrap();
    assert!(system.settle(&staged_not_run.batch()).is_err(), "results settled into another batch");
}
