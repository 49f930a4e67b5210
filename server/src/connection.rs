//! One client connection: a reader that frames requests and hands them on, and a writer that
//! sends the replies in the order of the requests.

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
use crate::command::{self, Command, error};
use crate::info::Counters;
use crate::record::Widths;
use crate::request::{Limits, RequestCodec, RequestError};

/// Requests of one connection whose replies have not been sent: a client that pipelines more
/// waits (TCP pushes back) until replies go out.
const IN_FLIGHT: usize = 1024;

/// What a connection needs of the server.
pub(crate) struct Shared {
    pub(crate) requests: Sender<Message>,
    pub(crate) widths: Widths,
    pub(crate) limits: Limits,
    pub(crate) counters: Arc<Counters>,
}

/// A reply, in the order of its request.
enum Pending {
    /// Known at once.
    Now(Frame),
    /// Coming from the batcher.
    Later(oneshot::Receiver<Frame>),
    /// Known at once; the connection closes after it.
    Last(Frame),
}

/// Serves a connection until the client closes it, quits, breaks the protocol or goes silent
/// mid-reply.
pub(crate) async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let mut requests = FramedRead::new(read, RequestCodec::new(shared.limits));
    let (replies, pending) = mpsc::channel(IN_FLIGHT);
    let writer = tokio::spawn(write_replies(write, pending));
    while let Some(request) = requests.next().await {
        let reply = match request {
            Ok(args) => {
                Counters::add(&shared.counters.commands, 1);
                dispatch(&args, &shared)
            }
            Err(RequestError::Protocol(why)) => {
                Counters::add(&shared.counters.protocol_errors, 1);
                Pending::Last(error(format!("ERR Protocol error: {why}")))
            }
            // The client went away, perhaps in the middle of a request.
            Err(RequestError::Io(_)) => break,
        };
        let last = matches!(reply, Pending::Last(_));
        if replies.send(reply).await.is_err() || last {
            break;
        }
    }
    drop(replies);
    let _ = writer.await;
}

/// The reply to a request: at once, or from the batcher.
fn dispatch(args: &[Bytes], shared: &Shared) -> Pending {
    let work = match command::parse(args, &shared.widths) {
        Command::Reply(frame) => return Pending::Now(frame),
        Command::Quit => return Pending::Last(Frame::SimpleString(Bytes::from_static(b"OK"))),
        Command::Ops(ops, shape) => Work::Ops(ops, shape),
        Command::Control(c) => Work::Control(c),
    };
    let (reply, later) = oneshot::channel();
    match shared.requests.send(Message::Job(Job { work, reply, arrived: Instant::now() })) {
        Ok(()) => Pending::Later(later),
        Err(_) => Pending::Now(stopping()),
    }
}

fn stopping() -> Frame {
    error("ERR the server is shutting down; the request was not run")
}

/// Sends replies in order, flushing whenever no further reply is ready.
async fn write_replies(write: OwnedWriteHalf, mut pending: mpsc::Receiver<Pending>) {
    let mut out = FramedWrite::new(write, Resp2::default());
    while let Some(reply) = pending.recv().await {
        let (frame, last) = match reply {
            Pending::Now(frame) => (frame, false),
            // A batcher that stopped before running the request dropped its sender.
            Pending::Later(rx) => (rx.await.unwrap_or_else(|_| stopping()), false),
            Pending::Last(frame) => (frame, true),
        };
        if out.feed(frame).await.is_err() {
            return;
        }
        if (last || pending.is_empty()) && SinkExt::<Frame>::flush(&mut out).await.is_err() {
            return;
        }
        if last {
            break;
        }
    }
    let _ = SinkExt::<Frame>::flush(&mut out).await;
}
