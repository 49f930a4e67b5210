//! The typed layer (`TypedIndex`, `TypedBatch`) and the single-key byte calls against a
//! `HashMap` applied one operation at a time, on the GPU and on the CPU executor.

mod common;

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::path::Path;

use bytemuck::{Pod, Zeroable};
use gphash::{Config, Error, GpHash, GpuOptions, Options, Status, TypedIndex};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

/// A value with fields of several widths and no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
struct Record {
    id: u64,
    score: f32,
    flags: u16,
    tag: [u8; 2],
}

/// Keys drawn from a universe this small hit present keys often.
const UNIVERSE: u64 = 400;

/// Runs random single-key calls, calls over slices and mixed batches on `map`, comparing every
/// result and the final content with a `HashMap`.
fn against_oracle<K, V>(
    map: &TypedIndex<K, V>,
    seed: u64,
    key: impl Fn(u64) -> K,
    value: impl Fn(&mut StdRng) -> V,
) where
    K: Pod + Hash + Eq + Debug,
    V: Pod + PartialEq + Debug,
{
    let mut rng = StdRng::seed_from_u64(seed);
    let mut oracle: HashMap<K, V> = HashMap::new();
    for step in 0..120 {
        let k = key(rng.random_range(0..UNIVERSE));
        let v = value(&mut rng);
        let at = format!("step {step}");
        match rng.random_range(0..9) {
            0 => assert_eq!(map.get(&k).unwrap(), oracle.get(&k).copied(), "{at}: get"),
            1 => assert_eq!(map.insert(&k, &v).unwrap(), oracle.try_insert_absent(k, v), "{at}: insert"),
            2 => {
                map.upsert(&k, &v).unwrap();
                oracle.insert(k, v);
            }
            3 => {
                let present = oracle.get_mut(&k).map(|old| *old = v).is_some();
                assert_eq!(map.update(&k, &v).unwrap(), present, "{at}: update");
            }
            4 => assert_eq!(map.remove(&k).unwrap(), oracle.remove(&k).is_some(), "{at}: remove"),
            5 => {
                // Reads may repeat a key.
                let keys: Vec<K> =
                    (0..rng.random_range(0..60)).map(|_| key(rng.random_range(0..UNIVERSE))).collect();
                let want: Vec<Option<V>> = keys.iter().map(|k| oracle.get(k).copied()).collect();
                assert_eq!(map.get_many(&keys).unwrap(), want, "{at}: get_many");
            }
            6 => {
                // Writes over slices take effect in some order: their keys are distinct here.
                let keys: Vec<K> =
                    sample(&mut rng, UNIVERSE as usize, 40).iter().map(|i| key(i as u64)).collect();
                let entries: Vec<(K, V)> = keys.iter().map(|&k| (k, value(&mut rng))).collect();
                match rng.random_range(0..4) {
                    0 => {
                        let want: Vec<bool> =
                            entries.iter().map(|&(k, v)| oracle.try_insert_absent(k, v)).collect();
                        assert_eq!(map.insert_many(&entries).unwrap(), want, "{at}: insert_many");
                    }
                    1 => {
                        map.upsert_many(&entries).unwrap();
                        oracle.extend(entries.iter().copied());
                    }
                    2 => {
                        let want: Vec<bool> = entries
                            .iter()
                            .map(|(k, v)| oracle.get_mut(k).map(|old| *old = *v).is_some())
                            .collect();
                        assert_eq!(map.update_many(&entries).unwrap(), want, "{at}: update_many");
                    }
                    _ => {
                        let want: Vec<bool> = keys.iter().map(|k| oracle.remove(k).is_some()).collect();
                        assert_eq!(map.remove_many(&keys).unwrap(), want, "{at}: remove_many");
                    }
                }
            }
            _ => {
                // A mixed batch that may repeat keys, in batch order.
                let mut batch = map.batch();
                let mut want = vec![];
                for _ in 0..rng.random_range(0..80) {
                    let k = key(rng.random_range(0..UNIVERSE / 4));
                    let v = value(&mut rng);
                    want.push(match rng.random_range(0..5) {
                        0 => {
                            batch.get(&k);
                            oracle.get(&k).map_or((Status::NotFound, None), |v| (Status::Ok, Some(*v)))
                        }
                        1 => {
                            batch.insert(&k, &v);
                            (if oracle.try_insert_absent(k, v) { Status::Ok } else { Status::Exists }, None)
                        }
                        2 => {
                            batch.upsert(&k, &v);
                            oracle.insert(k, v);
                            (Status::Ok, None)
                        }
                        3 => {
                            batch.update(&k, &v);
                            let present = oracle.get_mut(&k).map(|old| *old = v).is_some();
                            (if present { Status::Ok } else { Status::NotFound }, None)
                        }
                        _ => {
                            batch.remove(&k);
                            (if oracle.remove(&k).is_some() { Status::Ok } else { Status::NotFound }, None)
                        }
                    });
                }
                let result = map.execute_ordered(&batch).unwrap();
                assert_eq!(result.len(), batch.len());
                assert_eq!(result.iter().collect::<Vec<_>>(), want, "{at}: ordered batch");
            }
        }
        assert_eq!(map.len(), oracle.len() as u64, "{at}: len");
    }
    let entries: HashMap<K, V> = map.entries().into_iter().collect();
    assert_eq!(entries, oracle, "content");
    assert!(map.index().check().ok(), "{}", map.index().check());
    assert!(map.stats().activity.resizes > 0, "the table grew during the run");
}

