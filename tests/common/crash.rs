//! The power-failure model the crash-image tests share. A run of batches is recorded at every
//! persist point; a crash image is the durable pool at one persist point plus any subset of
//! the 8-byte words written before the next one (the rest lost). Every image must recover to
//! all acknowledged batches applied and each key of the batches in flight as before them or as
//! after one of them.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use gphash::Batch;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;

/// Keys and values of a table.
pub type Content = HashMap<Vec<u8>, Vec<u8>>;

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

/// A recorded run: the pool at every persist point and the batches acknowledged in between.
pub struct CrashRun {
    recording: Arc<Mutex<Recording>>,
    /// `states[i]`: the content after `i` acknowledged batches.
    states: Vec<Content>,
    batches: Vec<Batch>,
    /// Persist intervals recorded when each batch was acknowledged.
    acked_after: Vec<usize>,
    /// Batches that may be in flight after the acknowledged ones.
    depth: usize,
}

impl Default for CrashRun {
    fn default() -> Self {
        CrashRun {
            recording: Arc::default(),
            states: vec![HashMap::new()],
            batches: vec![],
            acked_after: vec![],
            depth: 1,
        }
    }
}

impl CrashRun {
    /// A run in which up to `depth` batches after the acknowledged ones may be in flight.
    pub fn with_depth(depth: usize) -> Self {
        CrashRun { depth, ..CrashRun::default() }
    }

    /// The pool observer that records the run.
    pub fn observer(&self) -> host_pm::Observer {
        let r = self.recording.clone();
        Arc::new(move |bytes: &[u8]| r.lock().unwrap().observe(bytes))
    }

    /// `batch` was acknowledged, leaving the table holding `content`.
    pub fn acknowledged(&mut self, batch: Batch, content: &Content) {
        self.states.push(content.clone());
        self.batches.push(batch);
        self.acked_after.push(self.recording.lock().unwrap().intervals.len());
    }

    /// Persist intervals that wrote something.
    pub fn written(&self) -> usize {
        self.recording.lock().unwrap().intervals.iter().filter(|i| !i.words.is_empty()).count()
    }

    /// Whether the pool grew during the run.
    pub fn grew(&self) -> bool {
        let r = self.recording.lock().unwrap();
        let base = r.base.as_ref().map_or(0, Vec::len);
        r.intervals.iter().any(|i| i.len != base)
    }

    /// Writes at least `wanted` crash images to `path`, spread over the intervals that wrote
    /// something (none, all, then random parts of each one's words reach the medium; in every
    /// other image that has pages no region holds, some of them zeroed as holes punched late
    /// leave them), and calls `verify(path, acknowledged content, the batches in flight each
    /// with the content after it, what)` on each.
    pub fn check_images(
        &self,
        wanted: usize,
        rng: &mut StdRng,
        seed: u64,
        path: &Path,
        mut verify: impl FnMut(&Path, &Content, &[(&Batch, &Content)], &str),
    ) {
        let (written, grew) = (self.written(), self.grew());
        let recording = self.recording.lock().unwrap();
        let per_interval = wanted.div_ceil(written);
        let mut image = recording.base.clone().unwrap();
        let (mut tested, mut with_unnamed, mut with_zeroed) = (0, 0, 0);
        for (k, interval) in recording.intervals.iter().enumerate() {
            // Batches acknowledged before this interval's persist point.
            let acked = self.acked_after.iter().filter(|&&a| a <= k).count();
            if !interval.words.is_empty() {
                for j in 0..per_interval {
                    // None, all, then some of the words written reach the medium.
                    let keep: f64 = [0.0, 1.0, 0.5, 0.1, 0.9].get(j).copied().unwrap_or_else(|| rng.random());
                    let mut crashed = image.clone();
                    let kept = interval.words.iter().copied().filter(|_| rng.random_bool(keep));
                    apply(&mut crashed, interval.len, kept);
                    std::fs::write(path, &crashed).unwrap();
                    // Alternating, not a coin: a run may leave unnamed pages in only a few images.
                    let unnamed = unnamed_pages(path, crashed.len());
                    let zeroed =
                        if with_unnamed % 2 == 0 { zero_some(path, &mut crashed, &unnamed, rng) } else { 0 };
                    with_unnamed += usize::from(!unnamed.is_empty());
                    let what = format!(
                        "seed {seed}, persist interval {k}, image {j} (kept {keep:.2}, {zeroed} unnamed pages zeroed)"
                    );
                    let flying = acked..(acked + self.depth).min(self.batches.len());
                    let in_flight: Vec<_> = flying.map(|i| (&self.batches[i], &self.states[i + 1])).collect();
                    verify(path, &self.states[acked], &in_flight, &what);
                    tested += 1;
                    with_zeroed += usize::from(zeroed > 0);
                }
            }
            apply(&mut image, interval.len, interval.words.iter().copied());
        }
        eprintln!(
            "{tested} crash images over {written} persist intervals ({with_zeroed} with unnamed pages zeroed), all recovered"
        );
        assert!(tested >= wanted);
        // A pool that grew left regions behind, or room not yet named.
        assert!(with_zeroed > 0 || !grew, "the run grew its pool, yet left no page unnamed");
    }
}

