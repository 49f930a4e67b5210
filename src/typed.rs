//! Typed access over the byte-slice batch API: single-key calls on [`GpHash`], and
//! [`TypedIndex`], a map of plain-old-data keys and values (the way hashbrown's `HashMap` sits
//! on its raw table).
//!
//! ```
//! use gphash::TypedIndex;
//!
//! let map = TypedIndex::<u64, u32>::in_memory(1000)?; // a volatile table; `create` for a pool
//! assert!(map.insert(&7, &70)?); // insert never overwrites: false when the key is present
//! map.upsert(&7, &71)?; // inserts or overwrites
//! assert_eq!(map.get(&7)?, Some(71));
//! assert_eq!(map.get_many(&[7, 8])?, vec![Some(71), None]);
//! assert!(map.remove(&7)?);
//! # Ok::<(), gphash::Error>(())
//! ```
//!
//! Every call runs as one or more batches and is acknowledged, that is persisted, when it
//! returns. Keys and values are stored as their bytes in native byte order, so keys compare by
//! bytes (for floats, `0.0` and `-0.0` are distinct keys).

use std::any::type_name;
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;

use bytemuck::{Pod, bytes_of, cast_slice, pod_read_unaligned};

use crate::batch::{Batch, BatchResult};
use crate::error::{Error, Result};
use crate::index::{Config, GpHash, Options, Stats};
use crate::protocol::{OpKind, Status};

/// Single-key calls: each runs a batch of one operation. A key or value of the wrong width
/// is refused with [`Error::KeyWidth`] or [`Error::ValueSize`] before anything runs.
impl GpHash {
    /// The value of `key`, if it is present.
    pub fn get_one(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(run_one(self, OpKind::Get, key, None)?.value(0).map(<[u8]>::to_vec))
    }

    /// Inserts `key` if it is absent; `false` (and nothing changed) when it is present.
    pub fn insert_one(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        Ok(run_one(self, OpKind::Insert, key, Some(value))?.statuses[0] == Status::Ok)
    }

    /// Inserts `key` or overwrites its value.
    pub fn upsert_one(&self, key: &[u8], value: &[u8]) -> Result<()> {
        run_one(self, OpKind::Upsert, key, Some(value)).map(drop)
    }

    /// Overwrites the value of `key` if it is present; `false` when it is absent.
    pub fn update_one(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        Ok(run_one(self, OpKind::Update, key, Some(value))?.statuses[0] == Status::Ok)
    }

    /// Removes `key`; `false` when it was absent.
    pub fn delete_one(&self, key: &[u8]) -> Result<bool> {
        Ok(run_one(self, OpKind::Delete, key, None)?.statuses[0] == Status::Ok)
    }
}

/// Runs one operation as a batch of its own (`Batch::push` checks the widths: a key of twice
/// the width is refused, not read as two keys).
fn run_one(index: &GpHash, kind: OpKind, key: &[u8], value: Option<&[u8]>) -> Result<BatchResult> {
    let mut batch = index.batch();
    batch.push(kind, key, value)?;
    index.execute(&batch)
}

/// A persistent hash index of `K` keys and `V` values: [`GpHash`] with typed calls.
///
/// `K` and `V` are [`Pod`] types whose sizes are the table's key width and value size. A key
/// is a non-zero multiple of 4 bytes (`u32`, `u64`, `[u32; 8]`, a `#[repr(C)]` struct of
/// words); a value may be any size from 1 byte. Opening a pool whose widths differ from the
/// types' sizes fails with [`Error::TypeSize`].
///
/// `insert` inserts only an absent key, as in the batch API (`HashMap::insert` overwrites:
/// that is [`TypedIndex::upsert`] here). Calls over slices run as one batch (as several beyond
/// [`Stats::max_batch`](crate::Stats::max_batch) operations; a failure undoes those already
/// applied), in which
/// operations on the same key take effect in some order; a [`TypedBatch`] run with
/// [`TypedIndex::execute_ordered`] gives batch order.
pub struct TypedIndex<K, V> {
    index: GpHash,
    types: PhantomData<(K, V)>,
}

