//! The power-failure model. A run of batches (growing the table several times) is recorded at
//! every persist point. A crash image is the durable state at one persist point plus any
//! subset of the 8-byte words written before the next one (the rest lost). Every image must
//! recover to: all acknowledged batches applied, and each operation of the batch in flight
//! either whole or absent; `check` finds nothing wrong; a read-only inspection before recovery
//! predicts what recovery does and finds the image consistent.
//!
//! `GPHASH_CRASH_IMAGES` sets how many images to test (default 2000); `GPHASH_TEST_SEED`
//! replays a run.

mod common;

use common::crash::{Content, CrashRun, assert_whole_or_absent};
use common::oracle::Oracle;
use gphash::{Config, GpuOptions, Options};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

#[test]
fn crash_images_recover_to_acknowledged_states() {
    let seed = common::seed("crash_images_recover_to_acknowledged_states");
    let mut rng = StdRng::seed_from_u64(seed);
    let wanted: usize =
        std::env::var("GPHASH_CRASH_IMAGES").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let mut run = CrashRun::default();
    let options = Options { observer: Some(run.observer()), ..common::gpu_options(GpuOptions::default()) };
    let dir = common::pool_dir();
    let t =
        common::table(&dir, "run", &Config { capacity: 64, value_bytes: 12, ..Default::default() }, &options);

    // The run: batches of distinct keys, so each operation of a batch stands alone.
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
        run.acknowledged(batch, &oracle.map);
    }
    assert!(t.stats().activity.resizes >= 3, "the run must cross resizes");
    drop(t);

    run.check_images(wanted, &mut rng, seed, &dir.path().join("image"), verify);
}

/// The image at `path` recovers to `acked`, with each operation of `in_flight` (whose complete
/// application gives `after`) whole or absent.
fn verify(
    path: &std::path::Path,
    acked: &Content,
    in_flight: Option<(&gphash::Batch, &Content)>,
    what: &str,
) {
    // Inspected first: read-only, it predicts what opening does.
    let (_, t) = common::killed::inspect_and_open(path, what);
    let report = t.check();
    assert!(report.ok(), "{what}: {report}");
    let got: Content = t.entries().into_iter().collect();
    assert_whole_or_absent(&got, acked, in_flight, what);
}
