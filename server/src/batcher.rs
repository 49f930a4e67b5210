//! The batching pipeline (Mega-KV's idea, seed 002): requests of every connection gathered into
//! one GPU batch, by size or by a deadline, run in arrival order, and answered once the batch
//! is persisted.
//!
//! Three threads, as Mega-KV's receivers, GPU scheduler and senders are (its section 4):
//! - the **builder** takes the requests the connections hand over, in arrival order, and
//!   appends their operations to the batch being gathered, until it is taken, holds
//!   `max_batch` operations or a DBSIZE or INFO ends it;
//! - the **executor** owns the index: it takes the oldest gathered batch as soon as it is free
//!   (after `wait` from the batch's first request, where one is set) and runs it with the
//!   results of one-by-one application in arrival order, so that a read sees every write
//!   queued before it, of its own connection and of others: a batch that writes as one ordered
//!   call (`GpHash::execute_ordered`), a batch of reads only through a pipeline, so that the GPU
//!   runs it while the executor takes the next;
//! - the **replier** hands each request its share of a batch's results, which wakes its
//!   connection.
//!
//! So the executor, which every batch waits for, spends its time in the index's calls: what it
//! did besides them under SETs on the H200 (building batches, handing out results) went to the
//! other two (BENCHMARKS.md, "Three threads for the server's batches").

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
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
    /// How long the executor waits, after the first request of a batch arrives, for more (zero:
    /// it takes what is gathered as soon as it is free).
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

    /// Whether the job only reads (and asks nothing of the whole index).
    fn reads_only(&self) -> bool {
        matches!(&self.work, Work::Ops(group) if group.ops.read_only())
    }
}

/// The batcher: the index, and what answers requests.
pub(crate) struct Batcher {
    index: GpHash,
    widths: Widths,
    batching: Batching,
    record: Arc<Mutex<Record>>,
    counters: Arc<Counters>,
    identity: Identity,
}

/// Microseconds each of the batcher's threads spent on its steps since the server started
/// (INFO's `gphash_batcher_usec_*`; with the index's own stages, `gphash_index_usec_*`, where
/// the time of its calls goes).
#[derive(Debug, Default)]
pub(crate) struct BatcherTime {
    /// The builder: appending jobs' operations to the batch being gathered.
    pub(crate) build: AtomicU64,
    /// The executor: the index's calls (ordered batches with their persists, pipelined
    /// submits and waits).
    pub(crate) index: AtomicU64,
    /// The executor: handing a batch's results on, and answering DBSIZE, INFO and errors.
    pub(crate) answer: AtomicU64,
    /// The replier: handing each job its share of a batch's results.
    pub(crate) reply: AtomicU64,
}

impl BatcherTime {
    /// Runs `f`, adding its time to `step`.
    fn timed<R>(step: &AtomicU64, f: impl FnOnce() -> R) -> R {
        let started = Instant::now();
        let r = f();
        step.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        r
    }

    /// Each step with its name.
    pub(crate) fn steps(&self) -> [(&'static str, u64); 4] {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("build", load(&self.build)),
            ("index", load(&self.index)),
            ("answer", load(&self.answer)),
            ("reply", load(&self.reply)),
        ]
    }
}

/// Read-only batches in flight at once (the engine's slots: one runs while the executor takes
/// the next and hands on the one before).
const READS_IN_FLIGHT: usize = 2;

/// Jobs gathered into one batch: their operations, appended as they came.
struct Gathered {
    jobs: Vec<Job>,
    batch: Batch,
    ops: usize,
    /// Whether every job only reads.
    reads_only: bool,
    /// A control job ended it: it takes no more.
    ended: bool,
    /// When its first job reached the builder.
    first: Instant,
}

/// What the builder has gathered, oldest first (the last one may still take jobs), and
/// whether `Stop` came (the builder adds nothing after it).
#[derive(Default)]
struct Gathering {
    ready: VecDeque<Gathered>,
    stopped: bool,
}

/// The builder's and the executor's meeting point.
#[derive(Default)]
struct Handover {
    gathering: Mutex<Gathering>,
    /// Signalled when a job is added or `Stop` came.
    added: Condvar,
}

/// What the executor does next.
enum Next {
    Run(Gathered),
    /// Nothing is gathered: hand on the oldest batch in flight.
    AnswerFlight,
    Stop,
}

