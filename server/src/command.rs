//! Commands: a request's arguments turned into what answers it (a reply at once, operations
//! for the batcher, or a question about the whole index).

use bytes::Bytes;
use gphash::OpKind;
use redis_protocol::resp2::types::BytesFrame as Frame;

use crate::record::Widths;
use crate::request::Request;

/// What a request asks for.
#[derive(Debug)]
pub(crate) enum Command {
    /// Answered by the connection at once (PING, ECHO, errors, ...).
    Reply(Frame),
    /// `+OK`, then the connection closes.
    Quit,
    /// Operations on the index, this many, appended to the [`Ops`] given to [`parse`], and how
    /// their results make the reply.
    Ops(Shape, usize),
    /// A question about the whole index, answered between batches so that it sees the
    /// connection's earlier writes and none of its later ones.
    Control(Control),
}

/// A question answered between batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Control {
    /// DBSIZE.
    DbSize,
    /// INFO with its sections (lowercase; empty: the default ones).
    Info(Vec<String>),
}

/// Operations of one request, keys and values already in the pool's widths.
#[derive(Debug, Default)]
pub(crate) struct Ops {
    /// One kind per operation.
    pub(crate) kinds: Vec<OpKind>,
    /// Keys, the pool's key width each.
    pub(crate) keys: Vec<u8>,
    /// Values, the pool's value size each: zeros for operations that write none, so that the
    /// columns join a batch as they are ([`gphash::Batch::extend_from_columns`]).
    pub(crate) values: Vec<u8>,
}

/// How far [`Ops`] went before a request's operations: what a refused request is cut back to.
#[derive(Clone, Copy)]
struct Mark {
    kinds: usize,
    keys: usize,
    values: usize,
}

impl Ops {
    fn mark(&self) -> Mark {
        Mark { kinds: self.kinds.len(), keys: self.keys.len(), values: self.values.len() }
    }

    fn cut(&mut self, to: Mark) {
        self.kinds.truncate(to.kinds);
        self.keys.truncate(to.keys);
        self.values.truncate(to.values);
    }

    fn push(&mut self, w: &Widths, kind: OpKind, key: &[u8], value: Option<&[u8]>) -> Result<(), Frame> {
        w.put_key(key, &mut self.keys).map_err(|e| error(format!("ERR {e}")))?;
        let put = match value {
            Some(v) => w.put_value(v, &mut self.values),
            None => {
                self.values.resize(self.values.len() + w.value_bytes(), 0);
                Ok(())
            }
        };
        if let Err(e) = put {
            self.keys.truncate(self.keys.len() - w.key_bytes());
            return Err(error(format!("ERR {e}")));
        }
        self.kinds.push(kind);
        Ok(())
    }

    /// Operations in the request.
    pub(crate) fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Whether every operation only reads.
    pub(crate) fn read_only(&self) -> bool {
        self.kinds.iter().all(|&k| k == OpKind::Get)
    }

    /// Operations `range` as columns: kinds, keys and values.
    pub(crate) fn columns(&self, w: &Widths, range: std::ops::Range<usize>) -> (&[OpKind], &[u8], &[u8]) {
        let (kb, vb) = (w.key_bytes(), w.value_bytes());
        let (start, end) = (range.start, range.end);
        (&self.kinds[range], &self.keys[start * kb..end * kb], &self.values[start * vb..end * vb])
    }
}

/// The operations of several requests of one connection, in order, with how each request's
/// results make its reply: the batcher runs them as one job, one reply for the lot.
#[derive(Debug, Default)]
pub(crate) struct Group {
    pub(crate) ops: Ops,
    /// Each request's reply shape and number of operations.
    pub(crate) requests: Vec<(Shape, usize)>,
}

/// How a request's results make its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `+OK` (SET, MSET).
    Ok,
    /// `+OK` if the only operation applied, else nil (SET NX, SET XX).
    OkOrNil,
    /// `:1` if the only operation applied, else `:0` (SETNX).
    Flag,
    /// The value the first operation read, or nil (GET, GETDEL, SET ... GET).
    Value,
    /// How many operations applied or found their key (DEL, EXISTS).
    Count,
    /// Every operation's value or nil (MGET).
    Values,
}

/// An error reply; `text` starts with its code (`ERR`).
pub(crate) fn error(text: impl Into<String>) -> Frame {
    Frame::Error(text.into().into())
}

fn ok() -> Frame {
    Frame::SimpleString(Bytes::from_static(b"OK"))
}

fn arity(name: &str) -> Frame {
    error(format!("ERR wrong number of arguments for '{}' command", name.to_ascii_lowercase()))
}

