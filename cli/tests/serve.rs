//! `gphash serve` driven by real Redis clients: the `redis` crate, redis-cli and
//! redis-benchmark (Debian's redis-tools, which `.ci/run` installs).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::{Connection, RedisResult, Value};

/// A `gphash serve` process on a free port.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// Starts the server on `pool` (created, if absent, with 16-byte keys and values unless
    /// `extra` gives widths), waiting for its "listening on" line.
    fn start(pool: &Path, extra: &[&str]) -> Server {
        let executor = if common::gpu().is_some() { "gpu" } else { "cpu" };
        let mut child = Command::new(env!("CARGO_BIN_EXE_gphash"))
            .args(["serve", pool.to_str().unwrap(), "--bind", "127.0.0.1:0", "--executor", executor])
            .args(if extra.contains(&"--key-bytes") {
                &[][..]
            } else {
                &["--key-bytes", "16", "--value-bytes", "16"]
            })
            .args(["--capacity", "4096"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = loop {
            let line = lines.next().expect("the server printed its address before exiting").unwrap();
            eprintln!("server: {line}");
            if let Some(addr) = line.strip_prefix("listening on ") {
                break addr.rsplit(':').next().unwrap().parse().unwrap();
            }
        };
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| eprintln!("server: {l}")));
        Server { child, port }
    }

    fn client(&self) -> Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap().get_connection().unwrap()
    }

    fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// SIGTERM, then the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        signal(self.child.id(), libc::SIGTERM);
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on our own child's pid has no memory effects.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

fn pool(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("served.pool")
}

fn cmd(con: &mut Connection, args: &[&[u8]]) -> RedisResult<Value> {
    let mut c = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
}

fn bulk(b: &[u8]) -> Value {
    Value::BulkString(b.to_vec())
}

fn okay() -> Value {
    Value::Okay
}

fn err_text(r: RedisResult<Value>) -> String {
    let e = r.expect_err("an error reply");
    format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
}