trait TryInsertAbsent<K, V> {
    /// Inserts `key` if it is absent, as gphash's insert does; whether it did.
    fn try_insert_absent(&mut self, key: K, value: V) -> bool;
}

impl<K: Hash + Eq, V> TryInsertAbsent<K, V> for HashMap<K, V> {
    fn try_insert_absent(&mut self, key: K, value: V) -> bool {
        let absent = !self.contains_key(&key);
        if absent {
            self.insert(key, value);
        }
        absent
    }
}

/// A 32-byte key of key number `k`.
fn wide_key(k: u64) -> [u32; 8] {
    bytemuck::pod_read_unaligned(&common::key(k, 32))
}

fn record(rng: &mut StdRng) -> Record {
    Record { id: rng.random(), score: rng.random_range(-1.0..1.0), flags: rng.random(), tag: rng.random() }
}

/// Tables of small capacity (they grow during the run) with u64 keys and u32 values, 32-byte
/// keys and struct values, and u32 keys with 2-byte values (not a whole word).
fn typed_tables_match_a_hash_map(options: &Options, test: &str) {
    let seed = common::seed(test);
    let dir = common::pool_dir();
    let config = Config { capacity: 64, ..Config::default() };
    let create = |name: &str| Some(dir.path().join(name));

    let map = TypedIndex::<u64, u32>::create_with(create("a").as_deref(), &config, options).unwrap();
    against_oracle(&map, seed, |k| k * 0x9E37_79B9, |rng| rng.random());
    let content = map.entries();
    map.close().unwrap();
    // Reopened, the table holds the same.
    let map = TypedIndex::<u64, u32>::open_with(&dir.path().join("a"), options).unwrap();
    assert!(map.stats().recovery.clean_shutdown);
    assert_eq!(sorted(map.entries()), sorted(content));

    let map = TypedIndex::<[u32; 8], Record>::create_with(create("b").as_deref(), &config, options).unwrap();
    against_oracle(&map, seed + 1, wide_key, record);

    // In anonymous memory.
    let map = TypedIndex::<u32, u16>::create_with(None, &config, options).unwrap();
    against_oracle(&map, seed + 2, |k| k as u32, |rng| rng.random());
}

fn sorted<K: Pod + Ord, V: Pod>(mut entries: Vec<(K, V)>) -> Vec<(K, V)> {
    entries.sort_by_key(|e| e.0);
    entries
}

#[test]
fn typed_tables_match_a_hash_map_on_the_gpu() {
    typed_tables_match_a_hash_map(&common::gpu_options(GpuOptions::default()), "typed_gpu");
}

#[test]
fn typed_tables_match_a_hash_map_on_the_cpu() {
    typed_tables_match_a_hash_map(&common::cpu_options(), "typed_cpu");
}

#[test]
fn unordered_batches_read_the_state_before_the_batch() {
    let map = TypedIndex::<u64, u64>::create_with(None, &Config::default(), &common::cpu_options()).unwrap();
    let mut batch = map.batch();
    batch.get(&1).upsert(&1, &5).get(&1).insert(&2, &20).update(&3, &30);
    let unordered = map.execute(&batch).unwrap();
    assert_eq!(
        unordered.statuses(),
        [Status::NotFound, Status::Ok, Status::NotFound, Status::Ok, Status::NotFound]
    );
    assert_eq!(unordered.values(), [None; 5]);
    map.remove(&1).unwrap();
    let ordered = map.execute_ordered(&batch).unwrap();
    assert_eq!(
        ordered.statuses(),
        [Status::NotFound, Status::Ok, Status::Ok, Status::Exists, Status::NotFound]
    );
    assert_eq!(ordered.value(2), Some(5));
    assert_eq!(ordered.value(0), None);
    assert_eq!(ordered.value(99), None, "out of range reads nothing");
}

/// Opens `path` as a typed index of the wrong types: the typed error names both sizes.
fn open_as<K: Pod, V: Pod>(path: &Path) -> Error {
    TypedIndex::<K, V>::open_with(path, &common::cpu_options()).unwrap_err()
}

