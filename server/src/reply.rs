//! Replies from a batch's results. The batcher hands each group of requests its share of the
//! results, and the group's connection makes the replies on its own task: the batcher's one
//! thread only runs batches.

use std::sync::Arc;

use bytes::Bytes;
use gphash::{BatchResult, Status};
use redis_protocol::resp2::types::BytesFrame as Frame;

use crate::command::{Group, Shape, error};
use crate::record::Widths;

/// What a job of the batcher comes back with.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The group's operations ran: they are the results from `first` on.
    Ran { result: Arc<BatchResult>, first: usize, group: Group },
    /// The replies, already made: errors, DBSIZE, INFO, requests that ran one at a time.
    Made(Vec<Frame>),
}

impl Outcome {
    /// One reply per request, in order.
    pub(crate) fn into_replies(self, widths: &Widths) -> Vec<Frame> {
        match self {
            Outcome::Ran { result, mut first, group } => group
                .requests
                .iter()
                .map(|&(shape, len)| {
                    let reply = answer(&result, first, len, shape, widths);
                    first += len;
                    reply
                })
                .collect(),
            Outcome::Made(replies) => replies,
        }
    }
}

/// The reply of a request whose operations are `len` results from `first`.
pub(crate) fn answer(r: &BatchResult, first: usize, len: usize, shape: Shape, widths: &Widths) -> Frame {
    let applied = |i: usize| r.statuses[i] == Status::Ok;
    let ok = || Frame::SimpleString(Bytes::from_static(b"OK"));
    match shape {
        Shape::Ok => ok(),
        Shape::OkOrNil if applied(first) => ok(),
        Shape::OkOrNil => Frame::Null,
        Shape::Flag => Frame::Integer(applied(first) as i64),
        Shape::Value => value(r, first, widths),
        Shape::Count => {
            let found =
                (first..first + len).filter(|&i| matches!(r.statuses[i], Status::Ok | Status::Corrupt));
            Frame::Integer(found.count() as i64)
        }
        Shape::Values => Frame::Array((first..first + len).map(|i| value(r, i, widths)).collect()),
    }
}

/// What read `i` found.
fn value(r: &BatchResult, i: usize, widths: &Widths) -> Frame {
    match (r.statuses[i], r.value(i)) {
        (Status::Ok, Some(stored)) => match widths.value(stored) {
            Some(v) => Frame::BulkString(Bytes::copy_from_slice(v)),
            None => error(
                "ERR the stored value holds no length this server writes (a value written by another program?)",
            ),
        },
        (Status::Corrupt, _) => error("ERR the stored value fails its checksum (`gphash check` names it)"),
        _ => Frame::Null,
    }
}