#[test]
fn every_command_answers_as_redis_does() {
    let dir = common::pool_dir();
    let server = Server::start(&pool(&dir), &[]);
    let mut c = server.client();
    let mut q = |args: &[&[u8]]| cmd(&mut c, args);
    assert_eq!(q(&[b"PING"]).unwrap(), Value::SimpleString("PONG".into()));
    assert_eq!(q(&[b"ping", b"hi"]).unwrap(), bulk(b"hi"));
    assert_eq!(q(&[b"ECHO", b"\0\r\n"]).unwrap(), bulk(b"\0\r\n"));
    assert_eq!(q(&[b"SELECT", b"0"]).unwrap(), okay());
    assert!(err_text(q(&[b"SELECT", b"1"])).contains("out of range"));
    // Keys and values are byte strings stored exactly, up to 15 and 14 bytes here.
    let key15 = [0xffu8; 15];
    let value14 = *b"\0value\r\n\0\x01\x02\xff\0\0";
    assert_eq!(q(&[b"SET", &key15, &value14]).unwrap(), okay());
    assert_eq!(q(&[b"GET", &key15]).unwrap(), bulk(&value14));
    assert_eq!(q(&[b"SET", b"", b""]).unwrap(), okay());
    assert_eq!(q(&[b"GET", b""]).unwrap(), bulk(b""));
    assert_eq!(q(&[b"GET", b"\0"]).unwrap(), Value::Nil, "the empty key and a zero byte differ");
    let long_key = err_text(q(&[b"SET", &[1; 16], b"v"]));
    assert!(long_key.contains("key of 16 bytes is longer than the 15 bytes"), "{long_key}");
    let long_value = err_text(q(&[b"SET", b"k", &[1; 15]]));
    assert!(long_value.contains("value of 15 bytes is longer than the 14 bytes"), "{long_value}");
    assert_eq!(q(&[b"GET", b"k"]).unwrap(), Value::Nil, "a refused SET wrote nothing");
    // SET's options.
    assert_eq!(q(&[b"SET", b"a", b"1", b"NX"]).unwrap(), okay());
    assert_eq!(q(&[b"SET", b"a", b"2", b"nx"]).unwrap(), Value::Nil);
    assert_eq!(q(&[b"SET", b"a", b"3", b"XX"]).unwrap(), okay());
    assert_eq!(q(&[b"SET", b"b", b"3", b"XX"]).unwrap(), Value::Nil);
    assert_eq!(q(&[b"SET", b"a", b"4", b"GET"]).unwrap(), bulk(b"3"));
    assert!(err_text(q(&[b"SET", b"a", b"5", b"EX", b"10"])).contains("EX, PX"));
    assert!(err_text(q(&[b"SET", b"a", b"5", b"NX", b"XX"])).contains("syntax error"));
    assert_eq!(q(&[b"GET", b"a"]).unwrap(), bulk(b"4"));
    assert_eq!(q(&[b"SETNX", b"a", b"6"]).unwrap(), Value::Int(0));
    assert_eq!(q(&[b"SETNX", b"c", b"6"]).unwrap(), Value::Int(1));
    assert_eq!(q(&[b"GETDEL", b"c"]).unwrap(), bulk(b"6"));
    assert_eq!(q(&[b"GETDEL", b"c"]).unwrap(), Value::Nil);
    assert_eq!(q(&[b"MSET", b"x", b"1", b"y", b"2", b"x", b"3"]).unwrap(), okay());
    let mget = q(&[b"MGET", b"x", b"y", b"z"]).unwrap();
    assert_eq!(mget, Value::Array(vec![bulk(b"3"), bulk(b"2"), Value::Nil]), "MSET applies in order");
    assert_eq!(q(&[b"EXISTS", b"x", b"x", b"z"]).unwrap(), Value::Int(2));
    assert_eq!(q(&[b"DBSIZE"]).unwrap(), Value::Int(5), "the 15-byte key, '', a, x, y");
    assert_eq!(q(&[b"DEL", b"x", b"y", b"z", b"x"]).unwrap(), Value::Int(2));
    assert_eq!(q(&[b"DBSIZE"]).unwrap(), Value::Int(3));
    assert!(err_text(q(&[b"GET"])).contains("wrong number of arguments for 'get'"));
    assert!(err_text(q(&[b"MSET", b"a"])).contains("wrong number of arguments for 'mset'"));
    assert!(err_text(q(&[b"HSET", b"h", b"f", b"v"])).contains("unknown command 'HSET'"));
    assert!(err_text(q(&[b"CONFIG", b"SET", b"save", b""])).contains("only CONFIG GET"));
    let appendonly = q(&[b"CONFIG", b"GET", b"appendonly"]).unwrap();
    assert_eq!(appendonly, Value::Array(vec![bulk(b"appendonly"), bulk(b"no")]));
    assert_eq!(q(&[b"COMMAND", b"DOCS"]).unwrap(), Value::Array(vec![]));
    let info =
        |section: &[u8], q: &mut dyn FnMut(&[&[u8]]) -> RedisResult<Value>| match q(&[b"INFO", section])
            .unwrap()
        {
            Value::BulkString(b) => String::from_utf8(b).unwrap(),
            other => panic!("INFO gave {other:?}"),
        };
    let all = info(b"all", &mut q);
    for line in ["# Server", "redis_version:", "gphash_mode:", "# Clients", "connected_clients:1", "# Stats"]
    {
        assert!(all.contains(line), "INFO lacks {line}:\n{all}");
    }
    for line in
        ["gphash_batches:", "gphash_batch_ops_p50:", "gphash_batch_usec_p99:", "gphash_request_usec_max:"]
    {
        assert!(all.contains(line), "INFO lacks {line}:\n{all}");
    }
    // Where the batcher's and the index's time went: batches ran and were answered, and
    // their writes were encoded within the index's calls.
    let number = |name: &str| -> u64 {
        let line =
            all.lines().find_map(|l| l.strip_prefix(name)).unwrap_or_else(|| panic!("no {name}:\n{all}"));
        line.parse().unwrap()
    };
    // Unless told, a quarter of the cores serve the connections, at least one.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    assert_eq!(number("gphash_io_threads:"), (cores / 4).max(1) as u64, "{all}");
    number("gphash_batcher_usec_gather:");
    number("gphash_batcher_usec_build:");
    assert!(number("gphash_batcher_usec_index:") > 0, "{all}");
    assert!(number("gphash_batcher_usec_reply:") > 0, "{all}");
    assert!(
        number("gphash_index_usec_encode:") <= number("gphash_batcher_usec_index:"),
        "encoding is part of the index's calls:\n{all}"
    );
    assert_eq!(info(b"keyspace", &mut q), "# Keyspace\r\ndb0:keys=3,expires=0,avg_ttl=0\r\n");
    assert_eq!(q(&[b"QUIT"]).unwrap(), okay());
    assert!(q(&[b"PING"]).is_err(), "QUIT closes the connection");
    assert!(server.stop().success());
    // SIGTERM closed the pool cleanly, with everything acknowledged in it.
    let found = gphash::inspect(&pool(&dir)).unwrap();
    assert!(found.clean() && found.consistent(), "{found}");
    assert_eq!(found.stats.items, 3);
}