#[test]
fn wrong_sizes_are_typed_errors_and_change_nothing() {
    let dir = common::pool_dir();
    let path = dir.path().join("t.pool");
    let config = Config { capacity: 100, ..Config::default() };
    let map = TypedIndex::<u64, u64>::create_with(Some(&path), &config, &common::cpu_options()).unwrap();
    map.insert_many(&[(1, 10), (2, 20)]).unwrap();
    map.close().unwrap();

    let e = open_as::<u32, u64>(&path);
    assert!(
        matches!(e, Error::TypeSize { role: "key", type_name: "u32", type_bytes: 4, table_bytes: 8 }),
        "{e:?}"
    );
    assert_eq!(e.to_string(), "key type u32 is 4 bytes; this table's keys are 8 bytes");
    let e = open_as::<u64, Record>(&path);
    assert!(matches!(e, Error::TypeSize { role: "value", type_bytes: 16, table_bytes: 8, .. }), "{e:?}");
    assert!(e.to_string().contains("Record is 16 bytes; this table's values are 8 bytes"), "{e}");
    let e = open_as::<[u8; 8], [u8; 9]>(&path);
    assert!(matches!(e, Error::TypeSize { role: "value", type_bytes: 9, table_bytes: 8, .. }), "{e:?}");

    // A key type the table cannot take, a value type of no bytes: refused, no pool left behind.
    let other = dir.path().join("other.pool");
    let e =
        TypedIndex::<[u8; 6], u64>::create_with(Some(&other), &config, &common::cpu_options()).unwrap_err();
    assert!(matches!(e, Error::KeyType { type_name: "[u8; 6]", type_bytes: 6 }), "{e:?}");
    assert_eq!(e.to_string(), "key type [u8; 6] is 6 bytes; keys must be a non-zero multiple of 4 bytes");
    let e = TypedIndex::<(), u64>::create_with(Some(&other), &config, &common::cpu_options()).unwrap_err();
    assert!(matches!(e, Error::KeyType { type_bytes: 0, .. }), "{e:?}");
    let e = TypedIndex::<u64, ()>::create_with(Some(&other), &config, &common::cpu_options()).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e:?}");
    assert!(!other.exists());

    // The refused opens closed the pool cleanly, its content untouched.
    let index = GpHash::open(&path, &common::cpu_options()).unwrap();
    assert!(index.stats().recovery.clean_shutdown);
    let e = TypedIndex::<u64, u32>::from_index(index).unwrap_err();
    assert!(matches!(e, Error::TypeSize { role: "value", type_bytes: 4, table_bytes: 8, .. }), "{e:?}");
    let map = TypedIndex::<u64, u64>::open_with(&path, &common::cpu_options()).unwrap();
    assert!(map.stats().recovery.clean_shutdown);
    assert_eq!(map.get_many(&[1, 2, 3]).unwrap(), [Some(10), Some(20), None]);
    // Any Pod types of the right sizes read the same bytes.
    map.close().unwrap();
    let bytes = TypedIndex::<[u8; 8], [u32; 2]>::open_with(&path, &common::cpu_options()).unwrap();
    assert_eq!(bytes.get(&2u64.to_ne_bytes()).unwrap(), Some([20, 0]));
}

/// The single-key byte calls on `index` (8-byte keys, 8-byte values), against their meaning.
fn single_key_calls(index: &GpHash) {
    let (k, v, w) = (7u64.to_le_bytes(), 70u64.to_le_bytes(), 71u64.to_le_bytes());
    assert_eq!(index.get_one(&k).unwrap(), None);
    assert!(!index.update_one(&k, &v).unwrap(), "update of an absent key");
    assert!(!index.delete_one(&k).unwrap(), "delete of an absent key");
    assert!(index.insert_one(&k, &v).unwrap());
    assert!(!index.insert_one(&k, &w).unwrap(), "insert of a present key");
    assert_eq!(index.get_one(&k).unwrap().as_deref(), Some(&v[..]), "insert does not overwrite");
    assert!(index.update_one(&k, &w).unwrap());
    assert_eq!(index.get_one(&k).unwrap().as_deref(), Some(&w[..]));
    index.upsert_one(&k, &v).unwrap();
    index.upsert_one(&8u64.to_le_bytes(), &v).unwrap();
    assert_eq!(index.get_one(&k).unwrap().as_deref(), Some(&v[..]));
    assert_eq!(index.len(), 2);
    assert!(index.delete_one(&k).unwrap());
    assert_eq!(index.get_one(&k).unwrap(), None);

    // Two keys' worth of bytes is a key of the wrong width, not two keys.
    let two = [k, k].concat();
    assert!(matches!(index.get_one(&two), Err(Error::KeyWidth { found: 16, expected: 8 })));
    assert!(matches!(index.delete_one(&two), Err(Error::KeyWidth { found: 16, expected: 8 })));
    assert!(matches!(index.insert_one(&k, &[0; 4]), Err(Error::ValueSize { found: 4, expected: 8 })));
    assert!(matches!(index.upsert_one(&k[..4], &v), Err(Error::KeyWidth { found: 4, expected: 8 })));
    assert!(matches!(index.update_one(&8u64.to_le_bytes(), &[]), Err(Error::ValueSize { .. })));
    assert_eq!(index.len(), 1, "refused calls change nothing");
    assert_eq!(index.get_one(&8u64.to_le_bytes()).unwrap().as_deref(), Some(&v[..]));
}

#[test]
fn single_key_byte_calls() {
    let dir = common::pool_dir();
    let config = Config { capacity: 100, ..Config::default() };
    single_key_calls(&common::gpu_table(&dir, &config));
    single_key_calls(&common::table(&dir, "cpu.pool", &config, &common::cpu_options()));
}
