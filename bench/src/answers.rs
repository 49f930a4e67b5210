//! What a workload's operations should answer, checked after the timed runs: statuses, and
//! every value read against the values the workloads wrote for its key.

use crate::ycsb::{Op, value_of};
use gphash::{OpKind, Status};

/// What a stream's requests should answer.
///
/// A value read must be one that some workload run on the table wrote for its key: a missing,
/// damaged or misplaced value fails, a stale one (an earlier workload's value of a key updated
/// since) is not told apart; the index's tests against the oracle check that.
#[derive(Clone, Debug)]
pub struct Check {
    /// The status of every request.
    pub expect: Status,
    /// Ids below this were loaded: a read of one must find it.
    pub records: u64,
    /// The seeds of every value written so far: a value read must be one of them for its key.
    pub seeds: Vec<u64>,
    /// Value width.
    pub value_bytes: usize,
    /// Reads may run before another thread's insert of their key (the CPU maps' threads, each
    /// on its own slice of the stream): a read of a key the stream inserts may then find
    /// nothing. Batches run in order, and a stream's reads only name keys inserted by earlier
    /// batches, so for them this is false.
    pub inserts_race: bool,
}

impl Check {
    /// Whether `op` answered as it should with the status code `status` and, for a read that
    /// found its key, `value`.
    pub fn accepts(&self, op: &Op, status: u8, value: Option<&[u8]>) -> bool {
        let read = op.kind == OpKind::Get;
        if read && status == Status::Ok as u8 {
            return self.expect == Status::Ok && self.value_ok(op.id, value);
        }
        if read && self.inserts_race && self.expect == Status::Ok && op.id >= self.records {
            // Inserted by this stream, perhaps on another thread not there yet.
            return status == Status::NotFound as u8;
        }
        status == self.expect as u8
    }

    fn value_ok(&self, id: u64, value: Option<&[u8]>) -> bool {
        value.is_some_and(|v| self.seeds.iter().any(|&s| value_of(id, s, self.value_bytes) == v))
    }
}
