//! Batches of operations on host slices, their results, and the fold of a key's operations
//! into one net operation for ordered execution.

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
            return Err(Error::KeysLength { given: keys.len(), key_bytes });
        }
        let n = keys.len() / key_bytes;
        let values = match (kind.writes_value(), values) {
            (true, Some(v)) if v.len() == n * value_bytes => v.to_vec(),
            (true, v) => {
                let given = v.map_or(0, <[u8]>::len);
                return Err(Error::ValuesLength { given, keys: n, value_bytes });
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

    /// The batch in kernel form, into `e` (whose allocations are reused).
    pub fn encode(&self, e: &mut Encoded) {
        self.encode_part(Part::Whole, e)
    }

    /// Operations `part` in kernel form, into `e` (whose allocations are reused).
    pub(crate) fn encode_part(&self, part: Part, e: &mut Encoded) {
        let words = |bytes: &[u8], out: &mut Vec<u32>| {
            out.extend(bytes.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())));
        };
        let padded = self.value_bytes.div_ceil(4) * 4;
        e.kinds.clear();
        e.keys.clear();
        e.values.clear();
        let n = part.len(self);
        let carries_values = (0..n).any(|j| part.get(self, j).kind.writes_value());
        if matches!(part, Part::Whole) && (padded == self.value_bytes || !carries_values) {
            e.kinds.extend(self.kinds.iter().map(|&k| k as u32));
            words(&self.keys, &mut e.keys);
            if carries_values {
                words(&self.values, &mut e.values);
            }
            return;
        }
        let mut word_aligned = vec![0u8; padded];
        for j in 0..n {
            let p = part.get(self, j);
            e.kinds.push(p.kind as u32);
            words(self.op(p.key).1, &mut e.keys);
            if carries_values {
                // Operations that write no value get zero words.
                word_aligned.fill(0);
                if p.kind.writes_value() {
                    word_aligned[..self.value_bytes].copy_from_slice(self.op(p.value).2);
                }
                words(&word_aligned, &mut e.values);
            }
        }
    }

    /// The batch's operations grouped by key, in batch order.
    pub(crate) fn key_groups(&self) -> KeyGroups {
        let mut ids: FxHashMap<&[u8], u32> = FxHashMap::default();
        ids.reserve(self.len());
        let group: Vec<u32> = (0..self.len())
            .map(|i| {
                let next = ids.len() as u32;
                *ids.entry(self.op(i).1).or_insert(next)
            })
            .collect();
        let mut count = vec![0u32; ids.len()];
        for &g in &group {
            count[g as usize] += 1;
        }
        let mut slot = vec![u32::MAX; ids.len()];
        let mut groups = KeyGroups { single: vec![], repeated: vec![] };
        for (i, &g) in group.iter().enumerate() {
            let g = g as usize;
            if count[g] == 1 {
                groups.single.push(i);
                continue;
            }
            if slot[g] == u32::MAX {
                slot[g] = groups.repeated.len() as u32;
                groups.repeated.push(Vec::with_capacity(count[g] as usize));
            }
            groups.repeated[slot[g] as usize].push(i);
        }
        groups
    }

    /// Applies `ops`, the operations of one key in batch order, one by one from the key's
    /// value before them (`before`, `None` when absent): writes each one's result into
    /// `result`, and returns the one operation that takes the key from `before` to its final
    /// state, with the status it must give (`None` when the key ends as it began). Its `key`
    /// is `ops[0]`.
    pub(crate) fn fold_key(
        &self,
        ops: &[usize],
        before: Option<&[u8]>,
        result: &mut BatchResult,
    ) -> Option<Planned> {
        /// Where the key's current value is.
        #[derive(Clone, Copy)]
        enum Value {
            Before,
            Absent,
            Written(usize),
        }
        let mut value = if before.is_some() { Value::Before } else { Value::Absent };
        for &i in ops {
            let current = match value {
                Value::Before => before,
                Value::Absent => None,
                Value::Written(w) => Some(self.op(w).2),
            };
            let (status, found) = match (self.kinds[i], current) {
                (OpKind::Get, Some(v)) => (Status::Ok, Some(v)),
                (OpKind::Get | OpKind::Update | OpKind::Delete, None) => (Status::NotFound, None),
                (OpKind::Insert, Some(_)) => (Status::Exists, None),
                (OpKind::Insert | OpKind::Upsert | OpKind::Update, _) => {
                    value = Value::Written(i);
                    (Status::Ok, None)
                }
                (OpKind::Delete, Some(_)) => {
                    value = Value::Absent;
                    (Status::Ok, None)
                }
            };
            result.set(i, status, found);
        }
        let net = |kind, value| Planned { kind, key: ops[0], value, expect: Some(Status::Ok) };
        match (before, value) {
            (_, Value::Before) | (None, Value::Absent) => None,
            (Some(_), Value::Absent) => Some(net(OpKind::Delete, ops[0])),
            (Some(old), Value::Written(w)) if old == self.op(w).2 => None,
            (Some(_), Value::Written(w)) => Some(net(OpKind::Update, w)),
            (None, Value::Written(w)) => Some(net(OpKind::Insert, w)),
        }
    }
}

