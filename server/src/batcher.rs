//! The batching pipeline (Mega-KV's idea, seed 002): requests of every connection gathered into
//! one GPU batch, by size or by a deadline, run in arrival order, and answered once the batch
//! is persisted.
//!
//! One thread owns the index. It takes the requests queued since its last batch (waiting up to
//! `wait` after the first for more, until `max_batch` operations) and runs them with the
//! results of one-by-one application in arrival order, so that a read sees every write queued
//! before it, of its own connection and of others: a batch that writes as one ordered call
//! (`GpHash::execute_ordered`), a batch of reads only through a pipeline, so that the GPU runs
//! it while the host gathers the next and answers the one before. While a batch runs, the
//! next one queues.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::Receiver;
use gphash::{Batch, BatchResult, GpHash, Pipeline};
use redis_protocol::resp2::types::BytesFrame as Frame;
use tokio::sync::oneshot;

use crate::command::{Control, Group, error};
use crate::info::{Counters, Identity, Record};
use crate::record::Widths;
use crate::reply::{Outcome, answer};

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

/// Requests of one connection and where their outcome goes: a connection hands over at once
/// the requests it has read at once, so that the batcher's work per request is only its
/// operations.
pub(crate) struct Job {
    pub(crate) work: Work,
    pub(crate) reply: oneshot::Sender<Outcome>,
    pub(crate) arrived: Instant,
}

/// What a job asks.
pub(crate) enum Work {
    Ops(Group),
    Control(Control),
}

impl Job {
    fn ops(&self) -> usize {
        match &self.work {
            Work::Ops(group) => group.ops.len(),
            Work::Control(_) => 0,
        }
    }

    fn requests(&self) -> usize {
        match &self.work {
            Work::Ops(group) => group.requests.len(),
            Work::Control(_) => 1,
        }
    }
}

/// The batcher: the index, and what answers requests.
pub(crate) struct Batcher {
    index: GpHash,
    batching: Batching,
    answers: Answers,
}

/// What turns results into replies, and what INFO reports.
struct Answers {
    widths: Widths,
    record: Record,
    counters: Arc<Counters>,
    identity: Identity,
}

/// Read-only batches in flight at once (the engine's slots: one runs while the host gathers
/// the next and answers the one before).
const READS_IN_FLIGHT: usize = 2;

impl Batcher {
    pub(crate) fn new(
        index: GpHash,
        widths: Widths,
        batching: Batching,
        counters: Arc<Counters>,
        identity: Identity,
    ) -> Self {
        let answers = Answers { widths, record: Record::new(), counters, identity };
        Batcher { index, batching, answers }
    }

    /// Serves requests until `Stop` or until every sender is gone, then closes the index
    /// cleanly.
    ///
    /// A batch of reads only runs through a pipeline ([`GpHash::pipeline`]): the host gathers
    /// the next batch and answers the one before while the GPU runs it, and reads-only
    /// batches follow each other on the GPU. Any other batch first waits for those in flight,
    /// then runs as one ordered call, so that each connection's requests apply in order (a
    /// failed write batch is never overtaken by a later one).
    pub(crate) fn run(self, requests: Receiver<Message>) -> gphash::Result<()> {
        let Batcher { index, batching, mut answers } = self;
        // While a GPU starts in the background, engine batches are capped at what it may take:
        // read again, when no pipeline holds the index, until it has taken over.
        let (mut engine_max, mut starting) = (index.max_batch(), index.gpu_starting());
        let mut reads: Option<Pipeline<'_>> = None;
        let mut flights: VecDeque<(Vec<Job>, Instant)> = VecDeque::new();
        let mut stop = false;
        loop {
            let first = if flights.is_empty() {
                match (!stop).then(|| requests.recv()) {
                    Some(Ok(Message::Job(job))) => job,
                    _ => break,
                }
            } else {
                match (!stop).then(|| requests.try_recv()) {
                    Some(Ok(Message::Job(job))) => job,
                    Some(Ok(Message::Stop)) => {
                        stop = true;
                        continue;
                    }
                    // Nothing queued: the oldest batch in flight is answered.
                    _ => {
                        let pipe = reads.as_mut().expect("batches in flight run in the pipeline");
                        answers.answer_flight(&index, pipe, &mut flights);
                        continue;
                    }
                }
            };
            let (jobs, stopped) =
                answers.record.time.timed(|t| &mut t.gather, || gather(first, &requests, &batching));
            stop |= stopped;
            let ops: usize = jobs.iter().map(Job::ops).sum();
            if starting && reads.is_none() {
                (engine_max, starting) = (index.max_batch(), index.gpu_starting());
            }
            if read_only(&jobs) && ops <= engine_max {
                let pipe = reads.get_or_insert_with(|| index.pipeline());
                let started = Instant::now();
                let time = &mut answers.record.time;
                let batch = time.timed(|t| &mut t.build, || batch_of(&answers.widths, &jobs));
                match time.timed(|t| &mut t.index, || pipe.submit(batch)) {
                    Ok(()) => flights.push_back((jobs, started)),
                    Err(e) => answers.reply(&index, jobs, Err(e), started),
                }
                if flights.len() >= READS_IN_FLIGHT {
                    answers.answer_flight(&index, reads.as_mut().expect("just used"), &mut flights);
                }
            } else {
                if let Some(mut pipe) = reads.take() {
                    while !flights.is_empty() {
                        answers.answer_flight(&index, &mut pipe, &mut flights);
                    }
                }
                answers.run_ordered(&index, jobs);
            }
        }
        drop(reads);
        // Requests after Stop are dropped: their connections answer that the server stopped.
        drop(requests);
        index.close()
    }
}