const PAGE: u64 = 4096;

/// The pages of the pool image at `path`, `len` bytes long, that its header names no region in.
fn unnamed_pages(path: &Path, len: usize) -> Vec<u64> {
    let h = *host_pm::Pool::open_private(path).expect("a crash image opens").header();
    let named = [h.table_region, h.heap_region, h.closed.saved, h.resize.new_table, h.resize.new_heap];
    let unnamed = |&page: &u64| {
        let page = host_pm::Region { offset: page, bytes: PAGE };
        named.iter().filter(|r| !r.is_empty()).all(|r| !r.overlaps(&page))
    };
    (host_pm::HEADER_AREA..len as u64 / PAGE * PAGE).step_by(PAGE as usize).filter(unnamed).collect()
}

/// Zeroes a random part, at least one, of the `unnamed` pages of `image` and writes it to
/// `path`; returns how many. Holes punched in the background (`Pool::discard_in_background`)
/// leave a crash image with any mix of the given-back regions' pages as they were and as zeros;
/// this is a superset of that, since recovery reads only what the header names.
fn zero_some(path: &Path, image: &mut [u8], unnamed: &[u64], rng: &mut StdRng) -> usize {
    let Some(&always) = unnamed.choose(rng) else { return 0 };
    let mut zeroed = 0;
    for &page in unnamed {
        if page == always || rng.random_bool(0.5) {
            image[page as usize..(page + PAGE) as usize].fill(0);
            zeroed += 1;
        }
    }
    std::fs::write(path, &*image).unwrap();
    zeroed
}

/// The content `got` recovered from an image is `acked` but for the keys of the batches
/// `in_flight` (each with the content its complete application gives), each as before them or
/// as after one of them.
pub fn assert_whole_or_absent(got: &Content, acked: &Content, in_flight: &[(&Batch, &Content)], what: &str) {
    let touched: Vec<&[u8]> = in_flight.iter().flat_map(|(b, _)| (0..b.len()).map(|i| b.op(i).1)).collect();
    let afters = in_flight.iter().flat_map(|(_, after)| after.keys());
    for key in acked.keys().chain(got.keys()).chain(afters) {
        let (now, before) = (got.get(key), acked.get(key));
        if touched.contains(&&key[..]) {
            let states: Vec<_> = in_flight.iter().map(|(_, after)| after.get(key)).collect();
            assert!(
                now == before || states.contains(&now),
                "{what}: key {key:x?} is {now:x?}, neither {before:x?} nor one of {states:x?}"
            );
        } else {
            assert_eq!(now, before, "{what}: key {key:x?} of an acknowledged batch");
        }
    }
}
