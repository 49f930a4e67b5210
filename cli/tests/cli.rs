//! The `gphash` command line: create, replay, stats, check and the demo.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::fmt::Write as _;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

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
            (_, Status::Corrupt, _) => "CORRUPT".to_string(),
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
    let out = create(dir.path(), "4", "1000");
    assert!(text(&out).contains("is a directory"), "create wants a file path, not a directory");

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
    assert!(stats.contains("state:         closed cleanly"), "the failed replay wrote nothing:\n{stats}");
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

/// Overwrites the pool's first published fingerprint: its key no longer matches its slot.
fn flip_a_fingerprint(pool: &Path) {
    let p = host_pm::Pool::open(pool).unwrap();
    let geo = gphash::GpHash::geometry_of(&p).unwrap();
    let table: &[u32] = bytemuck::cast_slice(p.region(p.header().table_region));
    let (bucket, slot) = (0..geo.buckets())
        .flat_map(|b| (0..geo.layout.slots).map(move |s| (b, s)))
        .find(|&(b, s)| table[geo.state_word(b, s) as usize] >= 2)
        .unwrap();
    let at = p.header().table_region.offset + geo.fp_word(bucket, slot) * 4;
    drop(p);
    let mut bytes = std::fs::read(pool).unwrap();
    bytes[at as usize] ^= 0xFF;
    std::fs::write(pool, bytes).unwrap();
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
    flip_a_fingerprint(&pool);
    let out = gphash(&["check", s(&pool)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("fingerprint"), "the report says what is wrong");
}

/// `gphash check DIR` checks each shard of a sharded table and exits with the worst outcome.
#[test]
fn check_covers_every_shard_of_a_sharded_table() {
    let dir = common::pool_dir();
    let table = dir.path().join("sharded");
    let options = common::gpu_options(gphash::GpuOptions::default());
    let t = gphash::ShardedGpHash::create(&table, &gphash::Config::default(), 3, &options).unwrap();
    let keys: Vec<u8> = (0..300u64).flat_map(|k| common::key(k, 8)).collect();
    assert!(t.insert(&keys, &vec![5; 2400]).unwrap().iter().all(|&s| s == Status::Ok));
    t.close().unwrap();
    let out = gphash(&["check", s(&table)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for i in 0..3 {
        assert!(text(&out).contains(&format!("shard {i}: ")), "shard {i} is checked");
    }
    // Shards 0 and 2 swapped: each is consistent, but out of place.
    let swap = |a: &str, b: &str| {
        std::fs::rename(table.join(a), table.join("swap")).unwrap();
        std::fs::rename(table.join(b), table.join(a)).unwrap();
        std::fs::rename(table.join("swap"), table.join(b)).unwrap();
    };
    swap("shard-0000.pool", "shard-0002.pool");
    let out = gphash(&["check", s(&table)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    for i in [0, 2] {
        assert!(text(&out).contains(&format!("shard {i} is out of place")), "{}", text(&out));
    }
    swap("shard-0000.pool", "shard-0002.pool");
    // A fingerprint of shard 1 overwritten: the table is inconsistent.
    flip_a_fingerprint(&table.join("shard-0001.pool"));
    let out = gphash(&["check", s(&table)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    std::fs::remove_file(table.join("gphash-shards")).unwrap();
    let out = gphash(&["check", s(&table)]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no readable gphash-shards"));
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

/// `gphash stats` and `gphash check` on `pool` leave it byte for byte (and its modification
/// time) as it was; returns check's output.
fn inspect_leaves_it_alone(pool: &Path) -> Output {
    let before = common::killed::fingerprint(pool);
    let stats = gphash(&["stats", s(pool)]);
    assert!(stats.status.success(), "{}", text(&stats));
    assert!(common::killed::fingerprint(pool) == before, "stats changed {}", pool.display());
    let check = gphash(&["check", s(pool)]);
    assert!(common::killed::fingerprint(pool) == before, "check changed {}", pool.display());
    check
}

#[test]
fn stats_and_check_never_write_the_pool() {
    let dir = common::pool_dir();
    let clean = dir.path().join("clean.pool");
    assert!(create(&clean, "8", "1000").status.success());
    let check = inspect_leaves_it_alone(&clean);
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));
    assert!(text(&check).contains("closed cleanly"));
    assert!(text(&check).trim_end().ends_with("\nconsistent"));

    let claims = dir.path().join("claims.pool");
    common::killed::with_claims(&claims);
    let check = inspect_leaves_it_alone(&claims);
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));
    assert!(
        text(&check).contains(
            "not closed cleanly; recovery would clear 100 unacknowledged claim(s); consistent after recovery"
        ),
        "{}",
        text(&check)
    );
    let stats = text(&gphash(&["stats", s(&claims)]));
    assert!(stats.contains("keys:          300 "), "shown as recovery leaves it:\n{stats}");
    assert!(stats.contains("not closed cleanly"), "{stats}");

    for built in [false, true] {
        let resizing = dir.path().join(format!("resize-{built}.pool"));
        common::killed::mid_resize(&resizing, built);
        let check = inspect_leaves_it_alone(&resizing);
        assert_eq!(check.status.code(), Some(0), "{}", text(&check));
        assert!(text(&check).contains("complete an interrupted resize; consistent after recovery"));
    }
}

#[test]
fn check_says_why_it_cannot_check_with_status_2() {
    let dir = common::pool_dir();
    let zeros = dir.path().join("zeros");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let pool = dir.path().join("t.pool");
    assert!(create(&pool, "8", "100").status.success());
    let newer = dir.path().join("newer.pool");
    let mut bytes = std::fs::read(&pool).unwrap();
    for copy in 0..2 {
        let at = copy * host_pm::HEADER_COPY_BYTES as usize;
        let raw = &mut bytes[at..at + host_pm::HEADER_COPY_BYTES as usize];
        let mut h = host_pm::decode_header(raw, 1 << 30).unwrap();
        h.version = host_pm::FORMAT_VERSION + 1;
        raw.copy_from_slice(&host_pm::encode_header(&h));
    }
    std::fs::write(&newer, bytes).unwrap();
    let newer_why = format!("version {} is not supported", host_pm::FORMAT_VERSION + 1);
    let cases = [
        (dir.path().join("missing"), "No such file"),
        (zeros, "not a gphash pool"),
        (newer, newer_why.as_str()),
        (dir.path().to_path_buf(), "a directory, but not a sharded table"),
    ];
    for (path, why) in cases {
        let out = gphash(&["check", s(&path)]);
        assert_eq!(out.status.code(), Some(2), "{}", path.display());
        assert!(text(&out).contains(why), "{}: {why:?} not said", path.display());
    }
    // In use by a writer: a check would see its changes half-made.
    let t = gphash::GpHash::open(&pool, &common::cpu_options()).unwrap();
    let before = common::killed::fingerprint(&pool);
    let out = gphash(&["check", s(&pool)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("in use"), "{}", text(&out));
    assert!(common::killed::fingerprint(&pool) == before);
    t.close().unwrap();
    assert_eq!(gphash(&["check", s(&pool)]).status.code(), Some(0));
}

#[test]
fn check_repair_recovers_a_killed_pool_and_closes_it() {
    let dir = common::pool_dir();
    let pool = dir.path().join("claims.pool");
    common::killed::with_claims(&pool);
    let out = gphash(&["check", "--repair", s(&pool)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("repaired: recovered after a crash: 100 unacknowledged claim(s) cleared"));
    let header = *host_pm::Pool::open(&pool).unwrap().header();
    assert!(header.clean_shutdown, "closed cleanly");
    let check = inspect_leaves_it_alone(&pool);
    assert_eq!(check.status.code(), Some(0));
    assert!(text(&check).contains("closed cleanly"));
    assert!(text(&check).contains("keys: 300 "), "{}", text(&check));
    // Nothing to do now: the pool is not written.
    let before = common::killed::fingerprint(&pool);
    let out = gphash(&["check", "--repair", s(&pool)]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out).contains("nothing to repair"));
    assert!(common::killed::fingerprint(&pool) == before);

    let resizing = dir.path().join("resize.pool");
    common::killed::mid_resize(&resizing, true);
    let out = gphash(&["check", "--repair", s(&resizing)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("an interrupted resize was completed"));
    assert!(host_pm::Pool::open(&resizing).unwrap().header().resize.state == 0);
}

#[test]
fn check_repair_leaves_an_inconsistent_pool_alone() {
    let dir = common::pool_dir();
    let pool = dir.path().join("claims.pool");
    common::killed::with_claims(&pool);
    {
        // Two published slots share a value cell.
        let mut p = host_pm::Pool::open(&pool).unwrap();
        let geo = gphash::GpHash::geometry_of(&p).unwrap();
        let region = p.header().table_region;
        let table: &mut [u32] = bytemuck::cast_slice_mut(p.region_mut(region));
        let published: Vec<usize> = (0..geo.buckets())
            .flat_map(|b| (0..geo.layout.slots).map(move |s| geo.state_word(b, s) as usize))
            .filter(|&w| table[w] >= 2)
            .take(2)
            .collect();
        table[published[1]] = table[published[0]];
    }
    let before = common::killed::fingerprint(&pool);
    let out = gphash(&["check", "--repair", s(&pool)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("not repaired"));
    assert!(text(&out).contains("also referenced by"));
    assert!(common::killed::fingerprint(&pool) == before, "an inconsistent pool is not written");
}

#[test]
fn stats_needs_no_gpu() {
    let dir = common::pool_dir();
    let pool = dir.path().join("t.pool");
    assert!(create(&pool, "8", "100").status.success());
    // With no Vulkan driver to be found, opening for batches on a GPU fails, stats does not.
    let hidden = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gphash"))
            .args(args)
            .args(["--executor", "gpu"])
            .env("VK_ICD_FILENAMES", "/nonexistent.json")
            .env("VK_DRIVER_FILES", "/nonexistent.json")
            .output()
            .unwrap()
    };
    let trace_path = dir.path().join("t.trace");
    std::fs::write(&trace_path, "R 1\n").unwrap();
    let replay = hidden(&["replay", s(&pool), "--trace", s(&trace_path), "--out", s(&dir.path().join("r"))]);
    assert!(!replay.status.success(), "the GPU is hidden");
    let stats = hidden(&["stats", s(&pool)]);
    assert!(stats.status.success(), "{}", text(&stats));
    assert!(text(&stats).contains("mode:          chosen when the pool is opened"));
}

/// A compute-only run prints nothing about a display: where `XDG_RUNTIME_DIR` is unset, Mesa's
/// device-select layer printed `error: XDG_RUNTIME_DIR is invalid or not set` at each device
/// enumeration while the instance enabled window-surface extensions. A software device is
/// named as one.
#[test]
fn opening_the_device_prints_no_display_noise() {
    let dir = common::pool_dir();
    let pool = dir.path().join("t.pool");
    // `create` opens the device (`stats` opens none).
    let out = Command::new(env!("CARGO_BIN_EXE_gphash"))
        .args(["create", s(&pool), "--key-bytes", "8", "--value-bytes", "100"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "display noise on stderr:\n{stderr}");
    if common::gpu().is_some_and(|g| g.info.is_cpu()) {
        assert!(text(&out).contains("software Vulkan device"), "{}", text(&out));
    }
}

/// `--executor auto` without any Vulkan driver says on stderr that the CPU model runs the
/// table, even with logging off.
#[test]
fn a_fallback_to_the_cpu_model_is_announced() {
    let dir = common::pool_dir();
    let pool = dir.path().join("t.pool");
    let out = Command::new(env!("CARGO_BIN_EXE_gphash"))
        .args(["create", s(&pool), "--key-bytes", "8", "--value-bytes", "100", "--executor", "auto"])
        .env("VK_ICD_FILENAMES", "/nonexistent.json")
        .env("VK_DRIVER_FILES", "/nonexistent.json")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("running on the CPU model"), "no announcement on stderr:\n{stderr}");
    assert!(text(&out).contains("CPU fallback"));
}
/// `--out` never destroys a pool: not the pool itself by any path, not a pool another process
/// holds open, not a closed pool; nor the trace, nor anything but a regular file. A refused
/// replay changes nothing, and leaves a cleanly closed pool clean.
#[test]
fn replay_refuses_an_output_that_would_destroy_a_pool() {
    let dir = common::pool_dir();
    let (a, b) = (dir.path().join("a.pool"), dir.path().join("b.pool"));
    assert!(create(&a, "4", "100").status.success());
    assert!(create(&b, "4", "100").status.success());
    let trace_path = dir.path().join("t.trace");
    std::fs::write(&trace_path, "P 1 01020304\n").unwrap();
    let replay = |out: &Path| gphash(&["replay", s(&a), "--trace", s(&trace_path), "--out", s(out)]);
    let refused = |out: &Path, why: &str| {
        let kept: Vec<_> = [&a, &b, &trace_path].iter().map(|p| std::fs::read(p).unwrap()).collect();
        let o = replay(out);
        assert_ne!(o.status.code(), Some(0), "--out {out:?}");
        assert!(text(&o).contains(why), "--out {out:?}: the error says {why:?}");
        assert!(text(&o).contains(s(out)), "--out {out:?}: the error names it");
        let now: Vec<_> = [&a, &b, &trace_path].iter().map(|p| std::fs::read(p).unwrap()).collect();
        assert!(kept == now, "--out {out:?}: nothing was written");
    };

    let hard = dir.path().join("hard.pool");
    std::fs::hard_link(&a, &hard).unwrap();
    let soft = dir.path().join("soft.pool");
    std::os::unix::fs::symlink(&a, &soft).unwrap();
    for same in [a.clone(), dir.path().join(".").join("a.pool"), hard, soft] {
        refused(&same, "it is the pool");
    }
    refused(&trace_path, "it is the trace");
    // Another process (this one) holds b.pool open.
    let held = host_pm::Pool::open(&b).unwrap();
    refused(&b, "another process holds its lock");
    drop(held);
    refused(&b, "it holds a gphash pool");
    // A file that is no pool but that another process has locked.
    let locked = dir.path().join("locked");
    std::fs::write(&locked, "mine\n").unwrap();
    let f = std::fs::File::open(&locked).unwrap();
    // SAFETY: flock on a descriptor `f` keeps open.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    refused(&locked, "another process holds its lock");
    drop(f);
    refused(dir.path(), "not a regular file");
    let stats = text(&gphash(&["stats", s(&a)]));
    assert!(stats.contains("state:         closed cleanly"), "{stats}");

    // An ordinary file is replaced.
    let out = dir.path().join("results");
    std::fs::write(&out, "old results\n").unwrap();
    assert!(replay(&out).status.success());
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "OK\n");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!names.iter().any(|n| n.to_string_lossy().starts_with('.')), "no hidden file is left: {names:?}");
}

/// A replay killed at any moment leaves an output of whole batches of complete result lines.
/// Values of 4 KiB make each batch's lines span hundreds of pages, so that kills land in them.
#[test]
fn a_killed_replay_leaves_only_whole_result_lines() {
    const VALUE_BYTES: usize = 4096;
    const KEYS: u64 = 256;
    const BATCH: usize = 96;
    let mut rng = StdRng::seed_from_u64(common::seed("a_killed_replay_leaves_only_whole_result_lines"));
    let dir = common::pool_dir();
    let pool = dir.path().join("big.pool");
    assert!(create(&pool, &VALUE_BYTES.to_string(), "1000").status.success());
    // Upserts of fixed values, then reads: every run, however far an earlier one got, gives
    // the same results.
    let value = |k: u64| -> String {
        (0..VALUE_BYTES).map(|i| format!("{:02x}", (k as usize * 7 + i) as u8)).collect()
    };
    let (mut trace, mut expect) = (String::new(), vec![]);
    for k in 0..KEYS {
        writeln!(trace, "P {k} {}", value(k)).unwrap();
        expect.push("OK".to_string());
    }
    for _ in 0..30 {
        for k in 0..KEYS {
            writeln!(trace, "R {k}").unwrap();
            expect.push(value(k));
        }
    }
    let trace_path = dir.path().join("t.trace");
    std::fs::write(&trace_path, trace).unwrap();
    let out = dir.path().join("results");
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_gphash"))
            .args(["replay", s(&pool), "--trace", s(&trace_path), "--out", s(&out)])
            .args(["--batch", &BATCH.to_string(), "--executor", "cpu"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // The shorter of two whole runs, so that kills land inside runs.
    let whole = (0..2)
        .map(|_| {
            let started = std::time::Instant::now();
            assert!(run().wait().unwrap().success());
            started.elapsed()
        })
        .min()
        .unwrap();
    let (mut partial, mut empty) = (0, 0);
    for kill in 0..30 {
        let mut child = run();
        std::thread::sleep(whole.mul_f64(rng.random_range(0.0..0.9)));
        child.kill().unwrap();
        child.wait().unwrap();
        // What a kill may leave beside the output: its spare, or a new output not yet in place.
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.starts_with(".results.") {
                std::fs::remove_file(dir.path().join(name)).unwrap();
            }
        }
        let Ok(bytes) = std::fs::read(&out) else {
            continue;
        };
        let got = String::from_utf8(bytes).unwrap_or_else(|_| panic!("kill {kill}: the output is not text"));
        assert!(got.is_empty() || got.ends_with('\n'), "kill {kill}: the last line is torn");
        let lines: Vec<&str> = got.lines().collect();
        assert!(
            lines.len().is_multiple_of(BATCH) || lines.len() == expect.len(),
            "kill {kill}: {} lines",
            lines.len()
        );
        for (i, line) in lines.iter().enumerate() {
            assert!(*line == expect[i], "kill {kill}: line {} is not its result", i + 1);
        }
        match lines.len() {
            0 => empty += 1,
            n if n < expect.len() => partial += 1,
            _ => {}
        }
    }
    eprintln!("30 kills: {partial} left part of the results, {empty} none; a whole run takes {whole:?}");
    assert!(partial >= 8, "kills land in the middle of replays");
}

/// A demo killed at any moment leaves nothing in its directory: its pool never has a name.
#[test]
fn a_killed_demo_leaves_nothing() {
    let mut rng = StdRng::seed_from_u64(common::seed("a_killed_demo_leaves_nothing"));
    let dir = common::pool_dir();
    for kill in 0..12 {
        // Seconds of work (the default sizes): the kill comes first.
        let mut child = Command::new(env!("CARGO_BIN_EXE_gphash"))
            .args(["demo", "--dir", s(dir.path()), "--executor", "cpu"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1000)));
        assert!(child.try_wait().unwrap().is_none(), "kill {kill}: the demo ended before its kill");
        child.kill().unwrap();
        child.wait().unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
        assert!(left.is_empty(), "kill {kill}: the demo left {left:?}");
    }
}

/// A pool created with the defaults is sized for a few thousand keys, not a million: a
/// three-key table takes well under a MiB of (often RAM-backed) storage, and grows as keys come.
#[test]
fn a_default_pool_is_small_and_grows() {
    let dir = common::pool_dir();
    let pool = dir.path().join("small.pool");
    let out = gphash(&["create", s(&pool), "--key-bytes", "8", "--value-bytes", "8"]);
    assert!(out.status.success(), "{}", text(&out));
    let created = std::fs::metadata(&pool).unwrap().len();
    assert!(created < 1 << 20, "a default pool of {created} bytes");
    let trace_path = dir.path().join("t.trace");
    let trace: String = (0..20_000).map(|k| format!("P {k} {:016x}\n", k)).collect();
    std::fs::write(&trace_path, trace).unwrap();
    let out = gphash(&["replay", s(&pool), "--trace", s(&trace_path), "--out", s(&dir.path().join("r"))]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(std::fs::metadata(&pool).unwrap().len() > created, "the pool grew");
    assert!(text(&gphash(&["stats", s(&pool)])).contains("keys:          20000 "));
}

/// `bench sharded` at its edges: an empty table, a load in which every batch grows a shard,
/// and a batch of no operations (refused, since the load would never end).
#[test]
fn bench_sharded_runs_at_its_edges() {
    let dir = common::pool_dir();
    let bench = |extra: &[&str]| {
        let args = [&["bench", "sharded", "--shards", "2", "--pool-dir", s(dir.path())][..], extra].concat();
        gphash(&args)
    };
    let out = bench(&["--keys", "0", "--searches", "10"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("0 ops in") && text(&out).contains("no batch"), "{}", text(&out));
    let out = bench(&["--keys", "400", "--capacity", "0", "--batch", "400", "--searches", "100"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("every batch grew a shard"), "{}", text(&out));
    assert!(text(&out).contains("(values checked)"), "{}", text(&out));
    let out = bench(&["--keys", "400", "--batch", "0"]);
    assert!(!out.status.success() && text(&out).contains("must be at least 1"), "{}", text(&out));
}
