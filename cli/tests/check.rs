//! `check` (and `gphash check`) catches every kind of planted damage.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use gphash::hash::{Seeds, locate};
use gphash::testing::layout::PUBLISHED;
use gphash::{
    CacheOptions, CacheStatus, Candidate, Config, Geometry, GpHash, GpuOptions, Options, Placement, Policy,
    Status, Violation,
};
use host_pm::{Pool, Region, ResizeRecord};

struct Planted {
    pool: Pool,
    geo: Geometry,
}

impl Planted {
    fn open(path: &Path) -> Planted {
        let pool = Pool::open(path).unwrap();
        let geo = GpHash::geometry_of(&pool).unwrap();
        Planted { pool, geo }
    }

    fn table(&mut self) -> &mut [u32] {
        let r = self.pool.header().table_region;
        bytemuck::cast_slice_mut(self.pool.region_mut(r))
    }

    /// The bytes of the value cell slot `c` references (value, then checksum).
    fn cell(&mut self, c: Candidate) -> &mut [u8] {
        let cell = (*self.state(c) - PUBLISHED) as usize;
        let bytes = self.geo.cell_words() as usize * 4;
        let r = self.pool.header().heap_region;
        &mut self.pool.region_mut(r)[cell * bytes..(cell + 1) * bytes]
    }

    /// The published slot of `key`.
    fn slot_of(&mut self, key: &[u8]) -> Candidate {
        let words: Vec<u32> = bytemuck::cast_slice(key).to_vec();
        self.slots(true).into_iter().find(|&c| self.key(c) == words).expect("key published")
    }

    fn state(&mut self, c: Candidate) -> &mut u32 {
        let at = self.geo.state_word(c.bucket, c.slot) as usize;
        &mut self.table()[at]
    }

    fn slots(&self, published: bool) -> Vec<Candidate> {
        let table: &[u32] = bytemuck::cast_slice(self.pool.region(self.pool.header().table_region));
        (0..self.geo.buckets())
            .flat_map(|bucket| (0..self.geo.layout.slots).map(move |slot| Candidate { bucket, slot }))
            .filter(|c| (table[self.geo.state_word(c.bucket, c.slot) as usize] >= 2) == published)
            .collect()
    }

    fn key(&mut self, c: Candidate) -> Vec<u32> {
        let (k, kw) = (self.geo.key_word(c.bucket, c.slot) as usize, self.geo.key_words() as usize);
        self.table()[k..k + kw].to_vec()
    }

    /// Copies fingerprint, state and key of slot `from` into slot `to`.
    fn copy(&mut self, from: Candidate, to: Candidate) {
        let g = self.geo;
        let words = |c: Candidate| {
            let mut w = vec![g.fp_word(c.bucket, c.slot), g.state_word(c.bucket, c.slot)];
            w.extend((0..g.key_words() as u64).map(|i| g.key_word(c.bucket, c.slot) + i));
            w
        };
        for (f, t) in words(from).into_iter().zip(words(to)) {
            let v = self.table()[f as usize];
            self.table()[t as usize] = v;
        }
    }

    fn candidates(&mut self, c: Candidate) -> Vec<Candidate> {
        let key = self.key(c);
        let h = *self.pool.header();
        let (tops, _) = locate(
            &key,
            &Seeds::new(h.table.seed, self.geo.layout.hashes),
            self.geo.top_level,
            self.geo.location_bits(),
        );
        (0..self.geo.layout.candidates()).map(|i| self.geo.candidate(&tops, i)).collect()
    }
}

fn report(path: &Path) -> String {
    let pool = Pool::open(path).unwrap();
    let geo = GpHash::geometry_of(&pool).unwrap();
    gphash::check(&pool, &geo, pool.header()).to_string()
}

/// A cleanly closed table of 300 keys, copied to a fresh path for each fault.
fn pristine(dir: &Path) -> PathBuf {
    let path = dir.join("pristine");
    let t =
        GpHash::create(Some(&path), &Config { capacity: 500, ..Default::default() }, &common::cpu_options())
            .unwrap();
    let keys: Vec<u8> = (0..300).flat_map(|k| common::key(k, 8)).collect();
    t.insert(&keys, &keys).unwrap();
    t.close().unwrap();
    path
}