/// Parameters CONFIG GET knows, with their values (what redis-benchmark and redis-cli ask).
const CONFIG: &[(&str, &str)] = &[("save", ""), ("appendonly", "no"), ("databases", "1"), ("maxmemory", "0")];

/// The longest command name [`parse`] knows.
const LONGEST_NAME: usize = "COMMAND".len();

/// The most bytes a request's operations may take in the pool's widths (a key and a value's
/// room each), as a request's own bytes may (`request::Limits`): a pool of 64 KiB values would
/// otherwise turn an MGET of a million one-byte keys into 64 GiB.
const MAX_OPS_BYTES: usize = 64 << 20;

/// Turns a request (at least one argument: the command's name) into a command for a pool of
/// these widths. A data command appends its operations to `ops` (the connection's group, so
/// that a request costs no buffers of its own); one refused leaves `ops` as it was.
pub(crate) fn parse(req: &Request, w: &Widths, ops: &mut Ops) -> Command {
    // The name in capitals, on the stack: longer names are none of ours.
    let mut upper = [0u8; LONGEST_NAME];
    let name: &[u8] = match req.arg(0).len() {
        len if len <= LONGEST_NAME => {
            upper[..len].copy_from_slice(req.arg(0));
            upper[..len].make_ascii_uppercase();
            &upper[..len]
        }
        _ => b"",
    };
    let n = req.len() - 1;
    let mark = ops.mark();
    let mut batch = |kind: OpKind, shape: Shape| {
        if let Some(refused) = too_large(n, w) {
            return refused;
        }
        for k in req.args(1) {
            if let Err(e) = ops.push(w, kind, k, None) {
                ops.cut(mark);
                return Command::Reply(e);
            }
        }
        Command::Ops(shape, n)
    };
    match name {
        b"PING" if n == 0 => Command::Reply(Frame::SimpleString(Bytes::from_static(b"PONG"))),
        b"PING" | b"ECHO" if n == 1 => Command::Reply(Frame::BulkString(req.bytes(1))),
        b"QUIT" => Command::Quit,
        b"SELECT" if n == 1 => {
            Command::Reply(match std::str::from_utf8(req.arg(1)).ok().and_then(|s| s.parse::<i64>().ok()) {
                Some(0) => ok(),
                Some(_) => error("ERR DB index is out of range"),
                None => error("ERR value is not an integer or out of range"),
            })
        }
        b"GET" if n == 1 => batch(OpKind::Get, Shape::Value),
        b"SET" if n >= 2 => set(req, w, ops),
        b"SETNX" if n == 2 => writes(OpKind::Insert, req, w, Shape::Flag, ops),
        b"GETDEL" if n == 1 => {
            let key = req.arg(1);
            match ops.push(w, OpKind::Get, key, None).and_then(|()| ops.push(w, OpKind::Delete, key, None)) {
                Ok(()) => Command::Ops(Shape::Value, 2),
                Err(e) => {
                    ops.cut(mark);
                    Command::Reply(e)
                }
            }
        }
        b"DEL" if n >= 1 => batch(OpKind::Delete, Shape::Count),
        b"EXISTS" if n >= 1 => batch(OpKind::Get, Shape::Count),
        b"MGET" if n >= 1 => batch(OpKind::Get, Shape::Values),
        b"MSET" if n >= 2 && n.is_multiple_of(2) => writes(OpKind::Upsert, req, w, Shape::Ok, ops),
        b"DBSIZE" if n == 0 => Command::Control(Control::DbSize),
        b"INFO" => Command::Control(Control::Info(
            req.args(1).map(|s| String::from_utf8_lossy(s).to_ascii_lowercase()).collect(),
        )),
        b"COMMAND" => Command::Reply(match req.args(1).next() {
            Some(sub) if sub.eq_ignore_ascii_case(b"COUNT") => Frame::Integer(0),
            _ => Frame::Array(vec![]),
        }),
        b"CONFIG" if n == 2 && req.arg(1).eq_ignore_ascii_case(b"GET") => {
            let pattern = String::from_utf8_lossy(req.arg(2)).to_ascii_lowercase();
            let found = CONFIG.iter().filter(|(k, _)| pattern == "*" || pattern == *k);
            let pairs =
                found.flat_map(|(k, v)| [k, v].map(|s| Frame::BulkString(Bytes::from_static(s.as_bytes()))));
            Command::Reply(Frame::Array(pairs.collect()))
        }
        b"CONFIG" if n >= 1 => Command::Reply(error(format!(
            "ERR CONFIG {} is not supported by gphash (only CONFIG GET)",
            String::from_utf8_lossy(req.arg(1)).to_ascii_uppercase()
        ))),
        b"PING" | b"ECHO" | b"SELECT" | b"GET" | b"SET" | b"SETNX" | b"GETDEL" | b"DEL" | b"EXISTS"
        | b"MGET" | b"MSET" | b"DBSIZE" | b"CONFIG" => Command::Reply(arity(&String::from_utf8_lossy(name))),
        _ => {
            let shown: String =
                req.args(1).take(3).map(|a| format!("'{}' ", String::from_utf8_lossy(a))).collect();
            let name = String::from_utf8_lossy(req.arg(0));
            Command::Reply(error(format!("ERR unknown command '{name}', with args beginning with: {shown}")))
        }
    }
}

