//! The reference the tests compare against: a map, operations applied one by one.

use std::collections::HashMap;

use gphash::{Batch, OpKind, Status};

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