impl Batcher {
    pub(crate) fn new(
        index: GpHash,
        widths: Widths,
        batching: Batching,
        counters: Arc<Counters>,
        identity: Identity,
    ) -> Self {
        let record = Arc::new(Mutex::new(Record::new()));
        Batcher { index, widths, batching, record, counters, identity }
    }

    /// Serves requests until `Stop` or until every sender is gone, then closes the index
    /// cleanly. The builder and the replier run on threads of their own for as long.
    pub(crate) fn run(self, requests: Receiver<Message>) -> gphash::Result<()> {
        let Batcher { index, widths, batching, record, counters, identity } = self;
        let time = BatcherTime::default();
        let handover = Handover::default();
        let (handoffs, replier_queue) = crossbeam_channel::unbounded::<Handoff>();
        // Dropped when the executor returns or unwinds: the builder then stops waiting.
        let (executor_alive, executor_gone) = crossbeam_channel::bounded::<()>(0);
        std::thread::scope(|s| {
            let builder = std::thread::Builder::new().name("gphash-builder".into());
            let (handover, time_b) = (&handover, &time);
            builder
                .spawn_scoped(s, move || build(requests, executor_gone, handover, &widths, batching, time_b))
                .expect("a thread for the builder");
            let replier = std::thread::Builder::new().name("gphash-replier".into());
            let (record_r, time_r) = (&record, &time);
            replier
                .spawn_scoped(s, move || {
                    for h in replier_queue {
                        BatcherTime::timed(&time_r.reply, || h.hand_out(record_r));
                    }
                })
                .expect("a thread for the replier");
            let mut executor =
                Executor { index: &index, widths, record: &record, counters, identity, time: &time, handoffs };
            executor.run(handover, batching);
            // The replier ends once the executor's handoffs are gone.
            drop(executor);
            drop(executor_alive);
        });
        index.close()
    }
}

/// The builder's loop: appends each job to the batch being gathered, until `Stop`, every
/// sender gone, or the executor gone. Requests after `Stop` are dropped with the receiver:
/// their connections answer that the server stopped.
fn build(
    requests: Receiver<Message>,
    executor_gone: Receiver<()>,
    handover: &Handover,
    widths: &Widths,
    batching: Batching,
    time: &BatcherTime,
) {
    loop {
        let message = crossbeam_channel::select! {
            recv(requests) -> m => m.ok(),
            recv(executor_gone) -> _ => return,
        };
        let Some(Message::Job(job)) = message else {
            handover.gathering.lock().expect("the builder and executor do not panic").stopped = true;
            handover.added.notify_one();
            return;
        };
        BatcherTime::timed(&time.build, || {
            let mut gathering = handover.gathering.lock().expect("the builder and executor do not panic");
            gathering.add(job, widths, batching.max_batch);
        });
        handover.added.notify_one();
    }
}

impl Gathering {
    /// Appends `job` to the last batch if it takes more (not ended by a control job, under
    /// `max_batch` operations), or starts a new one. A control job ends its batch: it is
    /// answered after the jobs before it ran.
    fn add(&mut self, job: Job, widths: &Widths, max_batch: usize) {
        let open = self.ready.back_mut().filter(|g| !g.ended && g.ops < max_batch);
        let gathered = match open {
            Some(g) => g,
            None => {
                self.ready.push_back(Gathered {
                    jobs: vec![],
                    batch: Batch::new(widths.key_bytes(), widths.value_bytes()),
                    ops: 0,
                    reads_only: true,
                    ended: false,
                    first: job.arrived,
                });
                self.ready.back_mut().expect("just pushed")
            }
        };
        if let Work::Ops(group) = &job.work {
            push(&mut gathered.batch, widths, group, 0..group.ops.len());
        }
        gathered.ops += job.ops();
        gathered.reads_only &= job.reads_only();
        gathered.ended |= matches!(job.work, Work::Control(_));
        gathered.jobs.push(job);
    }
}

/// Adds operations `range` of `group` to `batch`.
fn push(batch: &mut Batch, widths: &Widths, group: &Group, range: std::ops::Range<usize>) {
    let (kinds, keys, values) = group.ops.columns(widths, range);
    batch.extend_from_columns(kinds, keys, values).expect("requests are encoded in the pool's widths");
}

/// The thread that owns the index.
struct Executor<'a> {
    index: &'a GpHash,
    widths: Widths,
    record: &'a Mutex<Record>,
    counters: Arc<Counters>,
    identity: Identity,
    time: &'a BatcherTime,
    handoffs: Sender<Handoff>,
}

