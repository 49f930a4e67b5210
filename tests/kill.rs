//! Kill tests: a child process (this test binary, re-executed) runs random batches on a table
//! that keeps growing and reports each acknowledged batch; the parent kills it with SIGKILL at a
//! random moment, inspects the pool read-only (which must predict what recovery does), reopens
//! it, checks it, and verifies that every acknowledged operation holds and each operation of the
//! batch in flight is whole or absent.
//!
//! `GPHASH_KILLS` sets the number of kills (default 200); `GPHASH_TEST_SEED` replays a run.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::oracle::Oracle;
use gphash::{Batch, CacheOptions, Config, GpHash, GpuOptions};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "GPHASH_KILL_CHILD";
const FROM_ENV: &str = "GPHASH_KILL_FROM";
const EXECUTOR_ENV: &str = "GPHASH_KILL_EXECUTOR";

/// Batch `i` of the run: distinct keys (each operation stands alone), mostly insertions so
/// the table keeps growing.
fn batch(seed: u64, i: u64) -> Batch {
    let mut rng = StdRng::seed_from_u64(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut b = Batch::new(8, 8);
    for k in sample(&mut rng, 30_000, 120) {
        let key = common::key(k as u64, 8);
        let v: [u8; 8] = rng.random();
        match rng.random_range(0..20) {
            0..10 => b.insert(&key, &v).unwrap(),
            10..14 => b.upsert(&key, &v).unwrap(),
            14..16 => b.update(&key, &v).unwrap(),
            16..19 => b.delete(&key).unwrap(),
            _ => b.get(&key).unwrap(),
        }
    }
    b
}

/// The child: opens the pool, says so, then runs batches from `from` on, reporting each.
fn child(pool: &str, seed: u64) {
    let from: u64 = std::env::var(FROM_ENV).unwrap().parse().unwrap();
    let options = match std::env::var(EXECUTOR_ENV).as_deref() {
        // The bucket cache loads every few batches: a kill may land in a loading slice.
        Ok("gpu") => common::gpu_options(GpuOptions {
            cache: CacheOptions { ratio: Some(0.3), period: 500, ..CacheOptions::default() },
            ..GpuOptions::default()
        }),
        _ => common::cpu_options(),
    };
    let t = GpHash::open(pool.as_ref(), &options).unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    for i in from..from + 100_000 {
        t.execute(&batch(seed, i)).unwrap();
        writeln!(out, "ack {i}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn kills_at_random_moments_lose_nothing_acknowledged() {
    if let Ok(seed) = std::env::var("GPHASH_TEST_SEED")
        && let Ok(pool) = std::env::var(CHILD_ENV)
    {
        return child(&pool, seed.parse().unwrap());
    }
    let seed = common::seed("kills_at_random_moments_lose_nothing_acknowledged");
    let kills: usize = std::env::var("GPHASH_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let mut rng = StdRng::seed_from_u64(seed);
    let gpu = common::gpu().is_some();
    let dir = common::pool_dir();
    let path = dir.path().join("killed.pool");
    let (mut state, mut next) = (HashMap::new(), 0u64);
    let (mut acked_total, mut resizes) = (0, 0);
    for kill in 0..kills {
        // A fresh small table now and then, so that kills keep landing in resizes.
        if kill % 10 == 0 {
            let _ = std::fs::remove_file(&path);
            GpHash::create(
                Some(&path),
                &Config { capacity: 64, ..Default::default() },
                &common::cpu_options(),
            )
            .unwrap()
            .close()
            .unwrap();
            state = HashMap::new();
        }
        let executor = if gpu && kill % 2 == 0 { "gpu" } else { "cpu" };
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "kills_at_random_moments_lose_nothing_acknowledged",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &path)
            .env("GPHASH_TEST_SEED", seed.to_string())
            .env(FROM_ENV, next.to_string())
            .env(EXECUTOR_ENV, executor)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        // Mostly a moment into the batches; sometimes during open (recovery, a resumed resize).
        if rng.random_bool(0.85) {
            // (libtest's "test ... " may precede it on the same line.)
            let ready = rx.iter().find(|l| l.ends_with("ready"));
            assert!(ready.is_some(), "kill {kill}: the child died before it was ready");
        }
        std::thread::sleep(Duration::from_micros(rng.random_range(0..60_000)));
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        let acks: Vec<u64> =
            rx.try_iter().filter_map(|l| l.strip_prefix("ack ").map(|n| n.parse().unwrap())).collect();
        assert_eq!(
            acks,
            (next..next + acks.len() as u64).collect::<Vec<_>>(),
            "kill {kill}: acks out of order"
        );
        let mut oracle = Oracle { map: state };
        for &i in &acks {
            oracle.run(&batch(seed, i));
        }
        let in_flight = next + acks.len() as u64;
        acked_total += acks.len();

        let what = format!("seed {seed}, kill {kill} ({executor}), batch {in_flight} in flight");
        // Inspected first: read-only, it predicts what opening does.
        let (_, t) = common::killed::inspect_and_open(&path, &what);
        let report = t.check();
        assert!(report.ok(), "{what}: {report}");
        resizes += t.stats().recovery.resumed_resize.is_some() as usize;
        let got: HashMap<Vec<u8>, Vec<u8>> = t.entries().into_iter().collect();
        let flight = batch(seed, in_flight);
        let mut after = oracle.clone();
        after.run(&flight);
        let touched: Vec<&[u8]> = (0..flight.len()).map(|i| flight.op(i).1).collect();
        for key in oracle.map.keys().chain(got.keys()) {
            let (now, before) = (got.get(key), oracle.map.get(key));
            if touched.contains(&&key[..]) {
                let later = after.map.get(key);
                assert!(
                    now == before || now == later,
                    "{what}: key {key:x?} is {now:x?}, not {before:x?} or {later:x?}"
                );
            } else {
                assert_eq!(now, before, "{what}: key {key:x?} of an acknowledged batch");
            }
        }
        t.close().unwrap();
        // What the batch in flight left is the truth from here on; the next child skips it.
        state = got;
        next = in_flight + 1;
    }
    eprintln!(
        "{kills} kills, {acked_total} acknowledged batches verified, {resizes} interrupted resizes resumed"
    );
}