#[test]
fn pipelines_see_their_own_writes_in_order() {
    let dir = common::pool_dir();
    let server = Server::start(&pool(&dir), &[]);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let mut c = server.client();
            std::thread::spawn(move || {
                for round in 0..20 {
                    let k = format!("t{t}");
                    let mut p = redis::pipe();
                    p.cmd("SET").arg(&k).arg(format!("{round}a")).cmd("GET").arg(&k);
                    p.cmd("SET").arg(&k).arg(format!("{round}b")).arg("XX").cmd("GET").arg(&k);
                    p.cmd("GETDEL").arg(&k).cmd("EXISTS").arg(&k).cmd("SET").arg(&k).arg("z").arg("NX");
                    p.cmd("MGET").arg(&k).arg("nothing").cmd("DBSIZE");
                    let got: Vec<Value> = p.query(&mut c).unwrap();
                    let (a, b) = (format!("{round}a"), format!("{round}b"));
                    assert_eq!(
                        &got[..7],
                        &[
                            okay(),
                            bulk(a.as_bytes()),
                            okay(),
                            bulk(b.as_bytes()),
                            bulk(b.as_bytes()),
                            Value::Int(0),
                            okay()
                        ]
                    );
                    assert_eq!(got[7], Value::Array(vec![bulk(b"z"), Value::Nil]));
                    assert!(matches!(got[8], Value::Int(1..=8)), "{:?}", got[8]);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(cmd(&mut server.client(), &[b"DBSIZE"]).unwrap(), Value::Int(8));
}

/// A pool that cannot grow (`--max-bytes` at its first size) fills up in the middle of one
/// connection's pipeline: the requests that fit are applied and answered `+OK`, the others get
/// an error and leave nothing behind, and reads, updates and deletes go on being served.
#[test]
fn a_full_pool_fails_only_the_requests_it_concerns() {
    let dir = common::pool_dir();
    // 4,096 keys of 16 bytes make a pool of 448 KiB; growth needs more than 500,000 bytes.
    let server = Server::start(&pool(&dir), &["--max-bytes", "500000"]);
    let mut c = server.client();
    let keys: Vec<String> = (0..8000).map(|i| format!("k{i}")).collect();
    let mut p = redis::pipe();
    p.ignore_errors();
    for k in &keys {
        // A read that always finds its key, in the same batches as the writes that fail.
        p.cmd("SET").arg(k).arg(k).cmd("GET").arg(k).cmd("GET").arg("k0");
    }
    let got: Vec<RedisResult<Value>> = p.query(&mut c).unwrap();
    let mut stored = Vec::new();
    for (k, pair) in keys.iter().zip(got.chunks(3)) {
        assert_eq!(pair[2].as_ref().unwrap(), &bulk(b"k0"), "GET k0 after SET {k}");
        match &pair[0] {
            Ok(v) => {
                assert_eq!(v, &okay(), "{k}");
                assert_eq!(pair[1].as_ref().unwrap(), &bulk(k.as_bytes()), "{k} reads back");
                stored.push(k);
            }
            Err(e) => {
                assert!(e.to_string().to_lowercase().contains("space"), "{k}: {e}");
                assert_eq!(pair[1].as_ref().unwrap(), &Value::Nil, "{k}: a failed SET leaves nothing");
            }
        }
    }
    assert!(stored.len() > 1000 && stored.len() < keys.len(), "{} of {} stored", stored.len(), keys.len());
    assert_eq!(cmd(&mut c, &[b"DBSIZE"]).unwrap(), Value::Int(stored.len() as i64));
    // Updates, deletes and reads still work on the full pool.
    let (first, second) = (stored[0].as_bytes(), stored[1].as_bytes());
    assert_eq!(cmd(&mut c, &[b"SET", first, b"new", b"XX"]).unwrap(), okay());
    assert_eq!(cmd(&mut c, &[b"DEL", second]).unwrap(), Value::Int(1));
    assert_eq!(cmd(&mut c, &[b"MGET", first, second]).unwrap(), Value::Array(vec![bulk(b"new"), Value::Nil]));
    assert!(server.stop().success());
    // Everything acknowledged is in the pool after a clean stop.
    let server = Server::start(&pool(&dir), &[]);
    let mut c = server.client();
    for k in &stored[2..] {
        assert_eq!(cmd(&mut c, &[b"GET", k.as_bytes()]).unwrap(), bulk(k.as_bytes()));
    }
}

/// 32 clients on 3 threads of the server's runtime (`--io-threads`, which INFO reports).
#[test]
fn many_clients_at_once_each_keep_their_order() {
    let dir = common::pool_dir();
    let server = Server::start(&pool(&dir), &["--io-threads", "3"]);
    let clients = 32;
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            let mut c = server.client();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(common::seed("many_clients") + t);
                let mut mine: HashMap<String, String> = HashMap::new();
                for _ in 0..10 {
                    let mut p = redis::pipe();
                    let mut expect = vec![];
                    for _ in 0..50 {
                        let k = format!("c{t}k{}", rng.random_range(0..40));
                        if rng.random_bool(0.5) {
                            let v = format!("{}", rng.random::<u32>());
                            p.cmd("SET").arg(&k).arg(&v);
                            mine.insert(k, v);
                            expect.push(okay());
                        } else {
                            p.cmd("GET").arg(&k);
                            expect.push(mine.get(&k).map_or(Value::Nil, |v| bulk(v.as_bytes())));
                        }
                    }
                    let got: Vec<Value> = p.query(&mut c).unwrap();
                    assert_eq!(got, expect);
                }
                mine.len() as i64
            })
        })
        .collect();
    let keys: i64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let mut c = server.client();
    assert_eq!(cmd(&mut c, &[b"DBSIZE"]).unwrap(), Value::Int(keys));
    let Value::BulkString(info) = cmd(&mut c, &[b"INFO", b"stats"]).unwrap() else { panic!() };
    let info = String::from_utf8(info).unwrap();
    eprintln!("{info}");
    let max_ops: u64 =
        info.lines().find_map(|l| l.strip_prefix("gphash_batch_ops_max:")).unwrap().parse().unwrap();
    assert!(max_ops > 50, "requests of several clients were batched together: {info}");
    // Commands are counted a chunk at a time; an INFO in the middle of a pipeline counts every
    // command before it and itself (and may count some read after it with it).
    let commands = |info: &str| -> u64 {
        info.lines().find_map(|l| l.strip_prefix("total_commands_processed:")).unwrap().parse().unwrap()
    };
    assert!(commands(&info) > clients * 10 * 50, "{info}");
    let mut p = redis::pipe();
    p.cmd("INFO").arg("stats");
    for i in 0..50 {
        p.cmd("SET").arg(format!("counted{i}")).arg(i);
    }
    p.cmd("INFO").arg("stats");
    let got: Vec<Value> = p.query(&mut c).unwrap();
    let counted: Vec<u64> = [&got[0], &got[51]]
        .map(|v| match v {
            Value::BulkString(b) => commands(&String::from_utf8_lossy(b)),
            other => panic!("INFO gave {other:?}"),
        })
        .into();
    let before = commands(&info);
    assert!((before + 1..=before + 52).contains(&counted[0]), "{counted:?} after {before}");
    assert_eq!(counted[1], before + 52);
    let Value::BulkString(info) = cmd(&mut c, &[b"INFO", b"server"]).unwrap() else { panic!() };
    let info = String::from_utf8(info).unwrap();
    assert!(info.lines().any(|l| l == "gphash_io_threads:3"), "{info}");
}