impl Executor<'_> {
    /// Runs the gathered batches until `Stop`, then what was gathered before it.
    ///
    /// A batch of reads only runs through a pipeline ([`GpHash::pipeline`]): the executor takes
    /// the next batch and hands on the one before while the GPU runs it, and reads-only
    /// batches follow each other on the GPU. Any other batch first waits for those in flight,
    /// then runs as one ordered call, so that each connection's requests apply in order (a
    /// failed write batch is never overtaken by a later one).
    fn run(&mut self, handover: &Handover, batching: Batching) {
        let index = self.index;
        // While a GPU starts in the background, engine batches are capped at what it may take:
        // read again, when no pipeline holds the index, until it has taken over.
        let (mut engine_max, mut starting) = (index.max_batch(), index.gpu_starting());
        let mut reads: Option<Pipeline<'_>> = None;
        let mut flights: VecDeque<(Vec<Job>, Instant)> = VecDeque::new();
        loop {
            let g = match next(handover, batching, !flights.is_empty()) {
                Next::Run(g) => g,
                Next::AnswerFlight => {
                    let pipe = reads.as_mut().expect("batches in flight run in the pipeline");
                    self.answer_flight(pipe, &mut flights);
                    continue;
                }
                Next::Stop => break,
            };
            if starting && reads.is_none() {
                (engine_max, starting) = (index.max_batch(), index.gpu_starting());
            }
            let Gathered { jobs, batch, ops, reads_only, .. } = g;
            if reads_only && ops <= engine_max {
                let pipe = reads.get_or_insert_with(|| index.pipeline());
                let started = Instant::now();
                match BatcherTime::timed(&self.time.index, || pipe.submit(batch)) {
                    Ok(()) => flights.push_back((jobs, started)),
                    Err(e) => self.reply(jobs, Err(e), started),
                }
                if flights.len() >= READS_IN_FLIGHT {
                    self.answer_flight(reads.as_mut().expect("just used"), &mut flights);
                }
            } else {
                if let Some(mut pipe) = reads.take() {
                    while !flights.is_empty() {
                        self.answer_flight(&mut pipe, &mut flights);
                    }
                }
                self.run_ordered(jobs, batch);
            }
        }
        if let Some(mut pipe) = reads.take() {
            while !flights.is_empty() {
                self.answer_flight(&mut pipe, &mut flights);
            }
        }
    }

    /// Waits for the oldest batch in flight and hands on its results.
    fn answer_flight(&mut self, pipe: &mut Pipeline<'_>, flights: &mut VecDeque<(Vec<Job>, Instant)>) {
        let (jobs, started) = flights.pop_front().expect("a batch in flight");
        let result = BatcherTime::timed(&self.time.index, || pipe.next());
        let result = result.expect("the pipeline has a result for each batch submitted");
        self.lock_record().pipelined += 1;
        self.reply(jobs, result.map(Some), started);
    }

    /// Runs the jobs' operations, `batch`, as one ordered batch and answers them; a control job
    /// (only ever the last) is answered after the batch.
    fn run_ordered(&mut self, jobs: Vec<Job>, batch: Batch) {
        let started = Instant::now();
        let index = self.index;
        let result = if batch.is_empty() {
            Ok(None)
        } else {
            BatcherTime::timed(&self.time.index, || index.execute_ordered(&batch)).map(Some)
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
                    self.run_alone(job);
                }
            }
            result => self.reply(jobs, result, started),
        }
    }

    /// Runs each request of the job as its own ordered batch and answers them.
    fn run_alone(&mut self, job: Job) {
        let index = self.index;
        let replies = match &job.work {
            Work::Control(c) => vec![self.control(c)],
            Work::Ops(group) => {
                let mut first = 0;
                let mut replies = Vec::with_capacity(group.requests.len());
                for &(shape, len) in &group.requests {
                    let started = Instant::now();
                    let mut batch = index.batch();
                    push(&mut batch, &self.widths, group, first..first + len);
                    let result = BatcherTime::timed(&self.time.index, || index.execute_ordered(&batch));
                    replies.push(match result {
                        Ok(r) => {
                            self.lock_record().batch(len, started.elapsed());
                            answer(&r, 0, len, shape, &self.widths)
                        }
                        Err(e) => {
                            self.lock_record().failed += 1;
                            error(format!("ERR {e}"))
                        }
                    });
                    first += len;
                }
                replies
            }
        };
        self.lock_record().requests(job.arrived.elapsed(), job.requests());
        let _ = job.reply.send(Outcome::Made(replies));
    }

    /// Answers the jobs of a batch from its result (`None`: it had no operations). A batch of
    /// operations alone goes to the replier; one with a control job (DBSIZE, INFO: the index's
    /// state after the batch) or a failure is answered here.
    fn reply(&mut self, jobs: Vec<Job>, result: gphash::Result<Option<BatchResult>>, started: Instant) {
        let answering = Instant::now();
        let ran = started.elapsed();
        match result {
            Ok(Some(result)) if jobs.iter().all(|j| matches!(j.work, Work::Ops(_))) => {
                let handoff = Handoff { jobs, result: Some(Arc::new(result)), ran };
                self.handoffs.send(handoff).expect("the replier runs as long as the executor");
            }
            Ok(result) => {
                let handoff = Handoff { jobs, result: result.map(Arc::new), ran };
                handoff.note(&mut self.lock_record());
                handoff.send(|c| self.control(c));
            }
            Err(e) => {
                self.lock_record().failed += 1;
                let reply = error(format!("ERR {e}"));
                for job in jobs {
                    let replies = match &job.work {
                        Work::Control(c) => vec![self.control(c)],
                        Work::Ops(group) => vec![reply.clone(); group.requests.len()],
                    };
                    let _ = job.reply.send(Outcome::Made(replies));
                }
            }
        }
        self.time.answer.fetch_add(answering.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    fn lock_record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().expect("the batcher's threads do not panic")
    }

    fn control(&self, c: &Control) -> Frame {
        match c {
            Control::DbSize => Frame::Integer(self.index.len() as i64),
            Control::Info(sections) => {
                let record = self.lock_record();
                let text = record.info(sections, self.index, &self.counters, &self.identity, self.time);
                Frame::BulkString(Bytes::from(text))
            }
        }
    }
}

