//! Batches of operations on host slices, their results, and the split of a batch into rounds
//! of distinct keys for ordered execution.

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};
use crate::protocol::{OpKind, Status};

/// A batch of operations with fixed-width keys and values, stored column-wise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    key_bytes: usize,
    value_bytes: usize,
    kinds: Vec<OpKind>,
    keys: Vec<u8>,
    values: Vec<u8>,
}

impl Batch {
    /// An empty batch for keys of `key_bytes` and values of `value_bytes`.
    pub fn new(key_bytes: usize, value_bytes: usize) -> Self {
        Batch { key_bytes, value_bytes, kinds: vec![], keys: vec![], values: vec![] }
    }

    /// Appends one operation; `value` is required exactly for insert, upsert and update.
    pub fn push(&mut self, kind: OpKind, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        if key.len() != self.key_bytes {
            return Err(Error::KeyWidth { found: key.len(), expected: self.key_bytes });
        }
        match (kind.writes_value(), value) {
            (true, Some(v)) if v.len() == self.value_bytes => self.values.extend_from_slice(v),
            (true, Some(v)) => {
                return Err(Error::ValueSize { found: v.len(), expected: self.value_bytes });
            }
            (true, None) => {
                return Err(Error::ValueSize { found: 0, expected: self.value_bytes });
            }
            (false, None) => self.values.resize(self.values.len() + self.value_bytes, 0),
            (false, Some(_)) => {
                return Err(Error::InvalidConfig(format!("{kind:?} takes no value")));
            }
        }
        self.kinds.push(kind);
        self.keys.extend_from_slice(key);
        Ok(())
    }

    /// Appends a read.
    pub fn get(&mut self, key: &[u8]) -> Result<()> {
        self.push(OpKind::Get, key, None)
    }

    /// Appends an insert-if-absent.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.push(OpKind::Insert, key, Some(value))
    }

    /// Appends an insert-or-overwrite.
    pub fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.push(OpKind::Upsert, key, Some(value))
    }

    /// Appends an overwrite of a present key.
    pub fn update(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.push(OpKind::Update, key, Some(value))
    }

    /// Appends a removal.
    pub fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.push(OpKind::Delete, key, None)
    }

    /// Builds a batch of one kind from concatenated keys (and values).
    pub fn of_kind(
        kind: OpKind,
        key_bytes: usize,
        value_bytes: usize,
        keys: &[u8],
        values: Option<&[u8]>,
    ) -> Result<Self> {
        if key_bytes == 0 || !keys.len().is_multiple_of(key_bytes) {
            return Err(Error::KeyWidth { found: keys.len() % key_bytes.max(1), expected: key_bytes });
        }
        let n = keys.len() / key_bytes;
        let values = match (kind.writes_value(), values) {
            (true, Some(v)) if v.len() == n * value_bytes => v.to_vec(),
            (true, Some(v)) => {
                return Err(Error::ValueSize { found: v.len() / n.max(1), expected: value_bytes });
            }
            (true, None) => {
                return Err(Error::ValueSize { found: 0, expected: value_bytes });
            }
            (false, None) => vec![0; n * value_bytes],
            (false, Some(_)) => {
                return Err(Error::InvalidConfig(format!("{kind:?} takes no value")));
            }
        };
        Ok(Batch { key_bytes, value_bytes, kinds: vec![kind; n], keys: keys.to_vec(), values })
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Operation `i`: kind, key, value (zeros for operations without one).
    pub fn op(&self, i: usize) -> (OpKind, &[u8], &[u8]) {
        (
            self.kinds[i],
            &self.keys[i * self.key_bytes..(i + 1) * self.key_bytes],
            &self.values[i * self.value_bytes..(i + 1) * self.value_bytes],
        )
    }

    /// Key width in bytes.
    pub fn key_bytes(&self) -> usize {
        self.key_bytes
    }

    /// Value size in bytes.
    pub fn value_bytes(&self) -> usize {
        self.value_bytes
    }

    /// The batch in kernel form, into `e` (whose allocations are reused); `ops` selects (and
    /// orders) the operations.
    pub fn encode(&self, ops: &[usize], e: &mut Encoded) {
        let words = |bytes: &[u8], out: &mut Vec<u32>| {
            out.extend(bytes.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())));
        };
        let padded = self.value_bytes.div_ceil(4) * 4;
        e.kinds.clear();
        e.keys.clear();
        e.values.clear();
        let whole = is_whole(ops, self.len());
        let carries_values = ops.iter().any(|&i| self.kinds[i].writes_value());
        if whole && (padded == self.value_bytes || !carries_values) {
            e.kinds.extend(self.kinds.iter().map(|&k| k as u32));
            words(&self.keys, &mut e.keys);
            if carries_values {
                words(&self.values, &mut e.values);
            }
            return;
        }
        let mut word_aligned = vec![0u8; padded];
        for &i in ops {
            let (kind, key, value) = self.op(i);
            e.kinds.push(kind as u32);
            words(key, &mut e.keys);
            if carries_values {
                word_aligned[..self.value_bytes].copy_from_slice(value);
                words(&word_aligned, &mut e.values);
            }
        }
    }

    /// Splits the batch into rounds in which every key appears at most once: round `r` holds
    /// the `r`-th operation on each key. Running the rounds in order gives the results of
    /// applying the operations one by one, since operations on different keys commute.
    pub fn rounds(&self) -> Vec<Vec<usize>> {
        let mut seen: FxHashMap<&[u8], usize> = FxHashMap::default();
        seen.reserve(self.len());
        let mut rounds: Vec<Vec<usize>> = vec![];
        for i in 0..self.len() {
            let r = seen.entry(self.op(i).1).or_default();
            if *r == rounds.len() {
                rounds.push(vec![]);
            }
            rounds[*r].push(i);
            *r += 1;
        }
        rounds
    }
}