impl<K, V> fmt::Debug for TypedIndex<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedIndex")
            .field("key", &type_name::<K>())
            .field("value", &type_name::<V>())
            .field("index", &self.index)
            .finish()
    }
}

impl<K: Pod, V: Pod> TypedIndex<K, V> {
    /// Creates a table for `capacity` keys in a new pool at `path`, with default options
    /// (a GPU if one can be opened, else the CPU model).
    pub fn create(path: impl AsRef<Path>, capacity: u64) -> Result<Self> {
        Self::create_with(Some(path.as_ref()), &Config { capacity, ..Config::default() }, &Options::default())
    }

    /// Creates a table for `capacity` keys in anonymous memory: nothing survives the process.
    pub fn in_memory(capacity: u64) -> Result<Self> {
        Self::create_with(None, &Config { capacity, ..Config::default() }, &Options::default())
    }

    /// Creates a table with the settings of `config` (its `key_bytes` and `value_bytes` are
    /// replaced by the sizes of `K` and `V`) in a new pool at `path`, or in anonymous memory
    /// when `path` is `None`.
    pub fn create_with(path: Option<&Path>, config: &Config, options: &Options) -> Result<Self> {
        let key_bytes = size_of::<K>();
        if key_bytes == 0 || !key_bytes.is_multiple_of(4) {
            return Err(Error::KeyType { type_name: type_name::<K>(), type_bytes: key_bytes });
        }
        // Sizes beyond u32 are refused by the table's own limits.
        let width = |bytes: usize| u32::try_from(bytes).unwrap_or(u32::MAX);
        let config = Config { key_bytes: width(key_bytes), value_bytes: width(size_of::<V>()), ..*config };
        Self::from_index(GpHash::create(path, &config, options)?)
    }

