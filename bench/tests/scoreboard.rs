//! The scoreboard end to end on small tables: every regime's rows, each gphash record beside
//! the best crate's of the same workload, nothing answered wrongly, and the Markdown naming
//! where gphash is behind. Without a Vulkan device the test fails (see `common::gpu`).

#[path = "../../tests/common/mod.rs"]
mod common;

use gphash_bench::ceiling::Ceilings;
use gphash_bench::runner;
use gphash_bench::scoreboard::{self, Regime, Scoreboard};
use gphash_bench::systems::cpu_map::CRATES;
use gphash_bench::ycsb::{Distribution, Workload};

#[test]
fn every_regime_is_reported_beside_the_best_crate() {
    let Some(gpu) = common::gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let board = Scoreboard {
        regimes: Regime::ALL.to_vec(),
        records: 3000,
        past_records: 6000,
        // A cache of a few groups: the table is past it.
        past_cache_bytes: 64 << 10,
        workloads: vec![Workload::C, Workload::A],
        distributions: vec![Distribution::Uniform, Distribution::default()],
        ops: 2048,
        batches: vec![1024],
        key_bytes: 8,
        value_bytes: 32,
        reps: 2,
        seed: 3,
        pool_dir: dir.path().to_path_buf(),
        cpu_threads: 2,
        tile: 32,
    };
    let mut heard = vec![];
    let results = board.run(&gpu, &[], &|_| {}, &mut |g, r| heard.push((g, r.system.clone()))).unwrap();
    assert_eq!(heard.len(), results.records.len() - 5 * 4, "H shares G's peer records, not heard again");
    for (g, r) in &results.records {
        assert_eq!(r.unexpected, 0, "{g:?} {} {}", r.system, r.workload);
    }
    let names = ["load", "c uniform", "c zipf:0.99", "a uniform", "a zipf:0.99"];
    for (regime, systems) in [
        (Regime::G, &["gphash-zc"][..]),
        (Regime::H, &["gphash-host"]),
        (Regime::P, &["gphash-zc", "gphash-nocache"]),
    ] {
        let rows: Vec<_> = results.rows.iter().filter(|r| r.regime == regime).collect();
        assert_eq!(rows.len(), names.len() * systems.len(), "{regime:?}");
        for (i, row) in rows.iter().enumerate() {
            let what = format!("{regime:?} {} {}", row.gphash.system, row.gphash.workload);
            assert_eq!(row.gphash.workload, names[i / systems.len()], "{what}");
            assert_eq!(row.gphash.system, systems[i % systems.len()], "{what}");
            assert_eq!(row.peer.system, runner::BEST, "{what}");
            assert_eq!(row.peer.workload, row.gphash.workload, "{what}");
            assert!(CRATES.contains(&row.peer_crate.as_str()), "{what}: {}", row.peer_crate);
            assert!((row.ratio() - row.gphash.ops_per_s / row.peer.ops_per_s).abs() < 1e-9, "{what}");
            let records = if regime == Regime::P { board.past_records } else { board.records };
            let peer_len = results
                .records
                .iter()
                .find(|(g, r)| *g == regime && r.system == runner::BEST && r.workload == "load")
                .map(|(_, r)| r.operations);
            assert_eq!(peer_len, Some(records), "{what}: the peer loads the regime's records");
        }
    }
    let p_cached =
        results.rows.iter().find(|r| r.regime == Regime::P && r.gphash.system == "gphash-zc").unwrap();
    assert!(!p_cached.gphash.setting.contains("cache of 100%"), "{}", p_cached.gphash.setting);
    let md = scoreboard::markdown(&board, &results, "test device");
    for regime in Regime::ALL {
        assert!(md.contains(regime.title()), "{md}");
    }
    let behind = results.rows.iter().filter(|r| r.ratio() < 1.0).count();
    assert_eq!(md.contains("Behind the CPU map"), behind > 0, "{md}");
    let out = dir.path().join("out");
    scoreboard::write_files(&board, &results, "test device", &[], &[], &out).unwrap();
    assert_eq!(std::fs::read_to_string(out.join("scoreboard.md")).unwrap(), md);
    for sub in ["g", "h", "p"] {
        assert!(out.join(sub).join("results.csv").exists(), "{sub}");
    }
}

#[test]
fn the_wire_ceiling_counts_each_direction() {
    let c = Ceilings { seq_read: 1e9, seq_write: 2e9, random_read: [1.0; 3], random_write: 1.0, cas: 1.0 };
    // C: 4 + 8 bytes in, 4 + 128 out: bound by the results, written at 2 GB/s.
    let read = scoreboard::wire_ceiling(&c, Workload::C, 8, 128);
    assert!((read - 2e9 / 132.0).abs() < 1.0, "{read}");
    // LOAD: 4 + 8 + 128 bytes in at 1 GB/s, 4 out.
    let load = scoreboard::wire_ceiling(&c, Workload::Load, 8, 128);
    assert!((load - 1e9 / 140.0).abs() < 1.0, "{load}");
}
