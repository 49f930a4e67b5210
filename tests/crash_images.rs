//! The power-failure model. A run of batches (growing the table several times) is recorded at
//! every persist point. A crash image is the durable state at one persist point plus any
//! subset of the 8-byte words written before the next one (the rest lost). Every image must
//! recover to: all acknowledged batches applied, and each operation of the batch in flight
//! either whole or absent; `check` finds nothing wrong.
//!
//! `GPHASH_CRASH_IMAGES` sets how many images to test (default 2000); `GPHASH_TEST_SEED`
//! replays a run.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::oracle::Oracle;
use gphash::{Config, GpHash, GpuOptions, Options};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

/// Keys and values of a table.
type Content = HashMap<Vec<u8>, Vec<u8>>;

/// The words written between two persist points, as (word index, new value).
struct Interval {
    len: usize,
    words: Vec<(usize, u64)>,
}

#[derive(Default)]
struct Recording {
    last: Vec<u8>,
    base: Option<Vec<u8>>,
    intervals: Vec<Interval>,
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    })
}

impl Recording {
    fn observe(&mut self, now: &[u8]) {
        let Some(_) = &self.base else {
            self.base = Some(now.to_vec());
            self.last = now.to_vec();
            return;
        };
        self.last.resize(now.len(), 0);
        let changed = words(&self.last)
            .zip(words(now))
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, (_, b))| (i, b));
        self.intervals.push(Interval { len: now.len(), words: changed.collect() });
        self.last.copy_from_slice(now);
    }
}

fn apply(image: &mut Vec<u8>, len: usize, words: impl Iterator<Item = (usize, u64)>) {
    image.resize(len, 0);
    for (i, w) in words {
        let at = i * 8;
        let end = (at + 8).min(len);
        image[at..end].copy_from_slice(&w.to_le_bytes()[..end - at]);
    }
}

#[test]
fn crash_images_recover_to_acknowledged_states() {
    let seed = common::seed("crash_images_recover_to_acknowledged_states");
    let mut rng = StdRng::seed_from_u64(seed);
    let wanted: usize =
        std::env::var("GPHASH_CRASH_IMAGES").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let recording = Arc::new(Mutex::new(Recording::default()));
    let observer = {
        let r = recording.clone();
        Arc::new(move |bytes: &[u8]| r.lock().unwrap().observe(bytes))
    };
    let options = Options { observer: Some(observer), ..common::gpu_options(GpuOptions::default()) };
    let dir = common::pool_dir();
    let mut t =
        common::table(&dir, "run", &Config { capacity: 64, value_bytes: 12, ..Default::default() }, &options);

    // The run: batches of distinct keys, so each operation of a batch stands alone.
    let mut states: Vec<Content> = vec![HashMap::new()];
    let mut batches = vec![];
    let mut acked_after = vec![];
    let mut oracle = Oracle::default();
    for _ in 0..40 {
        let mut batch = t.batch();
        for k in sample(&mut rng, 6000, 150) {
            let key = common::key(k as u64, 8);
            let v = common::value(&mut rng, 12);
            match rng.random_range(0..10) {
                0..5 => batch.insert(&key, &v).unwrap(),
                5..7 => batch.upsert(&key, &v).unwrap(),
                7 => batch.update(&key, &v).unwrap(),
                8 => batch.delete(&key).unwrap(),
                _ => batch.get(&key).unwrap(),
            }
        }
        t.execute(&batch).unwrap();
        oracle.run(&batch);
        states.push(oracle.map.clone());
        batches.push(batch);
        acked_after.push(recording.lock().unwrap().intervals.len());
    }
    assert!(t.stats().activity.resizes >= 3, "the run must cross resizes");
    drop(t);

    let recording = recording.lock().unwrap();
    let written: Vec<usize> =
        (0..recording.intervals.len()).filter(|&k| !recording.intervals[k].words.is_empty()).collect();
    let per_interval = wanted.div_ceil(written.len());
    let mut image = recording.base.clone().unwrap();
    let mut tested = 0;
    let path = dir.path().join("image");
    for (k, interval) in recording.intervals.iter().enumerate() {
        // Batches acknowledged before this interval's persist point.
        let acked = acked_after.iter().filter(|&&a| a <= k).count();
        if !interval.words.is_empty() {
            for j in 0..per_interval {
                // None, all, then some of the words written reach the medium.
                let keep: f64 = [0.0, 1.0, 0.5, 0.1, 0.9].get(j).copied().unwrap_or_else(|| rng.random());
                let mut crashed = image.clone();
                let kept = interval.words.iter().copied().filter(|_| rng.random_bool(keep));
                apply(&mut crashed, interval.len, kept);
                std::fs::write(&path, &crashed).unwrap();
                let what = format!("seed {seed}, persist interval {k}, image {j} (kept {keep:.2})");
                verify(&path, &states[acked], batches.get(acked).map(|b| (b, &states[acked + 1])), &what);
                tested += 1;
            }
        }
        apply(&mut image, interval.len, interval.words.iter().copied());
    }
    eprintln!("{tested} crash images over {} persist intervals, all recovered", written.len());
    assert!(tested >= wanted);
}

/// The image at `path` recovers to `acked`, with each operation of `in_flight` (whose complete
/// application gives `after`) whole or absent.
fn verify(
    path: &std::path::Path,
    acked: &Content,
    in_flight: Option<(&gphash::Batch, &Content)>,
    what: &str,
) {
    let t = GpHash::open(path, &common::cpu_options()).unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
    let report = t.check();
    assert!(report.ok(), "{what}: {report}");
    let got: Content = t.entries().into_iter().collect();
    let touched: Vec<&[u8]> =
        in_flight.map(|(b, _)| (0..b.len()).map(|i| b.op(i).1).collect()).unwrap_or_default();
    for key in acked.keys().chain(got.keys()).chain(in_flight.map(|(_, a)| a.keys()).into_iter().flatten()) {
        let (now, before) = (got.get(key), acked.get(key));
        if touched.contains(&&key[..]) {
            let after = in_flight.unwrap().1.get(key);
            assert!(
                now == before || now == after,
                "{what}: key {key:x?} is {now:x?}, neither {before:x?} nor {after:x?}"
            );
        } else {
            assert_eq!(now, before, "{what}: key {key:x?} of an acknowledged batch");
        }
    }
}
