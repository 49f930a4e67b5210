//! The batching pipeline (Mega-KV's idea, seed 002): requests of every connection gathered into
//! one GPU batch, by size or by a deadline, run in arrival order, and answered once the batch
//! is persisted.
//!
//! One thread owns the index. It takes the requests queued since its last batch (waiting up to
//! `wait` after the first for more, until `max_batch` operations), runs them as one ordered
//! call (`GpHash::execute_ordered`: results as if applied one by one, in arrival order, so a
//! read sees every write queued before it, of its own connection and of others) and then
//! answers each request. While a batch runs, the next one queues.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::Receiver;
use gphash::{BatchResult, GpHash, Status};
use redis_protocol::resp2::types::BytesFrame as Frame;
use tokio::sync::oneshot;

use crate::command::{Control, Ops, Shape, error};
use crate::info::{Counters, Identity, Record};
use crate::record::Widths;

/// How requests are gathered into batches.
#[derive(Clone, Copy, Debug)]
pub struct Batching {
    /// The most operations a batch gathers (a request is never split: one larger than this
    /// runs alone).
    pub max_batch: usize,
    /// How long the batcher waits, after the first request of a batch arrives, for more (zero:
    /// it takes what is queued, and requests arriving while a batch runs make the next).
    pub wait: Duration,
}

/// A request for the batcher.
pub(crate) enum Message {
    /// Run it and answer.
    Job(Job),
    /// Answer every request queued before this, close the index and stop.
    Stop,
}

/// A request and where its reply goes.
pub(crate) struct Job {
    pub(crate) work: Work,
    pub(crate) reply: oneshot::Sender<Frame>,
    pub(crate) arrived: Instant,
}

/// What a job asks.
pub(crate) enum Work {
    Ops(Ops, Shape),
    Control(Control),
}

impl Job {
    fn ops(&self) -> usize {
        match &self.work {
            Work::Ops(ops, _) => ops.len(),
            Work::Control(_) => 0,
        }
    }
}

/// The batcher: the index and what INFO reports.
pub(crate) struct Batcher {
    index: GpHash,
    widths: Widths,
    batching: Batching,
    record: Record,
    counters: Arc<Counters>,
    identity: Identity,
}

impl Batcher {
    pub(crate) fn new(
        index: GpHash,
        widths: Widths,
        batching: Batching,
        counters: Arc<Counters>,
        identity: Identity,
    ) -> Self {
        Batcher { index, widths, batching, record: Record::new(), counters, identity }
    }

    /// Serves requests until `Stop` or until every sender is gone, then closes the index
    /// cleanly.
    pub(crate) fn run(mut self, requests: Receiver<Message>) -> gphash::Result<()> {
        let mut stop = false;
        while !stop {
            let Ok(Message::Job(first)) = requests.recv() else { break };
            let deadline = Instant::now() + self.batching.wait;
            let mut ops = first.ops();
            let mut jobs = vec![first];
            // A control job ends the batch: it is answered after the jobs before it ran.
            while ops < self.batching.max_batch && matches!(jobs.last().map(|j| &j.work), Some(Work::Ops(..)))
            {
                let next = if self.batching.wait.is_zero() {
                    requests.try_recv().ok()
                } else {
                    requests.recv_deadline(deadline).ok()
                };
                match next {
                    Some(Message::Job(job)) => {
                        ops += job.ops();
                        jobs.push(job);
                    }
                    Some(Message::Stop) => {
                        stop = true;
                        break;
                    }
                    None => break,
                }
            }
            self.run_jobs(jobs);
        }
        // Requests after Stop are dropped: their connections answer that the server stopped.
        drop(requests);
        self.index.close()
    }

