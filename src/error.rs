//! Errors of every gphash operation.

use std::path::PathBuf;

/// What a [`Error::TableFull`] with `early` set adds to its message.
const EARLY_COLLISIONS: &str = ", although the table would be less than half full: its layout collides too early \
     for growing to help (use more levels, hash locations or slots per bucket)";

/// What went wrong. Nothing here is a panic: bad input, full tables and missing device
/// features are all reported, and none of them loses acknowledged data.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pool file: I/O, corruption, version, lock, space.
    #[error(transparent)]
    Pool(#[from] host_pm::PoolError),
    /// A configuration that cannot be built (layout, widths, sizes).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The pool header is valid but describes a table this build cannot use.
    #[error("pool {path}: {why}")]
    IncompatiblePool {
        /// The pool.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A key of the wrong width.
    #[error("key of {found} bytes; this table's keys are {expected} bytes")]
    KeyWidth {
        /// Bytes given.
        found: usize,
        /// Bytes the table uses.
        expected: usize,
    },
    /// A value of the wrong size.
    #[error("value of {found} bytes; this table's values are {expected} bytes")]
    ValueSize {
        /// Bytes given.
        found: usize,
        /// Bytes the table uses.
        expected: usize,
    },
    /// Concatenated keys of a bulk call that are not a whole number of keys.
    #[error("{given} bytes of keys are not a whole number of {key_bytes}-byte keys")]
    KeysLength {
        /// Bytes given.
        given: usize,
        /// This table's key width.
        key_bytes: usize,
    },
    /// Concatenated keys of operations given as columns that are not one key per operation.
    #[error(
        "{given} bytes of keys for {ops} operation(s): {ops} key(s) of {key_bytes} bytes are {} bytes",
        ops * key_bytes
    )]
    KeysCount {
        /// Bytes given.
        given: usize,
        /// Operations of the call.
        ops: usize,
        /// This table's key width.
        key_bytes: usize,
    },
    /// Concatenated values of a bulk call that are not one value per key.
    #[error(
        "{given} bytes of values for {keys} key(s): {keys} value(s) of {value_bytes} bytes are {} bytes",
        keys * value_bytes
    )]
    ValuesLength {
        /// Bytes given.
        given: usize,
        /// Keys of the call.
        keys: usize,
        /// This table's value size.
        value_bytes: usize,
    },
    /// With [`crate::Options::verify_values`], a key that an ordered (or split) call changes
    /// holds a value that fails its checksum: the call would have to compute its results from
    /// that value, so it is refused before anything runs (`gphash check` names the slot). A
    /// call of one engine batch that upserts such a key first and never deletes it needs
    /// nothing of the old value: it runs.
    #[error(
        "{keys} key(s) of the call hold a value that fails its checksum; the call was not applied (`gphash check` names them)"
    )]
    CorruptValues {
        /// Keys of the call whose stored value fails its checksum.
        keys: u64,
    },
    /// A typed index's key or value type whose size is not the table's key width or value
    /// size ([`crate::TypedIndex`]).
    #[error("{role} type {type_name} is {type_bytes} bytes; this table's {role}s are {table_bytes} bytes")]
    TypeSize {
        /// `"key"` or `"value"`.
        role: &'static str,
        /// The type.
        type_name: &'static str,
        /// Its size.
        type_bytes: usize,
        /// The table's width for it.
        table_bytes: usize,
    },
    /// A key type that no table can take: the table compares keys in 4-byte words
    /// ([`crate::TypedIndex`]).
    #[error("key type {type_name} is {type_bytes} bytes; keys must be a non-zero multiple of 4 bytes")]
    KeyType {
        /// The type.
        type_name: &'static str,
        /// Its size.
        type_bytes: usize,
    },
    /// Some insertion of the batch found no empty candidate slot. The batch was rolled back:
    /// none of its operations took effect.
    #[error(
        "table full: {failed} insertion(s) of the batch found no empty slot (load factor {load:.3}){}; the batch was not applied",
        if *early { EARLY_COLLISIONS } else { "" }
    )]
    TableFull {
        /// Insertions that found no slot.
        failed: u64,
        /// Load factor before the batch.
        load: f64,
        /// The table would be less than half full even with every operation of the batch adding
        /// a key: its layout collides too early, and growing it is refused.
        early: bool,
    },
    /// The value heap has no free cell. The batch was rolled back.
    #[error("value heap full: {failed} operation(s) found no free value cell; the batch was not applied")]
    HeapFull {
        /// Operations that found no cell.
        failed: u64,
    },
    /// A batch with more operations than the engine's buffers can hold on this device (calls
    /// of the host API are split to fit; device batches are not), or a host call that must be
    /// folded with more than 2^32 - 1. Nothing was applied.
    #[error("batch of {len} operations: the engine takes at most {max} at once; nothing was applied")]
    BatchTooLarge {
        /// Operations in the batch.
        len: u64,
        /// The most the engine takes.
        max: u64,
    },
    /// A device batch declared reads-only ([`crate::DeviceBatch::reads_only`]) held operations
    /// that are not gets. They were not run; its gets were (reading changes nothing).
    #[error("a reads-only device batch held {count} operations that are not gets: they were not run")]
    NotReadsOnly {
        /// Operations that are not gets.
        count: u64,
    },
    /// The engine returned a result that cannot be right: a status code that is not one, or a
    /// status that contradicts the state of its key read earlier in the same call (a defect,
    /// or a device returning wrong results). The index is poisoned.
    #[error("inconsistent result: {0}")]
    Inconsistent(String),
    /// Growing the table failed; the table is unchanged and the batch was not applied.
    #[error("resize: {0}")]
    Resize(String),
    /// No Vulkan adapter could be opened.
    #[error("no GPU: {0}")]
    NoAdapter(String),
    /// The adapter lacks a feature gphash needs.
    #[error("missing GPU feature: {0}")]
    MissingFeature(String),
    /// A WGSL kernel failed to build.
    #[error("shader: {0}")]
    Shader(String),
    /// The GPU or the driver failed.
    #[error("GPU: {0}")]
    Gpu(String),
    /// An earlier failure left the index unusable until it is reopened (which recovers).
    #[error("the index must be reopened after an earlier failure: {0}")]
    Poisoned(String),
    /// Shards of a [`crate::ShardedGpHash`] failed their parts of a batch. Those parts took no
    /// effect, as a failed call on one table takes none (a shard the error poisoned recovers on
    /// reopening, each key as before or after the batch); the parts of the shards in `applied`
    /// did take effect, and `results` holds their operations' results.
    #[error(
        "shard {shard} failed its part of the batch: {source}; the parts on shards {applied:?} took effect \
         (the error holds their results), those on shards {failed:?} did not"
    )]
    Shard {
        /// The first shard that failed.
        shard: usize,
        /// Every shard that failed, `shard` among them.
        failed: Vec<usize>,
        /// The shards whose parts took effect.
        applied: Vec<usize>,
        /// `shard`'s error.
        source: Box<Error>,
        /// In batch order, the results of the operations whose parts took effect.
        results: Box<crate::PartialResult>,
    },
    /// A trace file line that cannot be parsed.
    #[error("{path}:{line}: {why}")]
    Trace {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// Other I/O.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

impl From<gphash_gpu::Error> for Error {
    fn from(e: gphash_gpu::Error) -> Self {
        match e {
            gphash_gpu::Error::NoAdapter(why) => Error::NoAdapter(why),
            gphash_gpu::Error::MissingFeature(why) => Error::MissingFeature(why),
            gphash_gpu::Error::Shader(why) => Error::Shader(why),
            gphash_gpu::Error::Gpu(why) => Error::Gpu(why),
            gphash_gpu::Error::InvalidConfig(why) => Error::InvalidConfig(why),
        }
    }
}

/// Result of gphash operations.
pub type Result<T> = std::result::Result<T, Error>;
