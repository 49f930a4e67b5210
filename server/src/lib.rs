//! A Redis-protocol server over a gphash index: any Redis client (redis-cli, redis-benchmark,
//! the client library of any language) reads and writes the persistent GPU hash table.
//!
//! Connections run on a tokio runtime; their requests are gathered into GPU batches by one
//! batcher thread that owns the index (see [`Batching`]): each connection is
//! answered in the order of its requests, and a write is answered `+OK` only after its batch
//! is persisted. `docs/server.md` lists the commands and how keys and values are stored.

mod batcher;
mod command;
mod connection;
mod info;
mod record;
mod reply;
mod request;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gphash::GpHash;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

pub use batcher::Batching;
use batcher::{Batcher, Message};
use connection::Shared;
use info::{Counters, Identity};
pub use record::{TooLong, Widths};
pub use request::Limits;

/// How the server listens, batches and bounds its clients.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to listen on (port 0: any free port, reported to `ready`).
    pub bind: SocketAddr,
    /// How requests are gathered into batches.
    pub batching: Batching,
    /// Connections served at once; further ones are answered an error and closed.
    pub max_clients: usize,
    /// The largest request a connection may send.
    pub limits: Limits,
    /// Threads that read, parse and answer the connections (0: a quarter of the host's cores,
    /// at least one).
    pub io_threads: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            bind: SocketAddr::from(([127, 0, 0, 1], 6379)),
            batching: Batching { max_batch: 1 << 16, wait: Duration::ZERO },
            max_clients: 10_000,
            limits: Limits::default(),
            io_threads: 0,
        }
    }
}

/// Why the server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The pool's values cannot hold a length (fewer than 2 bytes).
    #[error("the pool's values of {0} byte(s) cannot hold a value's length: serve needs at least 2")]
    ValueSize(u32),
    /// Listening failed (the address is in use, not local, ...).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    /// Closing the index failed (the next open recovers it).
    #[error(transparent)]
    Index(#[from] gphash::Error),
}

/// Serves `index` (whose pool is `pool`, for INFO) until SIGINT or SIGTERM, then answers the
/// requests already received, closes the index cleanly and returns. `ready` is told the
/// address once the server listens.
pub fn serve(
    index: GpHash,
    pool: &Path,
    options: &ServeOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    serve_until(index, pool, options, ready, stop_signal())
}

/// [`serve`] until `stop` completes instead of until a signal.
pub fn serve_until(
    index: GpHash,
    pool: &Path,
    options: &ServeOptions,
    ready: impl FnOnce(SocketAddr),
    stop: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let g = index.geometry();
    let widths = Widths::new(g.key_bytes, g.value_bytes).ok_or(ServeError::ValueSize(g.value_bytes))?;
    raise_file_limit(options.max_clients);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(match options.io_threads {
        0 => default_io_threads(),
        n => n,
    });
    let runtime = runtime.enable_all().build().map_err(ServeError::Runtime)?;
    let listener = runtime
        .block_on(TcpListener::bind(options.bind))
        .map_err(|source| ServeError::Bind { addr: options.bind, source })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind { addr: options.bind, source })?;
    let counters = Arc::new(Counters::default());
    let identity = Identity {
        port: addr.port(),
        pool: pool.display().to_string(),
        started: Instant::now(),
        io_threads: runtime.metrics().num_workers(),
    };
    let (requests, queue) = crossbeam_channel::unbounded();
    let batcher = Batcher::new(index, widths, options.batching, counters.clone(), identity);
    let batcher = std::thread::Builder::new()
        .name("gphash-batcher".into())
        .spawn(move || batcher.run(queue))
        .map_err(ServeError::Runtime)?;
    let shared = Arc::new(Shared { requests: requests.clone(), widths, limits: options.limits, counters });
    ready(addr);
    runtime.block_on(async {
        tokio::select! {
            () = accept(listener, shared, options.max_clients) => {}
            () = stop => log::info!("stopping: answering the requests received, then closing the pool"),
        }
    });
    // Requests received before this are run and answered; later ones are refused.
    let _ = requests.send(Message::Stop);
    let closed = batcher.join().expect("the batcher thread does not panic");
    runtime.shutdown_timeout(Duration::from_millis(100));
    Ok(closed?)
}

/// The connection threads a server has unless told: a quarter of the host's cores, at least
/// one. On the H200's 16-core host under redis-benchmark on the same host, 4 threads served
/// more SETs and GETs than one a core (docs/lab/server.md, "The server's batcher, step by step;
/// its connection threads"): the batcher thread, which every batch waits for, shares the cores
/// with them.
fn default_io_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / 4).max(1)
}

/// Raises the soft limit on open files to serve `max_clients` (with room for the pool, the
/// device and the runtime), as far as the hard limit allows, as Redis does.
fn raise_file_limit(max_clients: usize) {
    let want = max_clients as u64 + 128;
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write the struct given, nothing else.
    let raised = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        if limit.rlim_cur < want {
            limit.rlim_cur = want.min(limit.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
        limit.rlim_cur
    };
    if raised < want {
        log::warn!("open files are limited to {raised}: fewer than {max_clients} clients can connect");
    }
}

/// Accepts connections for ever, each served on its own task.
async fn accept(listener: TcpListener, shared: Arc<Shared>, max_clients: usize) {
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, most likely: the clients served go on.
                log::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let c = &shared.counters;
        Counters::add(&c.connections, 1);
        if c.connected.load(Ordering::Relaxed) >= max_clients as u64 {
            Counters::add(&c.rejected, 1);
            tokio::spawn(async move {
                let _ = stream.write_all(b"-ERR max number of clients reached\r\n").await;
            });
            continue;
        }
        log::debug!("client {peer} connected");
        Counters::add(&c.connected, 1);
        let shared = shared.clone();
        tokio::spawn(async move {
            connection::serve(stream, shared.clone()).await;
            shared.counters.connected.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Completes at SIGINT or SIGTERM.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            log::warn!("cannot watch SIGTERM ({e}); stopping at SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