#[test]
fn reads_in_flight_never_go_back_in_time() {
    let dir = common::pool_dir();
    let server = Server::start(&pool(&dir), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let mut w = server.client();
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut version = 0u64;
            while !stop.load(Ordering::Relaxed) {
                version += 1;
                let _: () = redis::cmd("SET").arg("clock").arg(version).query(&mut w).unwrap();
            }
            version
        })
    };
    // Readers send pipelines of GETs only: batches of reads in flight together, between the
    // writer's batches; a later read never sees an older version.
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let mut c = server.client();
            std::thread::spawn(move || {
                let mut last = 0u64;
                for _ in 0..100 {
                    let mut p = redis::pipe();
                    (0..16).for_each(|_| _ = p.cmd("GET").arg("clock"));
                    let seen: Vec<Option<u64>> = p.query(&mut c).unwrap();
                    for v in seen.into_iter().map(|v| v.unwrap_or(0)) {
                        assert!(v >= last, "read {v} after {last}");
                        last = v;
                    }
                }
                last
            })
        })
        .collect();
    let seen: Vec<u64> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(seen.iter().all(|&v| v <= written) && written > 1, "{seen:?} of {written}");
    let Value::BulkString(info) = cmd(&mut server.client(), &[b"INFO", b"stats"]).unwrap() else { panic!() };
    let info = String::from_utf8(info).unwrap();
    let pipelined: u64 =
        info.lines().find_map(|l| l.strip_prefix("gphash_batches_pipelined:")).unwrap().parse().unwrap();
    assert!(pipelined > 0, "batches of reads ran through the pipeline: {info}");
}

