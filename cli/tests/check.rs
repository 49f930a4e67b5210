//! `check` (and `gphash check`) catches every kind of planted damage.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use gphash::hash::{Seeds, locate};
use gphash::{Candidate, Geometry};
use gphash::{Config, GpHash};
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
        let (tops, _) = locate(&key, &Seeds::new(h.table.seed, self.geo.layout.hashes), self.geo.top_level);
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
    let mut t =
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
    let faults: [(&str, Plant, &str); 7] = [
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
        // The command line says so with exit status 1.
        let out = Command::new(env!("CARGO_BIN_EXE_gphash")).arg("check").arg(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}");
    }
}
