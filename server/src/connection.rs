//! One client connection: a reader that frames requests and hands them on, and a writer that
//! sends the replies in the order of the requests.
//!
//! The reader takes every request the client has sent so far (up to [`CHUNK`]) at once: the
//! operations of consecutive data commands go to the batcher as one job, and the writer makes
//! their replies from the batch's results. The batcher's work per request is then only its
//! operations, whatever the client's pipeline depth.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use crossbeam_channel::Sender;
use futures_util::{SinkExt, StreamExt};
use redis_protocol::codec::Resp2;
use redis_protocol::resp2::types::BytesFrame as Frame;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::batcher::{Job, Message, Work};
use crate::command::{self, Command, Control, Group, Shape, error};
use crate::info::Counters;
use crate::record::Widths;
use crate::reply::Outcome;
use crate::request::{Limits, RequestCodec, RequestError};

/// The most requests a connection reads before handing them on.
const CHUNK: usize = 128;

/// Chunks of one connection queued for the writer. With the chunk the writer is answering and
/// the one the reader holds while it waits, a connection has at most 10 × `CHUNK` (1,280)
/// requests without replies; a client that pipelines more waits (TCP pushes back).
const CHUNKS_IN_FLIGHT: usize = 8;

/// What a connection needs of the server.
pub(crate) struct Shared {
    pub(crate) requests: Sender<Message>,
    pub(crate) widths: Widths,
    pub(crate) limits: Limits,
    pub(crate) counters: Arc<Counters>,
}

/// Replies to requests read together, in request order.
#[derive(Default)]
struct Chunk {
    parts: Vec<Part>,
    /// Operations of the data commands read since the last other request, not handed over yet.
    group: Group,
    /// The connection closes after these replies (QUIT, a protocol error).
    last: bool,
}

/// Replies in the order of their requests.
enum Part {
    /// Known at once.
    Now(Frame),
    /// Coming from the batcher, for this many requests.
    Later(oneshot::Receiver<Outcome>, usize),
}

impl Chunk {
    /// A data command whose `n` operations [`command::parse`] appended to the group.
    fn ops(&mut self, shape: Shape, n: usize) {
        self.group.requests.push((shape, n));
    }

    /// A reply known at once, after those of the requests before it.
    fn now(&mut self, frame: Frame, shared: &Shared) {
        self.submit(shared);
        self.parts.push(Part::Now(frame));
    }

    /// A question for the batcher alone (DBSIZE, INFO).
    fn control(&mut self, control: Control, shared: &Shared) {
        self.submit(shared);
        self.later(Work::Control(control), 1, shared);
    }

    /// Hands the group gathered so far to the batcher; its replies come next.
    fn submit(&mut self, shared: &Shared) {
        if !self.group.requests.is_empty() {
            let group = std::mem::take(&mut self.group);
            let n = group.requests.len();
            self.later(Work::Ops(group), n, shared);
        }
    }

    fn later(&mut self, work: Work, n: usize, shared: &Shared) {
        let (reply, later) = oneshot::channel();
        match shared.requests.send(Message::Job(Job { work, reply, arrived: Instant::now() })) {
            Ok(()) => self.parts.push(Part::Later(later, n)),
            // The batcher has stopped: each of the n requests is told so.
            Err(_) => self.parts.extend((0..n).map(|_| Part::Now(stopping()))),
        }
    }
}

/// Serves a connection until the client closes it, quits, breaks the protocol or goes silent
/// mid-reply.
pub(crate) async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let mut requests = FramedRead::new(read, RequestCodec::new(shared.limits)).ready_chunks(CHUNK);
    let (replies, pending) = mpsc::channel(CHUNKS_IN_FLIGHT);
    let writer = tokio::spawn(write_replies(write, pending, shared.widths));
    while let Some(read) = requests.next().await {
        let mut chunk = Chunk::default();
        let mut gone = false;
        // Counted once a chunk: one counter that every connection bumped per request took a
        // measurable share of the server's CPU under SETs (docs/lab/server.md, "The server's
        // front end and its batcher").
        let mut commands = 0;
        for request in read {
            let request = match request {
                Ok(request) => request,
                Err(RequestError::Protocol(why)) => {
                    Counters::add(&shared.counters.protocol_errors, 1);
                    chunk.now(error(format!("ERR Protocol error: {why}")), &shared);
                    chunk.last = true;
                    break;
                }
                // The client went away, perhaps in the middle of a request.
                Err(RequestError::Io(_)) => {
                    gone = true;
                    break;
                }
            };
            commands += 1;
            match command::parse(&request, &shared.widths, &mut chunk.group.ops) {
                Command::Ops(shape, n) => chunk.ops(shape, n),
                Command::Control(c) => {
                    // An INFO counts every command its connection sent before it, itself included.
                    Counters::add(&shared.counters.commands, std::mem::take(&mut commands));
                    chunk.control(c, &shared)
                }
                Command::Reply(frame) => chunk.now(frame, &shared),
                Command::Quit => {
                    chunk.now(Frame::SimpleString(Bytes::from_static(b"OK")), &shared);
                    chunk.last = true;
                    break;
                }
            }
        }
        Counters::add(&shared.counters.commands, commands);
        chunk.submit(&shared);
        let last = chunk.last;
        if replies.send(chunk).await.is_err() || last || gone {
            break;
        }
    }
    drop(replies);
    let _ = writer.await;
}

fn stopping() -> Frame {
    error("ERR the server is shutting down; the request was not run")
}

/// Sends replies in order, flushing whenever no further reply is ready.
async fn write_replies(write: OwnedWriteHalf, mut pending: mpsc::Receiver<Chunk>, widths: Widths) {
    let mut out = FramedWrite::new(write, Resp2::default());
    while let Some(chunk) = pending.recv().await {
        for part in chunk.parts {
            let replies = match part {
                Part::Now(frame) => vec![frame],
                Part::Later(rx, n) => match rx.await {
                    Ok(outcome) => outcome.into_replies(&widths),
                    // A batcher that stopped before running the requests dropped its sender.
                    Err(_) => vec![stopping(); n],
                },
            };
            for frame in replies {
                if out.feed(frame).await.is_err() {
                    return;
                }
            }
        }
        if (chunk.last || pending.is_empty()) && SinkExt::<Frame>::flush(&mut out).await.is_err() {
            return;
        }
        if chunk.last {
            break;
        }
    }
    let _ = SinkExt::<Frame>::flush(&mut out).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Request;

    /// Requests handed over after the batcher stopped each get their own error, so that the
    /// replies stay in step with the requests.
    #[test]
    fn a_stopped_batcher_answers_every_request_of_a_group() {
        let (requests, queue) = crossbeam_channel::unbounded();
        drop(queue);
        let widths = Widths::new(8, 8).unwrap();
        let shared =
            Shared { requests, widths, limits: Limits::default(), counters: Arc::new(Counters::default()) };
        let mut chunk = Chunk::default();
        for key in ["a", "b", "c"] {
            let request = Request::of(&[b"GET", key.as_bytes()]);
            match command::parse(&request, &widths, &mut chunk.group.ops) {
                Command::Ops(shape, n) => chunk.ops(shape, n),
                other => panic!("GET {key}: {other:?}"),
            }
        }
        chunk.submit(&shared);
        assert!(chunk.group.requests.is_empty(), "the group was handed over");
        assert_eq!(chunk.parts.len(), 3);
        assert!(chunk.parts.iter().all(|p| matches!(p, Part::Now(f) if *f == stopping())));
    }
}
