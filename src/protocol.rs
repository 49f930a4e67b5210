//! Operation codes, result codes and the per-operation record that phase A hands to phase B.
//!
//! Twin: `shaders/common/protocol.wgsl`, and `gpu/shaders/common/ops.wgsl` for the operation and
//! result codes; the numbers must match (the test `wgsl_protocol_constants_match_rust` in
//! `src/gpu/shader.rs` compares every constant of both files with these).

/// What one operation of a batch does (its code a `u32`: a batch's kinds are the kernels' words
/// as they are).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, bytemuck::NoUninit)]
#[repr(u32)]
pub enum OpKind {
    /// Read the value of a key.
    Get = 1,
    /// Insert a key that is absent (`Exists` if present).
    Insert = 2,
    /// Insert or overwrite.
    Upsert = 3,
    /// Overwrite a present key (`NotFound` if absent).
    Update = 4,
    /// Remove a key (`NotFound` if absent).
    Delete = 5,
}

impl OpKind {
    /// Decodes an operation code.
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => OpKind::Get,
            2 => OpKind::Insert,
            3 => OpKind::Upsert,
            4 => OpKind::Update,
            5 => OpKind::Delete,
            _ => return None,
        })
    }

    /// Whether the operation carries a value that phase A writes into a fresh cell.
    pub fn writes_value(self) -> bool {
        matches!(self, OpKind::Insert | OpKind::Upsert | OpKind::Update)
    }
}

/// The outcome of one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    /// Found (get) or applied (insert, upsert, update, delete).
    Ok = 1,
    /// The key is absent (get, update, delete).
    NotFound = 2,
    /// The key is present (insert).
    Exists = 3,
    /// A verified read (`Options::verify_values`) found the key, but its value cell fails its
    /// checksum: the stored value is damaged and is not handed out.
    Corrupt = 4,
}

impl Status {
    /// Decodes a result code.
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => Status::Ok,
            2 => Status::NotFound,
            3 => Status::Exists,
            4 => Status::Corrupt,
            _ => return None,
        })
    }
}

/// Where an operation stands after phase A (`OpState::phase`).
pub(crate) mod phase {
    /// Finished in phase A; its status is final.
    pub(crate) const DONE: u32 = 1;
    /// Found its key published at `slot`; phase B swings or clears it.
    pub(crate) const FOUND: u32 = 2;
    /// Claimed `slot` (INSERTING) for a new key; phase B resolves and publishes.
    pub(crate) const CLAIMED: u32 = 3;
    /// No empty candidate slot: the batch is rolled back.
    pub(crate) const FULL: u32 = 4;
    /// No free value cell: the batch is rolled back.
    pub(crate) const NO_CELL: u32 = 5;
    /// An earlier operation of the batch claims the same key; `slot` holds that operation's
    /// index. Phase B makes an upsert overwrite its value and an insert find the key existing.
    pub(crate) const JOINED: u32 = 6;
    /// Found its key published, as did an earlier operation of the batch that leads the key's
    /// changes (`slot` holds the lead's index): phase B applies them all with the lead's one CAS.
    pub(crate) const FOLLOWS: u32 = 7;
}

/// Marks an absent cell or slot.
pub(crate) const NONE: u32 = u32::MAX;

/// Per-operation record kept on the device between the phases (9 words).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct OpState {
    /// A `phase` constant.
    pub phase: u32,
    /// The bucket of the slot found or claimed (with `slot`), the claiming operation's index
    /// for [`phase::JOINED`], the lead's for [`phase::FOLLOWS`], or [`NONE`].
    pub bucket: u32,
    /// The fresh value cell of this operation (numbered within its key's arena, as a state word
    /// names it), or [`NONE`].
    pub cell: u32,
    /// The cell this operation releases once its batch is persisted (within the same arena),
    /// or [`NONE`].
    pub free: u32,
    /// Of a lead ([`phase::FOUND`]): 1 + the highest index of the operations of its key that
    /// write a value (0: none).
    pub last_write: u32,
    /// Of a lead: the lowest index of the deletes of its key, or [`NONE`].
    pub first_delete: u32,
    /// The state word phase A found (the key's published state before the batch).
    pub found: u32,
    /// The arena of the operation's key (`Geometry::arena_of` its fingerprint), which holds
    /// `cell` and `free`; set by the allocation stage.
    pub arena: u32,
    /// The slot found or claimed, in `bucket`.
    pub slot: u32,
}

impl OpState {
    /// Words of the record on the device.
    pub const WORDS: u64 = 9;

    /// The record of an operation before phase A.
    pub const INITIAL: OpState = OpState {
        phase: 0,
        bucket: NONE,
        cell: NONE,
        free: NONE,
        last_write: 0,
        first_delete: NONE,
        found: 0,
        arena: 0,
        slot: 0,
    };
}

/// Words of the batch control block (atomic counters the kernels update; reset per phase).
pub(crate) mod control {
    /// Dirty cache lines appended (may exceed the list's capacity: then persist everything).
    pub(crate) const DIRTY_COUNT: usize = 0;
    /// Operations that need phase B.
    pub(crate) const NEED_B: usize = 1;
    /// Insertions that found no empty slot.
    pub(crate) const FULL: usize = 2;
    /// Operations that found no free value cell.
    pub(crate) const NO_CELL: usize = 3;
    /// Keys newly published in phase B.
    pub(crate) const PUBLISHED: usize = 4;
    /// Keys deleted in phase B.
    pub(crate) const DELETED: usize = 5;
    /// Operations that found their key or claimed a slot (cache hit rate's denominator).
    pub(crate) const CACHE_TARGETS: usize = 6;
    /// Of those, operations whose slot was in a cached group.
    pub(crate) const CACHE_HITS: usize = 7;
    /// Group reads served by the cache or skipped because a cached group held the key.
    pub(crate) const CACHE_GROUPS_SAVED: usize = 8;
    /// Value reads served by the cache.
    pub(crate) const CACHE_VALUES_SAVED: usize = 9;
    /// State words the write-through refresh read from the table.
    pub(crate) const CACHE_REFRESHED: usize = 10;
    /// Claims that found a cached copy stale.
    pub(crate) const CACHE_STALE: usize = 11;
    /// Groups a loading slice copied into the cache.
    pub(crate) const CACHE_FILLED: usize = 12;
    /// Value cells the allocation stage took (phase B must release those not published).
    pub(crate) const ALLOCATED: usize = 13;
    /// Operations of a reads-only batch that are not gets: not run (the host refuses the batch).
    pub(crate) const REFUSED: usize = 14;
    /// Words in the block.
    pub(crate) const WORDS: usize = 16;
}
