//! The reference the tests compare against: a map, operations applied one by one.

use std::collections::{HashMap, HashSet};

use gphash::{Batch, BatchResult, OpKind, Status};

/// A hash map with gphash's operation semantics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Oracle {
    pub map: HashMap<Vec<u8>, Vec<u8>>,
}

impl Oracle {
    /// Applies one operation; returns its status and, for a successful get, the value.
    pub fn apply(&mut self, kind: OpKind, key: &[u8], value: &[u8]) -> (Status, Option<Vec<u8>>) {
        let present = self.map.contains_key(key);
        match (kind, present) {
            (OpKind::Get, true) => (Status::Ok, self.map.get(key).cloned()),
            (OpKind::Get | OpKind::Update | OpKind::Delete, false) => (Status::NotFound, None),
            (OpKind::Insert, true) => (Status::Exists, None),
            (OpKind::Insert | OpKind::Upsert | OpKind::Update, _) => {
                self.map.insert(key.to_vec(), value.to_vec());
                (Status::Ok, None)
            }
            (OpKind::Delete, true) => {
                self.map.remove(key);
                (Status::Ok, None)
            }
        }
    }

    /// Applies a batch in order.
    pub fn run(&mut self, batch: &Batch) -> Vec<(Status, Option<Vec<u8>>)> {
        (0..batch.len())
            .map(|i| {
                let (kind, key, value) = batch.op(i);
                self.apply(kind, key, value)
            })
            .collect()
    }
}

/// Asserts a table's content equals a map.
pub fn assert_same_content(entries: Vec<(Vec<u8>, Vec<u8>)>, map: &HashMap<Vec<u8>, Vec<u8>>, what: &str) {
    let got: HashMap<Vec<u8>, Vec<u8>> = entries.iter().cloned().collect();
    assert_eq!(got.len(), entries.len(), "{what}: a key is published twice");
    if &got != map {
        let missing = map.keys().filter(|k| !got.contains_key(*k)).count();
        let extra = got.keys().filter(|k| !map.contains_key(*k)).count();
        let differ = map.iter().filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v)).count();
        panic!("{what}: content differs: {missing} missing, {extra} extra, {differ} with another value");
    }
}

/// Asserts that the results of `execute` fit its guarantee: reads see `before`, and for each
/// key the batch's other operations on it, applied one by one in some order to `before`, give
/// their statuses and leave the value `after` holds. Keys outside the batch keep their values.
pub fn assert_some_order(
    batch: &Batch,
    result: &BatchResult,
    before: &HashMap<Vec<u8>, Vec<u8>>,
    after: &HashMap<Vec<u8>, Vec<u8>>,
    what: &str,
) {
    let mut by_key: HashMap<&[u8], Vec<usize>> = HashMap::new();
    for i in 0..batch.len() {
        by_key.entry(batch.op(i).1).or_default().push(i);
    }
    for (key, ops) in &by_key {
        let pre = before.get(*key);
        let (reads, writes): (Vec<usize>, Vec<usize>) =
            ops.iter().partition(|&&i| batch.op(i).0 == OpKind::Get);
        for i in reads {
            let want = if pre.is_some() { Status::Ok } else { Status::NotFound };
            assert_eq!(
                (result.statuses[i], result.value(i)),
                (want, pre.map(|v| &v[..])),
                "{what}: get {i} of key {key:?} does not see the state before the batch"
            );
        }
        assert!(writes.len() <= 64, "{what}: the order search takes at most 64 operations a key");
        let mut dead_ends = HashSet::new();
        assert!(
            fits(batch, result, &writes, 0, pre.cloned(), after.get(*key), &mut dead_ends),
            "{what}: no order of the {} changes of key {key:?} gives their statuses {:?} and leaves {:?} \
             (before: {pre:?})",
            writes.len(),
            writes.iter().map(|&i| (batch.op(i).0, result.statuses[i])).collect::<Vec<_>>(),
            after.get(*key)
        );
    }
    for key in before.keys().chain(after.keys()).filter(|k| !by_key.contains_key(&k[..])) {
        assert_eq!(before.get(key), after.get(key), "{what}: key {key:?} changed outside the batch");
    }
}

/// Whether the operations `ops` not yet in `done` (a bit each) can follow in some order from
/// `state`, each giving its status, and end in `want`. `dead_ends` remembers the (done, state)
/// pairs that cannot, so repeated operations do not make the search factorial.
fn fits(
    batch: &Batch,
    result: &BatchResult,
    ops: &[usize],
    done: u64,
    state: Option<Vec<u8>>,
    want: Option<&Vec<u8>>,
    dead_ends: &mut HashSet<(u64, Option<Vec<u8>>)>,
) -> bool {
    if done.count_ones() as usize == ops.len() {
        return state.as_ref() == want;
    }
    if dead_ends.contains(&(done, state.clone())) {
        return false;
    }
    for (j, &i) in ops.iter().enumerate().filter(|&(j, _)| done & (1 << j) == 0) {
        let (kind, key, value) = batch.op(i);
        let mut one = Oracle::default();
        if let Some(v) = &state {
            one.map.insert(key.to_vec(), v.clone());
        }
        if one.apply(kind, key, value).0 == result.statuses[i]
            && fits(batch, result, ops, done | 1 << j, one.map.remove(key), want, dead_ends)
        {
            return true;
        }
    }
    dead_ends.insert((done, state));
    false
}