/// Raises this process's soft limit on open files to `want`, which the hard limit must allow.
fn raise_file_limit(want: u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write the struct given, nothing else.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        assert!(limit.rlim_max >= want, "the hard limit on open files ({}) is below {want}", limit.rlim_max);
        limit.rlim_cur = limit.rlim_cur.max(want);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

/// Reads what the server sends until it closes the connection.
fn read_to_close(s: &mut TcpStream) -> String {
    let mut out = vec![];
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn bad_input_harms_no_other_client() {
    let dir = common::pool_dir();
    let server = Server::start(&pool(&dir), &["--max-clients", "3000"]);
    let mut good = server.client();
    assert_eq!(cmd(&mut good, &[b"SET", b"kept", b"1"]).unwrap(), okay());
    // Thousands of idle connections, held open throughout (the server raises its own limit).
    raise_file_limit(2100);
    let idle: Vec<TcpStream> = (0..2000).map(|_| server.raw()).collect();
    let cases: &[(&[u8], &str)] = &[
        (b"*2\r\n$3\r\nGET\r\n*1\r\n$1\r\nx\r\n", "-ERR Protocol error: expected '$', got '*'"),
        (b"*1\r\n$999999999999\r\n", "-ERR Protocol error: invalid bulk length"),
        (b"*-5x\r\n", "-ERR Protocol error: invalid multibulk length"),
        (b"*1\r\n$3\r\nPINGX\r\n", "-ERR Protocol error: bulk string not ended by CRLF"),
        (&[b'A'; 70_000], "-ERR Protocol error: too big inline request"),
    ];
    for (input, want) in cases {
        let mut s = server.raw();
        s.write_all(b"PING\r\n").unwrap();
        s.write_all(input).unwrap();
        let got = read_to_close(&mut s);
        assert_eq!(
            got,
            format!("+PONG\r\n{want}\r\n"),
            "for {:?}",
            String::from_utf8_lossy(&input[..input.len().min(40)])
        );
    }
    // A request cut off by the client: its SET never runs.
    let mut s = server.raw();
    s.write_all(b"*3\r\n$3\r\nSET\r\n$3\r\ncut\r\n$5\r\nval").unwrap();
    drop(s);
    // A client that sends a request and leaves without reading the reply: it still runs.
    let mut s = server.raw();
    s.write_all(b"*3\r\n$3\r\nSET\r\n$4\r\nleft\r\n$1\r\n2\r\n").unwrap();
    drop(s);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(cmd(&mut good, &[b"GET", b"cut"]).unwrap(), Value::Nil);
    assert_eq!(cmd(&mut good, &[b"GET", b"left"]).unwrap(), bulk(b"2"));
    assert_eq!(cmd(&mut good, &[b"GET", b"kept"]).unwrap(), bulk(b"1"));
    // Idle connections are still served.
    for mut s in idle.into_iter().step_by(400) {
        s.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        let mut reply = [0; 7];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"+PONG\r\n");
    }
}

#[test]
fn kill_9_keeps_every_acknowledged_write() {
    let dir = common::pool_dir();
    let path = pool(&dir);
    let mut rng = StdRng::seed_from_u64(common::seed("serve_kill"));
    for round in 0..3u32 {
        // Round 1 starts its GPU in the background: the kill may come before the GPU took
        // over, or after, with writes acknowledged on the CPU model before it.
        let start: &[&str] = if round == 1 { &["--gpu-start", "background"] } else { &[] };
        let server = Server::start(&path, start);
        let stop = Arc::new(AtomicBool::new(false));
        // Each writer sets its own keys to increasing versions and records the last acknowledged.
        let acked: Arc<Mutex<HashMap<String, u32>>> = Default::default();
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (mut c, stop, acked) = (server.client(), stop.clone(), acked.clone());
                std::thread::spawn(move || {
                    let mut version = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        version += 1;
                        let mut p = redis::pipe();
                        let keys: Vec<String> = (0..16).map(|i| format!("r{round}w{w}k{i}")).collect();
                        for k in &keys {
                            p.cmd("SET").arg(k).arg(version);
                        }
                        match p.query::<Vec<Value>>(&mut c) {
                            Ok(_) => {
                                let mut a = acked.lock().unwrap();
                                keys.into_iter().for_each(|k| _ = a.insert(k, version));
                            }
                            Err(_) => break,
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.random_range(200..1200)));
        signal(server.child.id(), libc::SIGKILL);
        stop.store(true, Ordering::Relaxed);
        writers.into_iter().for_each(|t| t.join().unwrap());
        drop(server);
        let acked = acked.lock().unwrap().clone();
        assert!(!acked.is_empty(), "round {round}: some writes were acknowledged before the kill");
        // The restart recovers the pool; every acknowledged version is there, or the one after
        // it (sent, then the kill came before its reply).
        let server = Server::start(&path, start);
        let mut c = server.client();
        for (k, v) in &acked {
            let got: Option<u32> = redis::cmd("GET").arg(k).query(&mut c).unwrap();
            assert!(
                got == Some(*v) || got == Some(v + 1),
                "round {round}: {k} acknowledged at {v}, found {got:?}"
            );
        }
        assert!(server.stop().success());
    }
    let found = gphash::inspect(&path).unwrap();
    assert!(found.clean() && found.consistent(), "{found}");
}

/// The path of a redis-tools program; under CI=true its absence is a failure.
fn redis_tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.is_file()));
    match found {
        Some(p) => Some(p),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true and no {name}: .ci/run installs redis-tools")
        }
        None => {
            eprintln!("WARNING: {name} is not installed (apt-get install redis-tools): its test did not run");
            None
        }
    }
}

