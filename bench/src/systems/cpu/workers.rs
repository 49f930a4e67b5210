//! A set of parked host threads that run one batch phase at a time.
//!
//! Spawning threads for every phase (`std::thread::scope`) costs tens of microseconds per
//! thread, more than the work of a 4096-operation batch spread over 16 threads; these threads
//! are spawned once and handed a task per phase. Waking a sleeping thread costs tens of
//! microseconds too, so an idle thread (and a caller waiting for its tasks) spins, yielding
//! its core to any other runnable thread, for up to [`SPIN`] before it sleeps: back-to-back
//! phases and batches find the threads awake. [`Workers::run`] is scoped like
//! `std::thread::scope`: it returns only when every task it handed out has finished, so tasks
//! may borrow from the caller's stack.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle thread spins before it sleeps.
pub(super) const SPIN: Duration = Duration::from_millis(1);

/// Spins until `done()` or `budget` has passed; returns `done()`. Pauses for the first
/// iterations, then yields, so that spinning threads never starve runnable ones.
pub(super) fn spin_until(done: impl Fn() -> bool, budget: Duration) -> bool {
    let start = Instant::now();
    let mut i = 0u32;
    while !done() {
        if i < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
            if i.is_multiple_of(16) && start.elapsed() > budget {
                return done();
            }
        }
        i = i.wrapping_add(1);
    }
    true
}

/// A barrier for the tasks of one [`Workers::run`] (used once; spins and yields).
pub(super) struct SpinBarrier {
    arrived: AtomicUsize,
    parties: usize,
}

impl SpinBarrier {
    /// A barrier that `parties` tasks pass together.
    pub(super) fn new(parties: usize) -> Self {
        SpinBarrier { arrived: AtomicUsize::new(0), parties }
    }