    /// Opens the table in the pool at `path` with default options, recovering it if it was
    /// not closed cleanly.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path.as_ref(), &Options::default())
    }

    /// Opens the table in the pool at `path`, recovering it if it was not closed cleanly.
    pub fn open_with(path: &Path, options: &Options) -> Result<Self> {
        Self::from_index(GpHash::open(path, options)?)
    }

    /// Wraps an open index whose key width and value size are the sizes of `K` and `V`. Else
    /// the index is closed (its content untouched) and [`Error::TypeSize`] names both sizes.
    pub fn from_index(index: GpHash) -> Result<Self> {
        let geo = index.geometry();
        for (role, type_name, type_bytes, table_bytes) in [
            ("key", type_name::<K>(), size_of::<K>(), geo.key_bytes),
            ("value", type_name::<V>(), size_of::<V>(), geo.value_bytes),
        ] {
            if type_bytes != table_bytes as usize {
                index.close()?;
                return Err(Error::TypeSize {
                    role,
                    type_name,
                    type_bytes,
                    table_bytes: table_bytes as usize,
                });
            }
        }
        Ok(TypedIndex { index, types: PhantomData })
    }

    /// The value of `key`, if it is present.
    pub fn get(&self, key: &K) -> Result<Option<V>> {
        Ok(self.index.get_one(bytes_of(key))?.map(|v| pod_read_unaligned(&v)))
    }

    /// Inserts `key` with `value` if it is absent; `false` (and nothing changed) when it is
    /// present. Use [`TypedIndex::upsert`] to overwrite.
    pub fn insert(&self, key: &K, value: &V) -> Result<bool> {
        self.index.insert_one(bytes_of(key), bytes_of(value))
    }

    /// Inserts `key` or overwrites its value.
    pub fn upsert(&self, key: &K, value: &V) -> Result<()> {
        self.index.upsert_one(bytes_of(key), bytes_of(value))
    }

    /// Overwrites the value of `key` if it is present; `false` when it is absent.
    pub fn update(&self, key: &K, value: &V) -> Result<bool> {
        self.index.update_one(bytes_of(key), bytes_of(value))
    }

    /// Removes `key`; `false` when it was absent.
    pub fn remove(&self, key: &K) -> Result<bool> {
        self.index.delete_one(bytes_of(key))
    }

    /// The values of `keys`, in their order (`None` for absent keys).
    pub fn get_many(&self, keys: &[K]) -> Result<Vec<Option<V>>> {
        Ok(decode_values(&self.index.get(cast_slice(keys))?))
    }

    /// Inserts the absent keys of `entries`; per entry, whether it was inserted (`false`: the
    /// key was present, or an earlier-applied entry of the call had the same key).
    pub fn insert_many(&self, entries: &[(K, V)]) -> Result<Vec<bool>> {
        Ok(succeeded(&self.write_many(OpKind::Insert, entries)?))
    }

    /// Inserts or overwrites every entry.
    pub fn upsert_many(&self, entries: &[(K, V)]) -> Result<()> {
        self.write_many(OpKind::Upsert, entries).map(drop)
    }

    /// Overwrites the values of the present keys of `entries`; per entry, whether its key was
    /// present.
    pub fn update_many(&self, entries: &[(K, V)]) -> Result<Vec<bool>> {
        Ok(succeeded(&self.write_many(OpKind::Update, entries)?))
    }

    /// Removes `keys`; per key, whether it was present.
    pub fn remove_many(&self, keys: &[K]) -> Result<Vec<bool>> {
        Ok(succeeded(&self.index.delete(cast_slice(keys))?))
    }

    fn write_many(&self, kind: OpKind, entries: &[(K, V)]) -> Result<Vec<Status>> {
        let mut batch = self.batch();
        for (key, value) in entries {
            batch.push(kind, key, Some(value));
        }
        Ok(self.index.execute(&batch.batch)?.statuses)
    }

    /// An empty batch of this index's types.
    pub fn batch(&self) -> TypedBatch<K, V> {
        TypedBatch::new()
    }

    /// Runs a mixed batch with the semantics of [`GpHash::execute`]: operations on the same
    /// key take effect in some order, and reads see the table as it was before the batch (a
    /// batch larger than `Stats::max_batch` runs in batch order instead).
    pub fn execute(&self, batch: &TypedBatch<K, V>) -> Result<TypedResult<V>> {
        Ok(TypedResult::decode(self.index.execute(&batch.batch)?))
    }

    /// Runs a mixed batch with the results of applying its operations one by one, in order
    /// (see [`GpHash::execute_ordered`]).
    pub fn execute_ordered(&self, batch: &TypedBatch<K, V>) -> Result<TypedResult<V>> {
        Ok(TypedResult::decode(self.index.execute_ordered(&batch.batch)?))
    }

    /// Keys in the table.
    pub fn len(&self) -> u64 {
        self.index.len()
    }

    /// Whether the table holds no key.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Every key and its value, in table order.
    pub fn entries(&self) -> Vec<(K, V)> {
        self.index.entries().iter().map(|(k, v)| (pod_read_unaligned(k), pod_read_unaligned(v))).collect()
    }

    /// Load factor, mode, device, pool, what recovery did, and activity.
    pub fn stats(&self) -> Stats {
        self.index.stats()
    }

    /// Closes the table cleanly: the next open needs no recovery.
    pub fn close(self) -> Result<()> {
        self.index.close()
    }

    /// The underlying index (its GPU, geometry, consistency check; the byte API and device
    /// batches, [`GpHash::execute_device`]).
    pub fn index(&self) -> &GpHash {
        &self.index
    }

    /// The underlying index, giving up the types.
    pub fn into_index(self) -> GpHash {
        self.index
    }
}