/// The refusal of a request of `n` operations that would take more than [`MAX_OPS_BYTES`].
fn too_large(n: usize, w: &Widths) -> Option<Command> {
    let bytes = n * (w.key_bytes() + w.value_bytes());
    (bytes > MAX_OPS_BYTES).then(|| {
        Command::Reply(error(format!(
            "ERR a request of {n} operations would take {bytes} bytes in this pool ({}-byte keys, {}-byte values); at most {MAX_OPS_BYTES}: send fewer keys a request",
            w.key_bytes(),
            w.value_bytes()
        )))
    })
}

/// Key-value pairs written by `kind` (MSET, SETNX), appended to `ops`.
fn writes(kind: OpKind, req: &Request, w: &Widths, shape: Shape, ops: &mut Ops) -> Command {
    let mark = ops.mark();
    let pairs = (req.len() - 1) / 2;
    if let Some(refused) = too_large(pairs, w) {
        return refused;
    }
    for i in 0..pairs {
        if let Err(e) = ops.push(w, kind, req.arg(1 + 2 * i), Some(req.arg(2 + 2 * i))) {
            ops.cut(mark);
            return Command::Reply(e);
        }
    }
    Command::Ops(shape, pairs)
}

/// SET key value [NX | XX] [GET], appended to `ops`; expiry options are refused.
fn set(req: &Request, w: &Widths, ops: &mut Ops) -> Command {
    let (mut kind, mut get) = (OpKind::Upsert, false);
    for option in req.args(3) {
        let is = |word: &[u8]| option.eq_ignore_ascii_case(word);
        if is(b"NX") && kind == OpKind::Upsert {
            kind = OpKind::Insert;
        } else if is(b"XX") && kind == OpKind::Upsert {
            kind = OpKind::Update;
        } else if is(b"GET") {
            get = true;
        } else if [&b"EX"[..], b"PX", b"EXAT", b"PXAT", b"KEEPTTL"].iter().any(|w| is(w)) {
            return Command::Reply(error(
                "ERR gphash keeps keys until they are deleted: SET EX, PX, EXAT, PXAT and KEEPTTL are not supported",
            ));
        } else {
            return Command::Reply(error("ERR syntax error"));
        }
    }
    let mark = ops.mark();
    let (key, value) = (req.arg(1), req.arg(2));
    let pushed = if get { ops.push(w, OpKind::Get, key, None) } else { Ok(()) }
        .and_then(|()| ops.push(w, kind, key, Some(value)));
    match pushed {
        Err(e) => {
            ops.cut(mark);
            Command::Reply(e)
        }
        Ok(()) if get => Command::Ops(Shape::Value, 2),
        Ok(()) if kind == OpKind::Upsert => Command::Ops(Shape::Ok, 1),
        Ok(()) => Command::Ops(Shape::OkOrNil, 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command, and the operations it appended to a group that held one already.
    fn run_with(line: &str) -> (Command, Ops) {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let w = Widths::new(8, 8).unwrap();
        let mut group = Ops::default();
        group.push(&w, OpKind::Upsert, b"before", Some(b"v")).unwrap();
        let command = parse(&Request::of(&args), &w, &mut group);
        let (kinds, keys, values) = group.columns(&w, 1..group.len());
        let appended = Ops { kinds: kinds.to_vec(), keys: keys.to_vec(), values: values.to_vec() };
        (command, appended)
    }

    fn run(line: &str) -> Command {
        run_with(line).0
    }

    fn reply(line: &str) -> Frame {
        match run_with(line) {
            // A refused request appends nothing.
            (Command::Reply(f), appended) if appended.len() == 0 => f,
            other => panic!("{line}: {other:?}"),
        }
    }

    /// The operations' kinds, the reply's shape, and the bytes of the values written (those of
    /// operations that write none are zeros).
    fn ops(line: &str) -> (Vec<OpKind>, Shape, usize) {
        match run_with(line) {
            (Command::Ops(shape, n), ops) if n == ops.len() => {
                assert_eq!(ops.values.len(), n * 8, "{line}: a value per operation");
                let mut written = 0;
                for (kind, value) in ops.kinds.iter().zip(ops.values.chunks_exact(8)) {
                    match kind.writes_value() {
                        true => written += value.len(),
                        false => assert_eq!(value, [0; 8], "{line}: a {kind:?}'s value"),
                    }
                }
                (ops.kinds, shape, written)
            }
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn commands_become_operations() {
        use OpKind::*;
        assert_eq!(ops("get k"), (vec![Get], Shape::Value, 0));
        assert_eq!(ops("SET k v"), (vec![Upsert], Shape::Ok, 8));
        assert_eq!(ops("set k v nx"), (vec![Insert], Shape::OkOrNil, 8));
        assert_eq!(ops("set k v XX"), (vec![Update], Shape::OkOrNil, 8));
        assert_eq!(ops("set k v xx get"), (vec![Get, Update], Shape::Value, 8));
        assert_eq!(ops("setnx k v"), (vec![Insert], Shape::Flag, 8));
        assert_eq!(ops("getdel k"), (vec![Get, Delete], Shape::Value, 0));
        assert_eq!(ops("del a b c"), (vec![Delete; 3], Shape::Count, 0));
        assert_eq!(ops("exists a a"), (vec![Get; 2], Shape::Count, 0));
        assert_eq!(ops("mget a b"), (vec![Get; 2], Shape::Values, 0));
        assert_eq!(ops("mset a 1 b 2"), (vec![Upsert; 2], Shape::Ok, 16));
        assert!(matches!(run("dbsize"), Command::Control(Control::DbSize)));
        assert!(matches!(run("INFO Keyspace"), Command::Control(Control::Info(s)) if s == ["keyspace"]));
        assert!(matches!(run("quit"), Command::Quit));
    }

    #[test]
    fn errors_name_the_problem() {
        let text = |f: Frame| match f {
            Frame::Error(s) => s.to_string(),
            other => panic!("not an error: {other:?}"),
        };
        assert_eq!(text(reply("get")), "ERR wrong number of arguments for 'get' command");
        assert_eq!(text(reply("mset a 1 b")), "ERR wrong number of arguments for 'mset' command");
        assert_eq!(text(reply("set k v nx xx")), "ERR syntax error");
        assert!(text(reply("set k v ex 10")).contains("EX, PX"));
        assert_eq!(
            text(reply("flushall now")),
            "ERR unknown command 'flushall', with args beginning with: 'now' "
        );
        assert!(text(reply("get 12345678")).starts_with("ERR key of 8 bytes is longer than the 7 bytes"));
        assert!(
            text(reply("mset a 1 b 1234567")).starts_with("ERR value of 7 bytes is longer than the 6 bytes")
        );
        assert_eq!(text(reply("select 1")), "ERR DB index is out of range");
        // A request whose operations would take more than MAX_OPS_BYTES in the pool's widths.
        let w = Widths::new(8, 65536).unwrap();
        let mget = |keys: usize| {
            let args: Vec<&[u8]> =
                std::iter::once(&b"MGET"[..]).chain(std::iter::repeat_n(&b"k"[..], keys)).collect();
            let mut ops = Ops::default();
            (parse(&Request::of(&args), &w, &mut ops), ops.len())
        };
        assert!(matches!(mget(1000), (Command::Ops(Shape::Values, 1000), 1000)));
        match mget(1100) {
            (Command::Reply(f), 0) => assert!(text(f).contains("at most 67108864"), "MGET of 1,100 keys"),
            other => panic!("MGET of 1,100 keys: {other:?}"),
        }
        assert!(text(reply("config set save x")).contains("CONFIG SET is not supported"));
    }

    #[test]
    fn answers_of_the_connection() {
        assert_eq!(reply("ping"), Frame::SimpleString("PONG".into()));
        assert_eq!(reply("echo hi"), Frame::BulkString("hi".into()));
        assert_eq!(reply("select 0"), ok());
        assert_eq!(reply("command docs"), Frame::Array(vec![]));
        let appendonly = ["appendonly", "no"].map(|s| Frame::BulkString(s.into())).to_vec();
        assert_eq!(reply("config get APPENDONLY"), Frame::Array(appendonly));
        assert_eq!(reply("config get nothing"), Frame::Array(vec![]));
    }
}
