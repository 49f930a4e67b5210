//! The `gphash` command line: create, replay, stats, check and the demo.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Output};

use common::oracle::Oracle;
use gphash::{OpKind, Status};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn gphash(args: &[&str]) -> Output {
    let gpu = if common::gpu().is_some() { "gpu" } else { "cpu" };
    let out =
        Command::new(env!("CARGO_BIN_EXE_gphash")).args(args).args(["--executor", gpu]).output().unwrap();
    eprintln!(
        "$ gphash {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `gphash create` of an 8-byte-key table.
fn create(pool: &Path, value_bytes: &str, capacity: &str) -> Output {
    gphash(&["create", s(pool), "--key-bytes", "8", "--value-bytes", value_bytes, "--capacity", capacity])
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A trace of every operation kind on a small key space, and the lines one-by-one
/// application gives.
fn random_trace(rng: &mut StdRng, n: usize) -> (String, String) {
    let mut trace = String::from("# a test trace\n");
    let mut oracle = Oracle::default();
    let mut batch = gphash::Batch::new(8, 4);
    for _ in 0..n {
        let k: u64 = rng.random_range(0..200);
        let v: [u8; 4] = rng.random();
        let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
        let (line, kind) = match rng.random_range(0..5) {
            0 => (format!("I {k} {hex}"), OpKind::Insert),
            1 => (format!("P {k} {hex}"), OpKind::Upsert),
            2 => (format!("U {k} {hex}"), OpKind::Update),
            3 => (format!("R {k}"), OpKind::Get),
            _ => (format!("D 0x{}", hex_key(k)), OpKind::Delete),
        };
        writeln!(trace, "{line}").unwrap();
        batch.push(kind, &k.to_le_bytes(), kind.writes_value().then_some(&v[..])).unwrap();
    }
    let mut expect = String::new();
    for (i, (status, value)) in oracle.run(&batch).into_iter().enumerate() {
        let line = match (batch.op(i).0, status, value) {
            (OpKind::Get, Status::Ok, Some(v)) => v.iter().map(|b| format!("{b:02x}")).collect(),
            (_, Status::Ok, _) => "OK".to_string(),
            (_, Status::NotFound, _) => "NOTFOUND".to_string(),
            (_, Status::Exists, _) => "EXISTS".to_string(),
        };
        writeln!(expect, "{line}").unwrap();
    }
    (trace, expect)
}

fn hex_key(k: u64) -> String {
    k.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn replay_gives_one_by_one_results_and_the_pool_checks_clean() {
    let mut rng = StdRng::seed_from_u64(common::seed("replay"));
    let dir = common::pool_dir();
    let pool = dir.path().join("t.pool");
    let out = create(&pool, "4", "1000");
    assert!(out.status.success());
    assert!(text(&out).contains("2L-2H-8S"));
    assert!(create(&pool, "4", "1000").status.code() != Some(0), "create refuses an existing pool");

    let (trace_text, expect) = random_trace(&mut rng, 3000);
    let trace_path = dir.path().join("ops.trace");
    std::fs::write(&trace_path, &trace_text).unwrap();
    let results = dir.path().join("results");
    for batch in ["1", "97", "5000"] {
        // Each replay starts from the same content: replay the trace once, then undo it by
        // recreating the pool.
        std::fs::remove_file(&pool).unwrap();
        assert!(create(&pool, "4", "1000").status.success());
        let out =
            gphash(&["replay", s(&pool), "--trace", s(&trace_path), "--out", s(&results), "--batch", batch]);
        assert!(out.status.success(), "batch {batch}");
        assert_eq!(std::fs::read_to_string(&results).unwrap(), expect, "batch {batch}");
        let check = gphash(&["check", s(&pool)]);
        assert_eq!(check.status.code(), Some(0), "{}", text(&check));
        assert!(text(&check).contains("consistent"));
    }
    let stats = gphash(&["stats", s(&pool)]);
    assert!(stats.status.success());
    assert!(text(&stats).contains("mode:"));
    assert!(text(&stats).contains("load factor"));
}

#[test]
fn malformed_traces_are_refused_before_anything_is_applied() {
    let dir = common::pool_dir();
    let pool = dir.path().join("t.pool");
    assert!(create(&pool, "2", "1000").status.success());
    let trace_path = dir.path().join("bad.trace");
    std::fs::write(&trace_path, "P 1 aaaa\nP 2 bbbb\nR 3\nP 4 abc\n").unwrap();
    let out = gphash(&["replay", s(&pool), "--trace", s(&trace_path), "--out", s(&dir.path().join("r"))]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).contains("bad.trace:4"), "the error names the line");
    let stats = text(&gphash(&["stats", s(&pool)]));
    assert!(stats.contains("keys:          0 "), "nothing was applied:\n{stats}");
}

#[test]
fn replay_grows_a_small_table() {
    let dir = common::pool_dir();
    let pool = dir.path().join("small.pool");
    assert!(create(&pool, "4", "16").status.success());
    let levels = |out: &Output| text(out).lines().find(|l| l.starts_with("levels:")).unwrap().to_string();
    let before = levels(&gphash(&["stats", s(&pool)]));
    let trace_path = dir.path().join("many.trace");
    std::fs::write(&trace_path, (0..3000).map(|k| format!("I {k} {:08x}\n", k)).collect::<String>()).unwrap();
    let results = dir.path().join("r");
    assert!(gphash(&["replay", s(&pool), "--trace", s(&trace_path), "--out", s(&results)]).status.success());
    assert_eq!(std::fs::read_to_string(&results).unwrap(), "OK\n".repeat(3000));
    let after = gphash(&["stats", s(&pool)]);
    assert_ne!(levels(&after), before, "the table grew");
    assert!(text(&after).contains("keys:          3000 "));
    assert_eq!(gphash(&["check", s(&pool)]).status.code(), Some(0));
}

#[test]
fn a_trace_for_other_key_widths_is_refused() {
    let dir = common::pool_dir();
    let pool = dir.path().join("wide.pool");
    let out = gphash(&["create", s(&pool), "--key-bytes", "16", "--value-bytes", "8"]);
    assert!(out.status.success());
    let trace_path = dir.path().join("narrow.trace");
    std::fs::write(&trace_path, "P 1 0000000000000001\n").unwrap();
    let out = gphash(&["replay", s(&pool), "--trace", s(&trace_path), "--out", s(&dir.path().join("r"))]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).contains("narrow.trace:1"), "the error names the line");
    assert!(text(&out).contains("32 hex digits"), "the error says what a key must be");
}

#[test]
fn check_reports_a_damaged_pool() {
    let dir = common::pool_dir();
    let pool = dir.path().join("t.pool");
    assert!(create(&pool, "8", "100").status.success());
    let trace_path = dir.path().join("t.trace");
    let ops: String = (0..50).map(|k| format!("I {k} {:016x}\n", k * 3)).collect();
    std::fs::write(&trace_path, ops).unwrap();
    assert!(
        gphash(&["replay", s(&pool), "--trace", s(&trace_path), "--out", s(&dir.path().join("r"))])
            .status
            .success()
    );
    // Overwrite one published fingerprint: the key no longer matches its slot.
    let p = host_pm::Pool::open(&pool).unwrap();
    let geo = gphash::GpHash::geometry_of(&p).unwrap();
    let table: &[u32] = bytemuck::cast_slice(p.region(p.header().table_region));
    let (bucket, slot) = (0..geo.buckets())
        .flat_map(|b| (0..geo.layout.slots).map(move |s| (b, s)))
        .find(|&(b, s)| table[geo.state_word(b, s) as usize] >= 2)
        .unwrap();
    let at = p.header().table_region.offset + geo.fp_word(bucket, slot) * 4;
    drop(p);
    let mut bytes = std::fs::read(&pool).unwrap();
    bytes[at as usize] ^= 0xFF;
    std::fs::write(&pool, bytes).unwrap();
    let out = gphash(&["check", s(&pool)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("fingerprint"), "the report says what is wrong");
}

#[test]
fn the_demo_runs_and_reports_its_mode() {
    let out = gphash(&["demo", "--keys", "20000", "--ops", "20000", "--batch", "4096"]);
    assert!(out.status.success());
    let t = text(&out);
    for want in ["mode:", "device:", "M ops/s", "load factor", "0 wrong"] {
        assert!(t.contains(want), "demo output lacks {want:?}");
    }
}