/// A mixed batch of typed operations, run by [`TypedIndex::execute`] or
/// [`TypedIndex::execute_ordered`]; result `i` is that of the `i`-th operation pushed.
///
/// ```
/// # let map = gphash::TypedIndex::<u32, u32>::in_memory(100)?;
/// let mut batch = map.batch();
/// batch.upsert(&1, &10).remove(&2).get(&1);
/// let result = map.execute_ordered(&batch)?;
/// assert_eq!(result.value(2), Some(10));
/// # Ok::<(), gphash::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct TypedBatch<K, V> {
    batch: Batch,
    types: PhantomData<(K, V)>,
}

impl<K: Pod, V: Pod> Default for TypedBatch<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Pod, V: Pod> TypedBatch<K, V> {
    /// An empty batch.
    pub fn new() -> Self {
        TypedBatch { batch: Batch::new(size_of::<K>(), size_of::<V>()), types: PhantomData }
    }

    /// Appends a read of `key`.
    pub fn get(&mut self, key: &K) -> &mut Self {
        self.push(OpKind::Get, key, None)
    }

    /// Appends an insertion of `key` if it is absent.
    pub fn insert(&mut self, key: &K, value: &V) -> &mut Self {
        self.push(OpKind::Insert, key, Some(value))
    }

    /// Appends an insertion or overwrite of `key`.
    pub fn upsert(&mut self, key: &K, value: &V) -> &mut Self {
        self.push(OpKind::Upsert, key, Some(value))
    }

    /// Appends an overwrite of `key` if it is present.
    pub fn update(&mut self, key: &K, value: &V) -> &mut Self {
        self.push(OpKind::Update, key, Some(value))
    }

    /// Appends a removal of `key`.
    pub fn remove(&mut self, key: &K) -> &mut Self {
        self.push(OpKind::Delete, key, None)
    }

    fn push(&mut self, kind: OpKind, key: &K, value: Option<&V>) -> &mut Self {
        // The batch's widths are the sizes of K and V, and `kind` takes a value exactly
        // when one is given: `Batch::push` has nothing to refuse.
        self.batch.push(kind, bytes_of(key), value.map(bytes_of)).expect("typed operations fit their batch");
        self
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.batch.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// Removes every operation.
    pub fn clear(&mut self) {
        self.batch = Batch::new(size_of::<K>(), size_of::<V>());
    }
}

/// Results of a [`TypedBatch`]: per operation, its status and, for a get that found its key,
/// the value.
#[derive(Clone, Debug, PartialEq)]
pub struct TypedResult<V> {
    statuses: Vec<Status>,
    values: Vec<Option<V>>,
}

impl<V: Pod> TypedResult<V> {
    fn decode(result: BatchResult) -> Self {
        TypedResult { values: decode_values(&result), statuses: result.statuses }
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.statuses.len()
    }

    /// Whether the batch was empty.
    pub fn is_empty(&self) -> bool {
        self.statuses.is_empty()
    }

    /// The status of each operation, in batch order: `Ok` when a get found its key or a
    /// change was applied, `NotFound` for an absent key, `Exists` for an insert of a present one.
    pub fn statuses(&self) -> &[Status] {
        &self.statuses
    }

    /// Per operation, the value a get found (`None` for other operations and misses).
    pub fn values(&self) -> &[Option<V>] {
        &self.values
    }

    /// The value operation `i` read, if it is a get that found its key.
    pub fn value(&self, i: usize) -> Option<V> {
        self.values.get(i).copied().flatten()
    }

    /// Each operation's status and found value, in batch order.
    pub fn iter(&self) -> impl Iterator<Item = (Status, Option<V>)> + '_ {
        self.statuses.iter().copied().zip(self.values.iter().copied())
    }
}

/// Per operation, the value a get found.
fn decode_values<V: Pod>(result: &BatchResult) -> Vec<Option<V>> {
    (0..result.len()).map(|i| result.value(i).map(pod_read_unaligned)).collect()
}

/// Per operation, whether it was applied.
fn succeeded(statuses: &[Status]) -> Vec<bool> {
    statuses.iter().map(|&s| s == Status::Ok).collect()
}