    /// Runs the jobs' operations as one ordered batch and answers them; a control job (only
    /// ever the last) is answered after the batch.
    fn run_jobs(&mut self, jobs: Vec<Job>) {
        let started = Instant::now();
        let mut batch = self.index.batch();
        let (kb, vb) = (self.widths.key_bytes(), self.widths.value_bytes());
        for job in &jobs {
            if let Work::Ops(ops, _) = &job.work {
                let mut values = ops.values.chunks_exact(vb);
                for (&kind, key) in ops.kinds.iter().zip(ops.keys.chunks_exact(kb)) {
                    let value = if kind.writes_value() { values.next() } else { None };
                    batch.push(kind, key, value).expect("requests are encoded in the pool's widths");
                }
            }
        }
        let result = if batch.is_empty() { Ok(None) } else { self.index.execute_ordered(&batch).map(Some) };
        let data_jobs = jobs.iter().filter(|j| matches!(j.work, Work::Ops(..))).count();
        match result {
            Err(e) if data_jobs > 1 && self.index.stats().poisoned.is_none() => {
                // The batch took no effect (a full table, heap or disk; a damaged value an
                // ordered change would read): each request runs alone, so that only those
                // it concerns fail.
                log::warn!("a batch of {} requests failed ({e}); running them one at a time", jobs.len());
                for job in jobs {
                    self.run_jobs(vec![job]);
                }
            }
            Err(e) => {
                self.record.failed += 1;
                let reply = error(format!("ERR {e}"));
                for job in jobs {
                    let reply = match job.work {
                        Work::Control(ref c) => self.control(c),
                        Work::Ops(..) => reply.clone(),
                    };
                    let _ = job.reply.send(reply);
                }
            }
            Ok(result) => {
                let ran = started.elapsed();
                let mut first = 0;
                for job in jobs {
                    let reply = match &job.work {
                        Work::Ops(ops, shape) => {
                            let r = result.as_ref().expect("a batch ran");
                            let reply = self.answer(r, first, ops.len(), *shape);
                            first += ops.len();
                            reply
                        }
                        Work::Control(c) => self.control(c),
                    };
                    self.record.request(job.arrived.elapsed());
                    // A connection that went away takes no reply; its writes stand.
                    let _ = job.reply.send(reply);
                }
                self.record.batch(batch.len(), ran);
            }
        }
    }

    /// The reply of a request whose operations are `len` results from `first`.
    fn answer(&self, r: &BatchResult, first: usize, len: usize, shape: Shape) -> Frame {
        let applied = |i: usize| r.statuses[i] == Status::Ok;
        let ok = || Frame::SimpleString(Bytes::from_static(b"OK"));
        match shape {
            Shape::Ok => ok(),
            Shape::OkOrNil if applied(first) => ok(),
            Shape::OkOrNil => Frame::Null,
            Shape::Flag => Frame::Integer(applied(first) as i64),
            Shape::Value => self.value(r, first),
            Shape::Count => {
                let found =
                    (first..first + len).filter(|&i| matches!(r.statuses[i], Status::Ok | Status::Corrupt));
                Frame::Integer(found.count() as i64)
            }
            Shape::Values => Frame::Array((first..first + len).map(|i| self.value(r, i)).collect()),
        }
    }

    /// What read `i` found.
    fn value(&self, r: &BatchResult, i: usize) -> Frame {
        match (r.statuses[i], r.value(i)) {
            (Status::Ok, Some(stored)) => match self.widths.value(stored) {
                Some(v) => Frame::BulkString(Bytes::copy_from_slice(v)),
                None => error(
                    "ERR the stored value holds no length this server writes (a value written by another program?)",
                ),
            },
            (Status::Corrupt, _) => {
                error("ERR the stored value fails its checksum (`gphash check` names it)")
            }
            _ => Frame::Null,
        }
    }

    fn control(&self, c: &Control) -> Frame {
        match c {
            Control::DbSize => Frame::Integer(self.index.len() as i64),
            Control::Info(sections) => {
                let text = self.record.info(sections, &self.index, &self.counters, &self.identity);
                Frame::BulkString(Bytes::from(text))
            }
        }
    }
}