    /// Waits until all parties have arrived. Every party runs at once (one task per thread),
    /// so waiting by yielding is enough.
    pub(super) fn wait(&self) {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        while !spin_until(|| self.arrived.load(Ordering::Acquire) >= self.parties, Duration::from_secs(3600))
        {
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A task with its borrows erased; see the safety argument in [`Workers::run`].
type Task = Box<dyn FnOnce() + Send + 'static>;

/// What a thread is handed.
enum Msg {
    Run(Task),
    Exit,
}

/// One thread's mailbox.
#[derive(Default)]
struct Mailbox {
    msg: Mutex<Option<Msg>>,
    full: AtomicBool,
    wake: Condvar,
}

impl Mailbox {
    fn put(&self, m: Msg) {
        let mut g = lock(&self.msg);
        debug_assert!(g.is_none(), "one task at a time");
        *g = Some(m);
        self.full.store(true, Ordering::Release);
        drop(g);
        self.wake.notify_one();
    }

    fn take(&self) -> Msg {
        spin_until(|| self.full.load(Ordering::Acquire), SPIN);
        let mut g = lock(&self.msg);
        loop {
            if let Some(m) = g.take() {
                self.full.store(false, Ordering::Relaxed);
                return m;
            }
            g = self.wake.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Tasks handed out and not finished yet. Shared through an `Arc`, so that a task may still
/// touch it after the count it brought to zero has let the caller return.
#[derive(Default)]
struct Pending {
    count: AtomicUsize,
    lock: Mutex<()>,
    zero: Condvar,
}

impl Pending {
    fn add(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    fn done(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _g = lock(&self.lock);
            self.zero.notify_all();
        }
    }

    fn wait(&self) {
        if spin_until(|| self.count.load(Ordering::Acquire) == 0, SPIN) {
            return;
        }
        let mut g = lock(&self.lock);
        while self.count.load(Ordering::Acquire) > 0 {
            g = self.zero.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Waits for every pending task when dropped, also while unwinding.
struct WaitAll<'a>(&'a Pending);

impl Drop for WaitAll<'_> {
    fn drop(&mut self) {
        self.0.wait();
    }
}

/// Parked threads; the caller of [`Workers::run`] is worker 0.
pub(crate) struct Workers {
    boxes: Vec<Arc<Mailbox>>,
    handles: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Workers({} + caller)", self.handles.len())
    }
}

impl Workers {
    /// `threads - 1` parked threads (the caller is the last one).
    pub(super) fn new(threads: usize) -> Workers {
        let (boxes, handles) = (1..threads.max(1))
            .map(|i| {
                let mailbox = Arc::new(Mailbox::default());
                let mine = mailbox.clone();
                let handle = std::thread::Builder::new()
                    .name(format!("gphash-cpu-{i}"))
                    .spawn(move || {
                        while let Msg::Run(task) = mine.take() {
                            task();
                        }
                    })
                    .expect("spawning a host worker thread");
                (mailbox, handle)
            })
            .unzip();
        Workers { boxes, handles }
    }

    /// Threads, the caller included.
    pub(super) fn threads(&self) -> usize {
        self.boxes.len() + 1
    }

    /// Runs `f(i, group_i)` for every group, group 0 on the calling thread, the others on the
    /// parked threads (at most [`Workers::threads`] groups). Returns the results in group
    /// order once all have finished; a panic of any task is resumed here after that.
    pub(super) fn run<G: Send, T: Send>(&self, groups: Vec<G>, f: impl Fn(usize, G) -> T + Sync) -> Vec<T> {
        assert!(groups.len() <= self.threads(), "{} groups for {} threads", groups.len(), self.threads());
        let results: Vec<Mutex<Option<std::thread::Result<T>>>> =
            groups.iter().map(|_| Mutex::new(None)).collect();
        let pending = Arc::new(Pending::default());
        let mut groups = groups.into_iter();
        let Some(first) = groups.next() else { return vec![] };
        let first_result = {
            let wait = WaitAll(&pending);
            let (f, results) = (&f, &results);
            for (i, g) in groups.enumerate() {
                let done = pending.clone();
                let task: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
                    let r = catch_unwind(AssertUnwindSafe(|| f(i + 1, g)));
                    *lock(&results[i + 1]) = Some(r);
                    done.done();
                });
                // SAFETY: the task borrows `f` and `results` (and owns its group and a
                // reference to `pending`); both outlive the task's use of them: `wait`
                // (created before any task is handed out) blocks this frame, also when it
                // unwinds, until every handed-out task has called `pending.done()`, and the
                // task touches nothing borrowed after that call. Handing out cannot fail.
                let task: Task = unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + '_>, Task>(task) };
                pending.add();
                self.boxes[i].put(Msg::Run(task));
            }
            let r = catch_unwind(AssertUnwindSafe(|| f(0, first)));
            drop(wait);
            r
        };
        let mut out = Vec::with_capacity(results.len());
        out.push(first_result);
        out.extend(
            results.into_iter().skip(1).map(|r| {
                r.into_inner().unwrap_or_else(PoisonError::into_inner).expect("every task finished")
            }),
        );
        out.into_iter().map(|r| r.unwrap_or_else(|p| resume_unwind(p))).collect()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for b in &self.boxes {
            b.put(Msg::Exit);
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_group_with_borrows() {
        let w = Workers::new(4);
        assert_eq!(w.threads(), 4);
        let base = [10, 20, 30, 40];
        let mut cells = vec![0u32; 4];
        let groups: Vec<(usize, &mut u32)> = cells.iter_mut().enumerate().collect();
        let out = w.run(groups, |i, (j, c)| {
            assert_eq!(i, j);
            *c = base[i] + 1;
            i * 2
        });
        assert_eq!(out, vec![0, 2, 4, 6]);
        assert_eq!(cells, vec![11, 21, 31, 41]);
        assert_eq!(w.run(vec![5], |_, g: i32| g), vec![5]);
        assert!(w.run(Vec::<u8>::new(), |_, g| g).is_empty());
    }

    #[test]
    fn a_panicking_task_is_resumed_after_all_finish() {
        let w = Workers::new(3);
        let done = std::sync::atomic::AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            w.run(vec![0, 1, 2], |i, _| {
                if i == 1 {
                    panic!("task 1");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
        }));
        assert!(r.is_err());
        assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), 2);
        // The threads survive.
        assert_eq!(w.run(vec![1, 2, 3], |_, g| g * 2), vec![2, 4, 6]);
    }
}
