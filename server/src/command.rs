//! Commands: a request's arguments turned into what answers it (a reply at once, operations
//! for the batcher, or a question about the whole index).

use bytes::Bytes;
use gphash::OpKind;
use redis_protocol::resp2::types::BytesFrame as Frame;

use crate::record::Widths;

/// What a request asks for.
#[derive(Debug)]
pub(crate) enum Command {
    /// Answered by the connection at once (PING, ECHO, errors, ...).
    Reply(Frame),
    /// `+OK`, then the connection closes.
    Quit,
    /// Operations on the index, and how their results make the reply.
    Ops(Ops, Shape),
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
    /// Values of the operations that write one, in order, the pool's value size each.
    pub(crate) values: Vec<u8>,
}

impl Ops {
    fn push(&mut self, w: &Widths, kind: OpKind, key: &[u8], value: Option<&[u8]>) -> Result<(), Frame> {
        w.put_key(key, &mut self.keys).map_err(|e| error(format!("ERR {e}")))?;
        if let Some(v) = value
            && let Err(e) = w.put_value(v, &mut self.values)
        {
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

    /// Operations `range` with their keys and values, for `each(kind, key, value)`.
    pub(crate) fn each(
        &self,
        w: &Widths,
        range: std::ops::Range<usize>,
        mut each: impl FnMut(OpKind, &[u8], Option<&[u8]>),
    ) {
        let (kb, vb) = (w.key_bytes(), w.value_bytes());
        let written_before = self.kinds[..range.start].iter().filter(|k| k.writes_value()).count();
        let mut values = self.values[written_before * vb..].chunks_exact(vb);
        let keys = self.keys[range.start * kb..range.end * kb].chunks_exact(kb);
        for (&kind, key) in self.kinds[range].iter().zip(keys) {
            each(kind, key, if kind.writes_value() { values.next() } else { None });
        }
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

impl Group {
    pub(crate) fn push(&mut self, ops: Ops, shape: Shape) {
        self.requests.push((shape, ops.len()));
        if self.ops.kinds.is_empty() {
            self.ops = ops;
            return;
        }
        self.ops.kinds.extend_from_slice(&ops.kinds);
        self.ops.keys.extend_from_slice(&ops.keys);
        self.ops.values.extend_from_slice(&ops.values);
    }
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

/// Turns a request's arguments (at least one: the command's name) into a command for a pool
/// of these widths.
pub(crate) fn parse(args: &[Bytes], w: &Widths) -> Command {
    let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
    let rest = &args[1..];
    let n = rest.len();
    let batch = |kind: OpKind, keys: &[Bytes], shape: Shape| {
        let mut ops = Ops::default();
        for k in keys {
            if let Err(e) = ops.push(w, kind, k, None) {
                return Command::Reply(e);
            }
        }
        Command::Ops(ops, shape)
    };
    match name.as_str() {
        "PING" if n == 0 => Command::Reply(Frame::SimpleString(Bytes::from_static(b"PONG"))),
        "PING" if n == 1 => Command::Reply(Frame::BulkString(rest[0].clone())),
        "ECHO" if n == 1 => Command::Reply(Frame::BulkString(rest[0].clone())),
        "QUIT" => Command::Quit,
        "SELECT" if n == 1 => {
            Command::Reply(match std::str::from_utf8(&rest[0]).ok().and_then(|s| s.parse::<i64>().ok()) {
                Some(0) => ok(),
                Some(_) => error("ERR DB index is out of range"),
                None => error("ERR value is not an integer or out of range"),
            })
        }
        "GET" if n == 1 => batch(OpKind::Get, rest, Shape::Value),
        "SET" if n >= 2 => set(rest, w),
        "SETNX" if n == 2 => writes(OpKind::Insert, rest, w, Shape::Flag),
        "GETDEL" if n == 1 => {
            let mut ops = Ops::default();
            match ops
                .push(w, OpKind::Get, &rest[0], None)
                .and_then(|()| ops.push(w, OpKind::Delete, &rest[0], None))
            {
                Ok(()) => Command::Ops(ops, Shape::Value),
                Err(e) => Command::Reply(e),
            }
        }
        "DEL" if n >= 1 => batch(OpKind::Delete, rest, Shape::Count),
        "EXISTS" if n >= 1 => batch(OpKind::Get, rest, Shape::Count),
        "MGET" if n >= 1 => batch(OpKind::Get, rest, Shape::Values),
        "MSET" if n >= 2 && n.is_multiple_of(2) => writes(OpKind::Upsert, rest, w, Shape::Ok),
        "DBSIZE" if n == 0 => Command::Control(Control::DbSize),
        "INFO" => Command::Control(Control::Info(
            rest.iter().map(|s| String::from_utf8_lossy(s).to_ascii_lowercase()).collect(),
        )),
        "COMMAND" => Command::Reply(match rest.first().map(|s| s.to_ascii_uppercase()) {
            Some(sub) if sub == b"COUNT" => Frame::Integer(0),
            _ => Frame::Array(vec![]),
        }),
        "CONFIG" if n == 2 && rest[0].eq_ignore_ascii_case(b"GET") => {
            let pattern = String::from_utf8_lossy(&rest[1]).to_ascii_lowercase();
            let found = CONFIG.iter().filter(|(k, _)| pattern == "*" || pattern == *k);
            let pairs =
                found.flat_map(|(k, v)| [k, v].map(|s| Frame::BulkString(Bytes::from_static(s.as_bytes()))));
            Command::Reply(Frame::Array(pairs.collect()))
        }
        "CONFIG" if n >= 1 => Command::Reply(error(format!(
            "ERR CONFIG {} is not supported by gphash (only CONFIG GET)",
            String::from_utf8_lossy(&rest[0]).to_ascii_uppercase()
        ))),
        "PING" | "ECHO" | "SELECT" | "GET" | "SET" | "SETNX" | "GETDEL" | "DEL" | "EXISTS" | "MGET"
        | "MSET" | "DBSIZE" | "CONFIG" => Command::Reply(arity(&name)),
        _ => {
            let shown: String =
                rest.iter().take(3).map(|a| format!("'{}' ", String::from_utf8_lossy(a))).collect();
            let name = String::from_utf8_lossy(&args[0]);
            Command::Reply(error(format!("ERR unknown command '{name}', with args beginning with: {shown}")))
        }
    }
}

/// Key-value pairs written by `kind` (MSET, SETNX).
fn writes(kind: OpKind, pairs: &[Bytes], w: &Widths, shape: Shape) -> Command {
    let mut ops = Ops::default();
    for kv in pairs.chunks(2) {
        if let Err(e) = ops.push(w, kind, &kv[0], Some(&kv[1])) {
            return Command::Reply(e);
        }
    }
    Command::Ops(ops, shape)
}

/// SET key value [NX | XX] [GET]; expiry options are refused.
fn set(args: &[Bytes], w: &Widths) -> Command {
    let (mut kind, mut get) = (OpKind::Upsert, false);
    for option in &args[2..] {
        match option.to_ascii_uppercase().as_slice() {
            b"NX" if kind == OpKind::Upsert => kind = OpKind::Insert,
            b"XX" if kind == OpKind::Upsert => kind = OpKind::Update,
            b"GET" => get = true,
            b"EX" | b"PX" | b"EXAT" | b"PXAT" | b"KEEPTTL" => {
                return Command::Reply(error(
                    "ERR gphash keeps keys until they are deleted: SET EX, PX, EXAT, PXAT and KEEPTTL are not supported",
                ));
            }
            _ => return Command::Reply(error("ERR syntax error")),
        }
    }
    let mut ops = Ops::default();
    let (key, value) = (&args[0], &args[1]);
    let pushed = if get { ops.push(w, OpKind::Get, key, None) } else { Ok(()) }
        .and_then(|()| ops.push(w, kind, key, Some(value)));
    match pushed {
        Err(e) => Command::Reply(e),
        Ok(()) if get => Command::Ops(ops, Shape::Value),
        Ok(()) if kind == OpKind::Upsert => Command::Ops(ops, Shape::Ok),
        Ok(()) => Command::Ops(ops, Shape::OkOrNil),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &str) -> Command {
        let args: Vec<Bytes> = line.split(' ').map(|s| Bytes::copy_from_slice(s.as_bytes())).collect();
        parse(&args, &Widths::new(8, 8).unwrap())
    }

    fn reply(line: &str) -> Frame {
        match run(line) {
            Command::Reply(f) => f,
            other => panic!("{line}: {other:?}"),
        }
    }

    fn ops(line: &str) -> (Vec<OpKind>, Shape, usize) {
        match run(line) {
            Command::Ops(ops, shape) => (ops.kinds, shape, ops.values.len()),
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