/// A batch's operations by key: the keys no other operation has, and the others'.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct KeyGroups {
    /// Operations whose key no other operation of the batch has, in batch order.
    pub single: Vec<usize>,
    /// The operations of each key that several operations have, in batch order (keys in the
    /// order of their first operation).
    pub repeated: Vec<Vec<usize>>,
}

/// One operation of an engine batch that runs (a part of) a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Planned {
    /// What the engine does.
    pub kind: OpKind,
    /// The batch operation whose key it uses, and where its result goes.
    pub key: usize,
    /// The batch operation whose value it writes (for kinds that write one).
    pub value: usize,
    /// `Some(status)`: the net change of a key that several operations of the batch share,
    /// whose result must be `status` and goes nowhere.
    pub expect: Option<Status>,
}

impl Planned {
    /// Operation `i` of `batch`, as it is.
    pub(crate) fn own(batch: &Batch, i: usize) -> Self {
        Planned { kind: batch.kinds[i], key: i, value: i, expect: None }
    }
}

/// The operations of one engine batch.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Part<'a> {
    /// The whole batch, as it is.
    Whole,
    /// These.
    Planned(&'a [Planned]),
}

impl Part<'_> {
    /// Operations in the part.
    pub(crate) fn len(&self, batch: &Batch) -> usize {
        match self {
            Part::Whole => batch.len(),
            Part::Planned(p) => p.len(),
        }
    }

    /// Its `j`-th operation.
    fn get(&self, batch: &Batch, j: usize) -> Planned {
        match self {
            Part::Whole => Planned::own(batch, j),
            Part::Planned(p) => p[j],
        }
    }
}