/// The jobs queued after `first`, up to the batch's size or deadline; a control job ends the
/// batch (it is answered after the jobs before it ran). Also whether `Stop` came.
fn gather(first: Job, requests: &Receiver<Message>, batching: &Batching) -> (Vec<Job>, bool) {
    let deadline = Instant::now() + batching.wait;
    let mut ops = first.ops();
    let mut jobs = vec![first];
    while ops < batching.max_batch && matches!(jobs.last().map(|j| &j.work), Some(Work::Ops(..))) {
        let next = if batching.wait.is_zero() {
            requests.try_recv().ok()
        } else {
            requests.recv_deadline(deadline).ok()
        };
        match next {
            Some(Message::Job(job)) => {
                ops += job.ops();
                jobs.push(job);
            }
            Some(Message::Stop) => return (jobs, true),
            None => break,
        }
    }
    (jobs, false)
}

/// Whether the jobs only read (and ask nothing of the whole index).
fn read_only(jobs: &[Job]) -> bool {
    jobs.iter().all(|j| matches!(&j.work, Work::Ops(group) if group.ops.read_only()))
}

/// The jobs' operations, in order, as one batch.
fn batch_of(widths: &Widths, jobs: &[Job]) -> Batch {
    let ops = jobs.iter().map(Job::ops).sum();
    let mut batch = Batch::with_capacity(widths.key_bytes(), widths.value_bytes(), ops);
    for job in jobs {
        if let Work::Ops(group) = &job.work {
            push(&mut batch, widths, group, 0..group.ops.len());
        }
    }
    batch
}

/// Adds operations `range` of `group` to `batch`.
fn push(batch: &mut Batch, widths: &Widths, group: &Group, range: std::ops::Range<usize>) {
    let (kinds, keys, values) = group.ops.columns(widths, range);
    batch.extend_from_columns(kinds, keys, values).expect("requests are encoded in the pool's widths");
}

impl Answers {
    /// Waits for the oldest batch in flight and answers its jobs.
    fn answer_flight(
        &mut self,
        index: &GpHash,
        pipe: &mut Pipeline<'_>,
        flights: &mut VecDeque<(Vec<Job>, Instant)>,
    ) {
        let (jobs, started) = flights.pop_front().expect("a batch in flight");
        let result = self.record.time.timed(|t| &mut t.index, || pipe.next());
        let result = result.expect("the pipeline has a result for each batch submitted");
        self.record.pipelined += 1;
        self.reply(index, jobs, result.map(Some), started);
    }

