//! `gphash serve`: the Redis-protocol server over a pool.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use gphash::{Config, GpHash, Layout, Options};
use gphash_server::{Batching, ServeError, ServeOptions, Widths};

use crate::{Error, announce_cpu_fallback};

/// Arguments of `gphash serve`.
#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Pool path: opened (and recovered) if it exists, else created with the widths below.
    pool: PathBuf,
    /// Address and port to listen on (port 0: any free port; the one chosen is printed).
    #[arg(long, default_value = "127.0.0.1:6379")]
    bind: SocketAddr,
    /// The most operations one GPU batch gathers from the clients' requests.
    #[arg(long, default_value_t = ServeOptions::default().batching.max_batch)]
    max_batch: usize,
    /// Microseconds the batcher waits, after a batch's first request, for more (0: it takes
    /// what is queued; requests arriving while a batch runs make the next one).
    #[arg(long, default_value_t = 0)]
    batch_wait_us: u64,
    /// Connections served at once.
    #[arg(long, default_value_t = ServeOptions::default().max_clients)]
    max_clients: usize,
    /// Threads that read, parse and answer the connections (0: a quarter of the cores, at
    /// least one, leaving cores to the batcher and to clients on the same host).
    #[arg(long, default_value_t = ServeOptions::default().io_threads)]
    io_threads: usize,
    /// Key width of a new pool: keys of up to this minus 1 bytes.
    #[arg(long, default_value_t = 32)]
    key_bytes: u32,
    /// Value size of a new pool: values of up to this minus 2 bytes.
    #[arg(long, default_value_t = 64)]
    value_bytes: u32,
    /// Layout of a new pool.
    #[arg(long, default_value = "2L-2H-8S")]
    layout: Layout,
    /// Keys a new pool is sized for at first (it grows, but each growth pauses the clients).
    #[arg(long, default_value_t = 1 << 20)]
    capacity: u64,
    /// Largest size the pool file may grow to, in bytes.
    #[arg(long)]
    max_bytes: Option<u64>,
}

/// Opens or creates the pool and serves it until SIGINT or SIGTERM.
pub(crate) fn run(args: &ServeArgs, options: &Options) -> Result<(), Error> {
    if args.max_batch == 0 {
        return Err("--max-batch must be at least 1".into());
    }
    let (index, how) = if args.pool.exists() {
        let index = GpHash::open(&args.pool, options)?;
        let how = format!("opened ({})", index.stats().recovery);
        (index, how)
    } else {
        let config = Config {
            key_bytes: args.key_bytes,
            value_bytes: args.value_bytes,
            layout: args.layout,
            capacity: args.capacity,
            max_bytes: args.max_bytes,
            ..Config::default()
        };
        (GpHash::create(Some(&args.pool), &config, options)?, "created".to_string())
    };
    announce_cpu_fallback(&index, options);
    let stats = index.stats();
    let widths =
        Widths::new(stats.key_bytes, stats.value_bytes).ok_or(ServeError::ValueSize(stats.value_bytes))?;
    println!(
        "gphash serve: {} {how}: {} keys, keys up to {} bytes, values up to {} bytes; {}",
        args.pool.display(),
        stats.items,
        widths.max_key(),
        widths.max_value(),
        stats.mode
    );
    let serve = ServeOptions {
        bind: args.bind,
        batching: Batching { max_batch: args.max_batch, wait: Duration::from_micros(args.batch_wait_us) },
        max_clients: args.max_clients,
        io_threads: args.io_threads,
        ..ServeOptions::default()
    };
    gphash_server::serve(index, &args.pool, &serve, |addr| {
        // Scripts and tests wait for this line.
        println!("listening on {addr}");
        let _ = std::io::stdout().flush();
    })?;
    println!("gphash serve: stopped; {} closed cleanly", args.pool.display());
    Ok(())
}