/// Whether `ops` is `0..n` in order.
fn is_whole(ops: &[usize], n: usize) -> bool {
    ops.len() == n && ops.iter().enumerate().all(|(j, &i)| i == j)
}

/// A batch in kernel form: operation codes, key words, value words (cell-padded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    /// One [`OpKind`] code per operation.
    pub kinds: Vec<u32>,
    /// `key_words` words per operation.
    pub keys: Vec<u32>,
    /// `cell_words` words per operation (zero for operations without a value); empty when no
    /// operation carries a value.
    pub values: Vec<u32>,
}

impl Encoded {
    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Whether the batch has no operations.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Whether every operation is a read: no phase B, nothing to persist.
    pub fn read_only(&self) -> bool {
        self.kinds.iter().all(|&k| k == OpKind::Get as u32)
    }

    /// Whether some operation is a read (whose value must be read back).
    pub fn has_reads(&self) -> bool {
        self.kinds.contains(&(OpKind::Get as u32))
    }
}

/// Results of a batch: a status per operation and the values of successful reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchResult {
    /// One status per operation, in batch order.
    pub statuses: Vec<Status>,
    values: Vec<u8>,
    value_bytes: usize,
    reads: Vec<bool>,
}

impl BatchResult {
    pub(crate) fn new(n: usize, value_bytes: usize) -> Self {
        BatchResult {
            statuses: vec![Status::NotFound; n],
            values: vec![0; n * value_bytes],
            value_bytes,
            reads: vec![false; n],
        }
    }

    /// Stores the results of the operations `ops` (in that order) from kernel output; `values`
    /// holds `value_words` words per operation, or nothing when no operation reads.
    pub(crate) fn scatter(&mut self, batch: &Batch, ops: &[usize], statuses: &[u32], values: &[u32]) {
        let vb = self.value_bytes;
        let padded = vb.div_ceil(4) * 4;
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let bulk = !values.is_empty() && padded == vb && is_whole(ops, self.len());
        if bulk {
            // Values of operations that are not successful reads are never handed out.
            self.values.copy_from_slice(bytes);
        }
        for (j, &i) in ops.iter().enumerate() {
            let status = Status::from_code(statuses[j]).expect("kernels write valid statuses");
            self.statuses[i] = status;
            self.reads[i] = status == Status::Ok && batch.kinds[i] == OpKind::Get;
            if self.reads[i] && !bulk {
                self.values[i * vb..(i + 1) * vb].copy_from_slice(&bytes[j * padded..j * padded + vb]);
            }
        }
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.statuses.len()
    }

    /// Whether the batch was empty.
    pub fn is_empty(&self) -> bool {
        self.statuses.is_empty()
    }

    /// The value read by operation `i`, if it is a get that found its key.
    pub fn value(&self, i: usize) -> Option<&[u8]> {
        self.reads[i].then(|| &self.values[i * self.value_bytes..(i + 1) * self.value_bytes])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_are_checked() {
        let mut b = Batch::new(8, 4);
        assert!(matches!(b.get(&[0; 7]), Err(Error::KeyWidth { found: 7, expected: 8 })));
        assert!(matches!(b.insert(&[0; 8], &[0; 5]), Err(Error::ValueSize { .. })));
        assert!(b.push(OpKind::Insert, &[0; 8], None).is_err());
        assert!(b.push(OpKind::Delete, &[0; 8], Some(&[0; 4])).is_err());
        assert!(b.is_empty(), "a refused operation is not appended");
        assert!(Batch::of_kind(OpKind::Get, 8, 4, &[0; 12], None).is_err());
    }

    #[test]
    fn rounds_hold_distinct_keys_in_order() {
        let mut b = Batch::new(4, 4);
        for k in [1u32, 2, 1, 1, 3, 2] {
            b.upsert(&k.to_le_bytes(), &[0; 4]).unwrap();
        }
        assert_eq!(b.rounds(), vec![vec![0, 1, 4], vec![2, 5], vec![3]]);
    }

    #[test]
    fn encoding_pads_values_to_whole_words() {
        let mut b = Batch::new(4, 3);
        b.insert(&7u32.to_le_bytes(), &[1, 2, 3]).unwrap();
        b.get(&9u32.to_le_bytes()).unwrap();
        let mut e = Encoded::default();
        b.encode(&[0, 1], &mut e);
        assert_eq!(e.kinds, vec![OpKind::Insert as u32, OpKind::Get as u32]);
        assert_eq!(e.keys, vec![7, 9]);
        assert_eq!(e.values, vec![0x0003_0201, 0]);
        b.encode(&[1], &mut e);
        assert_eq!(e.keys, vec![9]);
        assert!(e.values.is_empty(), "reads carry no values");
    }
}