#[test]
fn every_planted_fault_is_caught() {
    let dir = common::pool_dir();
    let pristine = pristine(dir.path());
    assert!(report(&pristine).ends_with("consistent"), "{}", report(&pristine));
    type Plant = fn(&mut Planted);
    let faults: [(&str, Plant, &str); 9] = [
        (
            "key moved out of its candidates",
            |p| {
                let from = p.slots(true)[0];
                let theirs = p.candidates(from);
                let to = p
                    .slots(false)
                    .into_iter()
                    .find(|c| !theirs.iter().any(|t| t.bucket == c.bucket))
                    .unwrap();
                p.copy(from, to);
                *p.state(from) = 0;
            },
            "not in one of its candidate buckets",
        ),
        (
            "key published twice",
            |p| {
                let from = p.slots(true)[0];
                let empty = p.slots(false);
                let to = p.candidates(from).into_iter().find(|c| empty.contains(c)).unwrap();
                p.copy(from, to);
                *p.state(to) = 2 + p.geo.cells as u32 - 1;
            },
            "is also published",
        ),
        (
            "value cell beyond the heap",
            |p| {
                let c = p.slots(true)[3];
                *p.state(c) = 2 + p.geo.cells as u32 + 10;
            },
            "beyond the heap",
        ),
        (
            "value cell shared",
            |p| {
                let s = p.slots(true);
                let v = *p.state(s[1]);
                *p.state(s[2]) = v;
            },
            "also referenced by",
        ),
        (
            "claim in a cleanly closed pool",
            |p| {
                let c = p.slots(false)[5];
                *p.state(c) = 1;
            },
            "INSERTING slot in a cleanly closed pool",
        ),
        (
            "value byte flipped",
            |p| {
                let c = p.slots(true)[6];
                p.cell(c)[0] ^= 0x10;
            },
            "checksum",
        ),
        (
            "slot referencing a cell never written",
            |p| {
                let c = p.slots(true)[7];
                *p.state(c) = PUBLISHED + p.geo.cells as u32 - 1;
            },
            "checksum 0x00000000 is not its value's",
        ),
        (
            "fingerprint overwritten",
            |p| {
                let c = p.slots(true)[4];
                let at = p.geo.fp_word(c.bucket, c.slot) as usize;
                p.table()[at] ^= 0xFFFF;
            },
            "fingerprint",
        ),
        (
            "resize record to the wrong level",
            |p| {
                let mut h = *p.pool.header();
                let end = p.pool.len();
                p.pool.grow(end + (4 << 20)).unwrap();
                let r = |o: u64| Region { offset: end + o, bytes: 2 << 20 };
                h.resize = ResizeRecord {
                    state: 1,
                    new_top_level: p.geo.top_level + 3,
                    new_table: r(0),
                    new_heap: r(2 << 20),
                };
                h.clean_shutdown = false;
                h.closed = host_pm::CloseRecord::default();
                p.pool.write_header(&h).unwrap();
            },
            "resize record: grows to level",
        ),
    ];
    for (i, (name, plant, expect)) in faults.into_iter().enumerate() {
        let path = dir.path().join(format!("fault{i}"));
        std::fs::copy(&pristine, &path).unwrap();
        let mut p = Planted::open(&path);
        plant(&mut p);
        drop(p);
        let text = report(&path);
        assert!(text.contains("INCONSISTENT"), "{name}: not caught:\n{text}");
        assert!(text.contains(expect), "{name}: the report does not say {expect:?}:\n{text}");
        // The command line says so with exit status 1, and leaves the pool as it was.
        let before = common::killed::fingerprint(&path);
        let out = Command::new(env!("CARGO_BIN_EXE_gphash")).arg("check").arg(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}");
        assert!(common::killed::fingerprint(&path) == before, "{name}: check changed the pool");
    }
}