    /// Runs the jobs' operations as one ordered batch and answers them; a control job (only
    /// ever the last) is answered after the batch.
    fn run_ordered(&mut self, index: &GpHash, jobs: Vec<Job>) {
        let started = Instant::now();
        let time = &mut self.record.time;
        let batch = time.timed(|t| &mut t.build, || batch_of(&self.widths, &jobs));
        let result = if batch.is_empty() {
            Ok(None)
        } else {
            time.timed(|t| &mut t.index, || index.execute_ordered(&batch)).map(Some)
        };
        let requests: usize =
            jobs.iter().filter(|j| matches!(j.work, Work::Ops(..))).map(Job::requests).sum();
        match result {
            Err(e) if requests > 1 && index.stats().poisoned.is_none() => {
                // The batch took no effect (a full table, heap or disk; a damaged value an
                // ordered change would read): each request runs alone, so that only those
                // it concerns fail.
                log::warn!("a batch of {requests} requests failed ({e}); running them one at a time");
                for job in jobs {
                    self.run_alone(index, job);
                }
            }
            result => self.reply(index, jobs, result, started),
        }
    }

    /// Runs each request of the job as its own ordered batch and answers them.
    fn run_alone(&mut self, index: &GpHash, job: Job) {
        let replies = match &job.work {
            Work::Control(c) => vec![self.control(index, c)],
            Work::Ops(group) => {
                let mut first = 0;
                let mut replies = Vec::with_capacity(group.requests.len());
                for &(shape, len) in &group.requests {
                    let started = Instant::now();
                    let time = &mut self.record.time;
                    let batch = time.timed(
                        |t| &mut t.build,
                        || {
                            let mut batch = index.batch();
                            push(&mut batch, &self.widths, group, first..first + len);
                            batch
                        },
                    );
                    let result = time.timed(|t| &mut t.index, || index.execute_ordered(&batch));
                    replies.push(match result {
                        Ok(r) => {
                            self.record.batch(len, started.elapsed());
                            answer(&r, 0, len, shape, &self.widths)
                        }
                        Err(e) => {
                            self.record.failed += 1;
                            error(format!("ERR {e}"))
                        }
                    });
                    first += len;
                }
                replies
            }
        };
        self.record.requests(job.arrived.elapsed(), job.requests());
        let _ = job.reply.send(Outcome::Made(replies));
    }

    /// Answers the jobs of a batch from its result (`None`: it had no operations): each group
    /// gets its share of the results, and its connection makes the replies. Its time is the
    /// batcher's `reply` step.
    fn reply(
        &mut self,
        index: &GpHash,
        jobs: Vec<Job>,
        result: gphash::Result<Option<BatchResult>>,
        started: Instant,
    ) {
        let replying = Instant::now();
        self.answer_jobs(index, jobs, result, started);
        self.record.time.reply += replying.elapsed();
    }

    /// [`Answers::reply`], untimed.
    fn answer_jobs(
        &mut self,
        index: &GpHash,
        jobs: Vec<Job>,
        result: gphash::Result<Option<BatchResult>>,
        started: Instant,
    ) {
        let result = match result {
            Ok(r) => r.map(Arc::new),
            Err(e) => {
                self.record.failed += 1;
                let reply = error(format!("ERR {e}"));
                for job in jobs {
                    let replies = match &job.work {
                        Work::Control(c) => vec![self.control(index, c)],
                        Work::Ops(group) => vec![reply.clone(); group.requests.len()],
                    };
                    let _ = job.reply.send(Outcome::Made(replies));
                }
                return;
            }
        };
        let ran = started.elapsed();
        // The first result of each job's operations; at the end, the batch's operations.
        let mut first = 0;
        for job in jobs {
            let requests = job.requests();
            let arrived = job.arrived;
            let outcome = match job.work {
                Work::Ops(group) => {
                    let result = result.clone().expect("a batch with operations ran");
                    let len = group.ops.len();
                    let outcome = Outcome::Ran { result, first, group };
                    first += len;
                    outcome
                }
                Work::Control(c) => Outcome::Made(vec![self.control(index, &c)]),
            };
            self.record.requests(arrived.elapsed(), requests);
            // A connection that went away takes no reply; its writes stand.
            let _ = job.reply.send(outcome);
        }
        self.record.batch(first, ran);
    }

    fn control(&self, index: &GpHash, c: &Control) -> Frame {
        match c {
            Control::DbSize => Frame::Integer(index.len() as i64),
            Control::Info(sections) => {
                let text = self.record.info(sections, index, &self.counters, &self.identity);
                Frame::BulkString(Bytes::from(text))
            }
        }
    }
}