#[test]
fn redis_cli_and_redis_benchmark_are_served() {
    let (Some(cli), Some(bench)) = (redis_tool("redis-cli"), redis_tool("redis-benchmark")) else { return };
    let dir = common::pool_dir();
    // redis-benchmark's keys are 16 bytes (key:000000000123).
    let server = Server::start(&pool(&dir), &["--key-bytes", "20", "--value-bytes", "16"]);
    let port = server.port.to_string();
    let redis_cli = |args: &[&str], stdin: &[u8]| {
        let mut child = Command::new(&cli)
            .args(["-p", &port])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(redis_cli(&["SET", "greeting", "hello world"], b""), "OK\n");
    assert_eq!(redis_cli(&["GET", "greeting"], b""), "hello world\n");
    assert_eq!(redis_cli(&["MGET", "greeting", "none"], b""), "hello world\n\n");
    // Commands read from standard input, one connection (redis-cli ends an error with an empty
    // line).
    let lines = redis_cli(&[], b"SET a 1\nINCR a\nGET a\nDEL a greeting\nDBSIZE\n");
    assert_eq!(lines, "OK\nERR unknown command 'INCR', with args beginning with: 'a' \n\n1\n2\n0\n");
    // Mass insertion: raw RESP through --pipe.
    let mut resp = Vec::new();
    for i in 0..1000 {
        write!(resp, "*3\r\n$3\r\nSET\r\n${}\r\np{i}\r\n$1\r\nv\r\n", format!("p{i}").len()).unwrap();
    }
    let piped = redis_cli(&["--pipe"], &resp);
    assert!(piped.contains("errors: 0, replies: 1000"), "{piped}");
    // redis-benchmark: SET and GET, 20 clients, pipelines of 16, 1000 random keys.
    let out = Command::new(&bench)
        .args(["-p", &port, "-t", "set,get", "-n", "4000", "-c", "20", "-P", "16", "-r", "1000", "--csv"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    for test in ["\"SET\"", "\"GET\""] {
        let line = text.lines().find(|l| l.starts_with(test)).unwrap_or_else(|| panic!("no {test} line"));
        let rps: f64 = line.split(',').nth(1).unwrap().trim_matches('"').parse().unwrap();
        assert!(rps > 0.0, "{line}");
    }
    // Its keys are key:000000000NNN, each with the same 3-byte value (-d 3).
    let written = redis_cli(&["DBSIZE"], b"");
    let written: i64 = written.trim().parse().unwrap();
    assert!(
        written > 1000 && written <= 2000,
        "1000 piped keys and up to 1000 of redis-benchmark's: {written}"
    );
    let mut c = server.client();
    let sample: Vec<Option<Vec<u8>>> = (0..1000)
        .map(|i| format!("key:{i:012}"))
        .map(|k| redis::cmd("GET").arg(k).query(&mut c).unwrap())
        .collect();
    let values: std::collections::HashSet<&Vec<u8>> = sample.iter().flatten().collect();
    assert!(values.len() == 1 && values.iter().all(|v| v.len() == 3), "{values:?}");
    assert_eq!(sample.iter().flatten().count() as i64, written - 1000);
}