/// The executor's next step: the oldest gathered batch once it is due (at once, or `wait`
/// after its first request unless it is full or ended), else, with batches in flight, the
/// oldest of them, else a wait for the builder.
fn next(handover: &Handover, batching: Batching, in_flight: bool) -> Next {
    let mut gathering = handover.gathering.lock().expect("the builder and executor do not panic");
    loop {
        let due = match gathering.ready.front() {
            Some(g) if batching.wait.is_zero() || g.ended || g.ops >= batching.max_batch => None,
            Some(g) => Some(g.first + batching.wait).filter(|&t| t > Instant::now() && !gathering.stopped),
            None if gathering.stopped => return Next::Stop,
            None if in_flight => return Next::AnswerFlight,
            None => {
                gathering = handover.added.wait(gathering).expect("the builder and executor do not panic");
                continue;
            }
        };
        match due {
            None => return Next::Run(gathering.ready.pop_front().expect("a front batch")),
            Some(t) => {
                let left = t.saturating_duration_since(Instant::now());
                gathering = handover.added.wait_timeout(gathering, left).expect("no panics").0;
            }
        }
    }
}

/// A batch's results for the replier to hand out.
struct Handoff {
    jobs: Vec<Job>,
    /// `None`: the batch had no operations.
    result: Option<Arc<BatchResult>>,
    /// How long the batch took to run.
    ran: Duration,
}

impl Handoff {
    /// Records the batch and hands each job (operations only) its share of the results.
    fn hand_out(self, record: &Mutex<Record>) {
        self.note(&mut record.lock().expect("the batcher's threads do not panic"));
        self.send(|_| unreachable!("a batch with a control job is answered by the executor"));
    }

    /// Records the batch and its requests: before any reply goes, so that an INFO sent after
    /// a reply counts them.
    fn note(&self, record: &mut Record) {
        let ops: usize = self.jobs.iter().map(Job::ops).sum();
        record.batch(ops, self.ran);
        for job in &self.jobs {
            record.requests(job.arrived.elapsed(), job.requests());
        }
    }

    /// Hands each job its share of the results, and a control job `control`'s reply.
    fn send(self, control: impl Fn(&Control) -> Frame) {
        // The first result of each job's operations.
        let mut first = 0;
        for job in self.jobs {
            let outcome = match job.work {
                Work::Ops(group) => {
                    let len = group.ops.len();
                    let result = self.result.clone().expect("a batch with operations ran");
                    let outcome = Outcome::Ran { result, first, group };
                    first += len;
                    outcome
                }
                Work::Control(c) => Outcome::Made(vec![control(&c)]),
            };
            // A connection that went away takes no reply; its writes stand.
            let _ = job.reply.send(outcome);
        }
    }
}