/// A batch in kernel form: operation codes, key words, value words (zero-padded to whole words).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    /// One [`OpKind`] code per operation.
    pub kinds: Vec<u32>,
    /// `key_words` words per operation.
    pub keys: Vec<u32>,
    /// `value_words` words per operation (zero for operations without a value); empty when no
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

    /// Stores the results of the operations of `part` from kernel output: `statuses` holds one
    /// code per operation, `values` `value_words` words per operation or nothing when no
    /// operation reads. An invalid code, a missing result, or a net change whose status is not
    /// the one expected is an `Inconsistent` error.
    pub(crate) fn scatter(
        &mut self,
        batch: &Batch,
        part: Part,
        statuses: &[u32],
        values: &[u32],
    ) -> Result<()> {
        let n = part.len(batch);
        let vb = self.value_bytes;
        let padded = vb.div_ceil(4) * 4;
        let bytes: &[u8] = bytemuck::cast_slice(values);
        if statuses.len() != n || !(bytes.is_empty() || bytes.len() == n * padded) {
            return Err(Error::Inconsistent(format!(
                "{} statuses and {} value bytes for {n} operations",
                statuses.len(),
                bytes.len()
            )));
        }
        let bulk = !bytes.is_empty() && padded == vb && matches!(part, Part::Whole);
        if bulk {
            // Values of operations that are not successful reads are never handed out.
            self.values.copy_from_slice(bytes);
        }
        for (j, &code) in statuses.iter().enumerate() {
            let p = part.get(batch, j);
            let status = Status::from_code(code)
                .ok_or_else(|| Error::Inconsistent(format!("status code {code} for a {:?}", p.kind)))?;
            if let Some(want) = p.expect {
                if status != want {
                    return Err(Error::Inconsistent(format!(
                        "a {:?} that the call's reads say must give {want:?} gave {status:?}",
                        p.kind
                    )));
                }
                continue;
            }
            let read = status == Status::Ok && p.kind == OpKind::Get;
            if read && bytes.is_empty() {
                return Err(Error::Inconsistent("a read found its key but no value came back".into()));
            }
            let value = (read && !bulk).then(|| &bytes[j * padded..j * padded + vb]);
            self.set(p.key, status, value);
            self.reads[p.key] = read;
        }
        Ok(())
    }

    /// Sets operation `i`'s result: its status and, for a read that found its key, the value.
    pub(crate) fn set(&mut self, i: usize, status: Status, found: Option<&[u8]>) {
        let vb = self.value_bytes;
        self.statuses[i] = status;
        self.reads[i] = found.is_some();
        if let Some(v) = found {
            self.values[i * vb..(i + 1) * vb].copy_from_slice(v);
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
        let keys = Batch::of_kind(OpKind::Get, 8, 4, &[0; 12], None).unwrap_err();
        assert_eq!(keys.to_string(), "12 bytes of keys are not a whole number of 8-byte keys");
        let values = Batch::of_kind(OpKind::Insert, 8, 8, &[0; 16], Some(&[0; 8])).unwrap_err();
        assert_eq!(values.to_string(), "8 bytes of values for 2 key(s): 2 value(s) of 8 bytes are 16 bytes");
    }

    #[test]
    fn key_groups_separate_repeated_keys_in_order() {
        let mut b = Batch::new(4, 4);
        for k in [1u32, 2, 1, 1, 3, 2, 4] {
            b.upsert(&k.to_le_bytes(), &[0; 4]).unwrap();
        }
        assert_eq!(
            b.key_groups(),
            KeyGroups { single: vec![4, 6], repeated: vec![vec![0, 2, 3], vec![1, 5]] }
        );
    }

    /// Every sequence of up to four operations on one key, from either state: the results and
    /// the net operation equal one-by-one application.
    #[test]
    fn folds_equal_one_by_one_application() {
        use OpKind::*;
        let kinds = [Get, Insert, Upsert, Update, Delete];
        let key = 7u32.to_le_bytes();
        for len in 1..=4u32 {
            for code in 0..5u32.pow(len) {
                let seq: Vec<OpKind> = (0..len).map(|d| kinds[(code / 5u32.pow(d) % 5) as usize]).collect();
                for before in [None, Some([9u8; 4])] {
                    let mut b = Batch::new(4, 4);
                    for (i, &kind) in seq.iter().enumerate() {
                        let v = [i as u8; 4];
                        b.push(kind, &key, kind.writes_value().then_some(&v[..])).unwrap();
                    }
                    // One by one.
                    let mut state = before.map(|v| v.to_vec());
                    let mut want = vec![];
                    for i in 0..b.len() {
                        let (kind, _, v) = b.op(i);
                        want.push(match (kind, &state) {
                            (Get, Some(s)) => (Status::Ok, Some(s.clone())),
                            (Get | Update | Delete, None) => (Status::NotFound, None),
                            (Insert, Some(_)) => (Status::Exists, None),
                            (Insert | Upsert | Update, _) => {
                                state = Some(v.to_vec());
                                (Status::Ok, None)
                            }
                            (Delete, Some(_)) => {
                                state = None;
                                (Status::Ok, None)
                            }
                        });
                    }
                    let mut result = BatchResult::new(b.len(), 4);
                    let ops: Vec<usize> = (0..b.len()).collect();
                    let net = b.fold_key(&ops, before.as_ref().map(|v| &v[..]), &mut result);
                    let got: Vec<_> = (0..b.len())
                        .map(|i| (result.statuses[i], result.value(i).map(<[u8]>::to_vec)))
                        .collect();
                    assert_eq!(got, want, "{seq:?} from {before:?}");
                    // The net operation takes `before` to `state`.
                    let after = match net {
                        None => before.map(|v| v.to_vec()),
                        Some(p) => {
                            assert_eq!(p.expect, Some(Status::Ok));
                            match (p.kind, before) {
                                (Insert, None) | (Update, Some(_)) => Some(b.op(p.value).2.to_vec()),
                                (Delete, Some(_)) => None,
                                other => panic!("{seq:?}: net {other:?}"),
                            }
                        }
                    };
                    assert_eq!(after, state, "{seq:?} from {before:?}: net {net:?}");
                }
            }
        }
    }

    #[test]
    fn encoding_pads_values_to_whole_words() {
        let mut b = Batch::new(4, 3);
        b.insert(&7u32.to_le_bytes(), &[1, 2, 3]).unwrap();
        b.get(&9u32.to_le_bytes()).unwrap();
        let mut e = Encoded::default();
        b.encode(&mut e);
        assert_eq!(e.kinds, vec![OpKind::Insert as u32, OpKind::Get as u32]);
        assert_eq!(e.keys, vec![7, 9]);
        assert_eq!(e.values, vec![0x0003_0201, 0]);
        b.encode_part(Part::Planned(&[Planned::own(&b, 1)]), &mut e);
        assert_eq!(e.keys, vec![9]);
        assert!(e.values.is_empty(), "reads carry no values");
        // A net change takes its key from one operation and its value from another; a delete
        // of an insert's key carries no value.
        let net = |kind, key, value| Planned { kind, key, value, expect: Some(Status::Ok) };
        let planned = [net(OpKind::Update, 1, 0), net(OpKind::Delete, 0, 0)];
        b.encode_part(Part::Planned(&planned), &mut e);
        assert_eq!(e.kinds, vec![OpKind::Update as u32, OpKind::Delete as u32]);
        assert_eq!(e.keys, vec![9, 7]);
        assert_eq!(e.values, vec![0x0003_0201, 0]);
    }
}