/// The table of `pristine` with one byte of key 42's value flipped in the pool file: `check`
/// names the slot and the cell, a verified read reports the key corrupt instead of handing out
/// the damaged value (on the GPU, zero-copy from the pool and from the bucket cache, staged,
/// and on the CPU model), and an unverified read is as before: it returns the damaged value.
#[test]
fn a_flipped_value_byte_is_caught_by_check_and_verified_reads() {
    let dir = common::pool_dir();
    let path = dir.path().join("flipped");
    std::fs::copy(pristine(dir.path()), &path).unwrap();
    let (damaged, healthy) = (common::key(42, 8), common::key(7, 8));
    let mut p = Planted::open(&path);
    let at = p.slot_of(&damaged);
    let cell = *p.state(at) - PUBLISHED;
    p.cell(at)[3] ^= 0x01;
    let mut flipped = damaged.clone();
    flipped[3] ^= 0x01;
    drop(p);

    let pool = Pool::open(&path).unwrap();
    let geo = GpHash::geometry_of(&pool).unwrap();
    let report = gphash::check(&pool, &geo, pool.header());
    assert_eq!(report.violations.len(), 1, "{report}");
    let Violation { at: named, what } = &report.violations[0];
    assert_eq!(*named, Some(at), "{report}");
    assert!(what.starts_with(&format!("value cell {cell}: checksum")), "{report}");
    assert!(
        report
            .to_string()
            .contains(&format!("VIOLATION bucket {} slot {}: value cell {cell}", at.bucket, at.slot)),
        "{report}"
    );
    drop(pool);

    let both: Vec<u8> = [damaged.clone(), healthy.clone()].concat();
    let cached = GpuOptions {
        placement: Placement::ZeroCopy,
        cache: CacheOptions { ratio: Some(1.0), policy: Policy::Random, ..CacheOptions::default() },
        ..GpuOptions::default()
    };
    let staged = GpuOptions { placement: Placement::Staged, ..GpuOptions::default() };
    let executors = [
        ("GPU zero-copy", common::gpu_options(GpuOptions::default()), false),
        ("GPU from the cache", common::gpu_options(cached), true),
        ("GPU staged", common::gpu_options(staged), false),
        ("CPU model", common::cpu_options(), false),
    ];
    for (name, options, load_cache) in executors {
        let t = GpHash::open(&path, &Options { verify_values: true, ..options.clone() }).unwrap();
        if load_cache {
            t.load_cache().unwrap();
        }
        let r = t.get(&both).unwrap();
        assert_eq!(r.statuses, vec![Status::Corrupt, Status::Ok], "{name}: verified");
        assert_eq!(r.value(0), None, "{name}: a damaged value is not handed out");
        assert_eq!(r.value(1), Some(&healthy[..]), "{name}: verified");
        if load_cache {
            match t.stats().cache {
                CacheStatus::On(s) => {
                    assert_eq!(s.value_reads_saved, 2, "{name}: values read from the cache")
                }
                off => panic!("{name}: {off}"),
            }
        }
        // An ordered call that reads, then changes the damaged key cannot compute its results
        // from the damaged value: it is refused whole, and the index stays usable.
        let mut call = t.batch();
        call.get(&damaged).unwrap();
        call.upsert(&damaged, &healthy).unwrap();
        call.upsert(&healthy, &damaged).unwrap();
        match t.execute_ordered(&call) {
            Err(gphash::Error::CorruptValues { keys: 1 }) => {}
            other => panic!("{name}: {other:?}"),
        }
        let r = t.get(&both).unwrap();
        assert_eq!(r.statuses, vec![Status::Corrupt, Status::Ok], "{name}: nothing applied, not poisoned");
        assert_eq!(r.value(1), Some(&healthy[..]), "{name}: the healthy key is unchanged");
        // An ordered call that only reads the damaged key (twice) while it changes another key
        // runs: the reads say Corrupt, the change applies.
        let mut call = t.batch();
        call.get(&damaged).unwrap();
        call.upsert(&healthy, &flipped).unwrap();
        call.get(&damaged).unwrap();
        call.get(&healthy).unwrap();
        let r = t.execute_ordered(&call).unwrap();
        let want = vec![Status::Corrupt, Status::Ok, Status::Corrupt, Status::Ok];
        assert_eq!(r.statuses, want, "{name}: reads of a damaged key beside a change");
        assert_eq!(r.value(3), Some(&flipped[..]), "{name}: the change is seen in batch order");
        let mut back = t.batch();
        back.upsert(&healthy, &healthy).unwrap();
        assert_eq!(t.execute(&back).unwrap().statuses, vec![Status::Ok]);
        drop(t);
        let t = GpHash::open(&path, &options).unwrap();
        let r = t.get(&both).unwrap();
        assert_eq!(r.statuses, vec![Status::Ok, Status::Ok], "{name}: unverified");
        assert_eq!(r.value(0), Some(&flipped[..]), "{name}: an unverified read is unchanged");
        drop(t);
    }

    // The command line: `check` fails, a verified replay reads CORRUPT, an unverified one the
    // damaged value.
    let gphash = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_gphash")).args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let pool = path.to_str().unwrap();
    let (code, text) = gphash(&["check", pool]);
    assert_eq!(code, Some(1));
    assert!(
        text.contains(&format!("bucket {} slot {}: value cell {cell}: checksum", at.bucket, at.slot)),
        "{text}"
    );
    let trace = dir.path().join("trace");
    std::fs::write(&trace, "R 42\nR 7\n").unwrap();
    let out = dir.path().join("out");
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    for (flag, first) in [(Some("--verify-values"), "CORRUPT".to_string()), (None, hex(&flipped))] {
        let _ = std::fs::remove_file(&out);
        let mut args =
            vec!["replay", pool, "--trace", trace.to_str().unwrap(), "--out", out.to_str().unwrap()];
        args.extend(flag);
        assert_eq!(gphash(&args).0, Some(0), "{flag:?}");
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            format!("{first}\n{}\n", hex(&healthy)),
            "{flag:?}"
        );
    }

    // An ordered call that upserts the damaged key first needs none of its old value (every
    // result follows from the upsert): it runs, and the new value replaces the damaged one.
    let t =
        GpHash::open(&path, &Options { verify_values: true, ..common::gpu_options(GpuOptions::default()) })
            .unwrap();
    let mut call = t.batch();
    call.upsert(&damaged, &flipped).unwrap();
    call.get(&damaged).unwrap();
    call.upsert(&damaged, &healthy).unwrap();
    let r = t.execute_ordered(&call).unwrap();
    assert_eq!(r.statuses, vec![Status::Ok; 3]);
    assert_eq!(r.value(1), Some(&flipped[..]), "the read sees the first upsert");
    let r = t.get(&both).unwrap();
    assert_eq!(r.statuses, vec![Status::Ok, Status::Ok], "repaired");
    assert_eq!(r.value(0), Some(&healthy[..]));
    assert!(t.check().ok(), "{}", t.check());
}
