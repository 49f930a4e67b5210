//! Framing of client requests: RESP2 arrays of bulk strings (what every client sends) and
//! inline commands (`PING\r\n`, as typed into telnet), each within [`Limits`].
//!
//! Replies are encoded by the `redis-protocol` crate, but requests are framed here: its
//! decoder accepts any RESP2 frame, recursing into nested arrays (a request of 200,000 nested
//! `*1` arrays overflows the stack and aborts the process) and waiting for whatever bulk
//! length a client declares. A request is never nested, so this decoder takes exactly its
//! shape, incrementally (a large request arriving in pieces is scanned once), and refuses
//! anything else with the error Redis gives before closing the connection.

use std::ops::Range;

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::Decoder;

/// The largest request a connection may send, in its parts.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of one bulk string (a key, a value, an ECHO message).
    pub max_bulk: usize,
    /// Arguments of one request (MSET, MGET, DEL of many keys).
    pub max_args: usize,
    /// Bytes of one request, all its arguments together.
    pub max_request: usize,
    /// Bytes of one line: an inline command or a length header.
    pub max_line: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_bulk: 1 << 20, max_args: 1 << 20, max_request: 64 << 20, max_line: 64 << 10 }
    }
}

/// A request that breaks the protocol or a limit: the connection gets this error and is
/// closed, since what follows in its stream cannot be framed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    /// Malformed or over a limit; the text follows Redis's (`Protocol error: ...`).
    #[error("Protocol error: {0}")]
    Protocol(String),
    /// Reading the socket failed, or it closed in the middle of a request.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

fn protocol<T>(why: impl Into<String>) -> Result<T, RequestError> {
    Err(RequestError::Protocol(why.into()))
}

/// Decodes requests into their arguments (the command name first).
#[derive(Debug)]
pub(crate) struct RequestCodec {
    limits: Limits,
    /// The request being read, once its header arrived: arguments announced and read so far.
    partial: Option<Partial>,
}

#[derive(Debug)]
struct Partial {
    argc: usize,
    /// The arguments read so far, as ranges of the request (which stays at the front of the
    /// read buffer until it is whole).
    args: Vec<Range<usize>>,
    /// Length of the bulk string whose header was read, if its data has not all arrived.
    bulk: Option<usize>,
    bytes: usize,
    /// How far into the read buffer the request has been read.
    at: usize,
}

/// A request's arguments (the command's name first): ranges of one buffer, so that framing a
/// request takes one buffer off the connection's stream, not one per argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    buf: Bytes,
    args: Vec<Range<usize>>,
}

impl Request {
    /// A request of these arguments (tests).
    #[cfg(test)]
    pub(crate) fn of(args: &[&[u8]]) -> Request {
        let mut buf = Vec::new();
        let mut ranges = Vec::new();
        for a in args {
            ranges.push(buf.len()..buf.len() + a.len());
            buf.extend_from_slice(a);
        }
        Request { buf: buf.into(), args: ranges }
    }

    /// Its number of arguments, the name included (at least one).
    pub(crate) fn len(&self) -> usize {
        self.args.len()
    }

    /// Argument `i`.
    pub(crate) fn arg(&self, i: usize) -> &[u8] {
        &self.buf[self.args[i].clone()]
    }

    /// Argument `i`, sharing the request's buffer (for a reply that returns it).
    pub(crate) fn bytes(&self, i: usize) -> Bytes {
        self.buf.slice(self.args[i].clone())
    }

    /// Arguments `from..`.
    pub(crate) fn args(&self, from: usize) -> impl ExactSizeIterator<Item = &[u8]> {
        self.args[from..].iter().map(|r| &self.buf[r.clone()])
    }
}

impl RequestCodec {
    /// A decoder that holds requests to `limits`.
    pub(crate) fn new(limits: Limits) -> Self {
        RequestCodec { limits, partial: None }
    }
}

/// The length of the line at the start of `src` without its end (`\r\n` or a bare `\n`),
/// and with it; `None` until it has arrived. A line longer than `max_line` is an error (`what`
/// names it).
fn line_at(src: &[u8], max_line: usize, what: &str) -> Result<Option<(usize, usize)>, RequestError> {
    let end = match src.iter().position(|&b| b == b'\n') {
        Some(end) if end <= max_line => end,
        None if src.len() <= max_line => return Ok(None),
        _ => return protocol(format!("too big {what}")),
    };
    let len = if end > 0 && src[end - 1] == b'\r' { end - 1 } else { end };
    Ok(Some((len, end + 1)))
}

/// Reads the header line (`*3`, `$5`) at `src[*at..]` and moves `at` past it; its number
/// (`None` inside when it is not one) and the line's length; `None` until it has arrived.
fn read_header(
    src: &[u8],
    at: &mut usize,
    max_line: usize,
    what: &str,
) -> Result<Option<(Option<i64>, usize)>, RequestError> {
    let Some((len, taken)) = line_at(&src[*at..], max_line, what)? else { return Ok(None) };
    let number = header_number(&src[*at..*at + len]);
    *at += taken;
    Ok(Some((number, len)))
}

/// An inline command: arguments separated by blanks; `None` until its line has arrived,
/// `Some(None)` for an empty line.
fn inline(src: &mut BytesMut, max_line: usize) -> Result<Option<Option<Request>>, RequestError> {
    let Some((len, taken)) = line_at(src, max_line, "inline request")? else { return Ok(None) };
    let mut line = src.split_to(taken);
    line.truncate(len);
    let buf = line.freeze();
    // Each piece is followed by one blank (or the line's end).
    let mut args = Vec::new();
    let mut at = 0;
    for piece in buf.split(|b| b.is_ascii_whitespace()) {
        if !piece.is_empty() {
            args.push(at..at + piece.len());
        }
        at += piece.len() + 1;
    }
    Ok(Some((!args.is_empty()).then_some(Request { buf, args })))
}

/// The number after a header's type byte (`*3`, `$5`): an optional sign and decimal digits
/// (as `str::parse::<i64>` takes them), without making a string of them.
fn header_number(line: &[u8]) -> Option<i64> {
    let digits = line.get(1..)?;
    let (negative, digits) = match digits.split_first()? {
        (b'-', rest) => (true, rest),
        (b'+', rest) => (false, rest),
        _ => (false, digits),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulated negative, so that i64::MIN is read too.
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_sub((d - b'0') as i64)?;
    }
    if negative { Some(n) } else { n.checked_neg() }
}

impl Decoder for RequestCodec {
    type Item = Request;
    type Error = RequestError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Request>, RequestError> {
        loop {
            let Some(p) = self.partial.as_mut() else {
                if src.is_empty() {
                    return Ok(None);
                }
                if src[0] != b'*' {
                    match inline(src, self.limits.max_line)? {
                        None => return Ok(None),
                        Some(None) => continue,
                        Some(Some(request)) => return Ok(Some(request)),
                    }
                }
                let mut at = 0;
                let Some((number, line)) =
                    read_header(src, &mut at, self.limits.max_line, "mbulk count string")?
                else {
                    return Ok(None);
                };
                match number {
                    // An empty request is skipped, as Redis does.
                    Some(n) if n <= 0 => {
                        src.advance(at);
                        continue;
                    }
                    Some(n) if n as u64 <= self.limits.max_args as u64 => {
                        let argc = n as usize;
                        let args = Vec::with_capacity(argc.min(1024));
                        self.partial = Some(Partial { argc, args, bulk: None, bytes: line, at });
                        continue;
                    }
                    _ => return protocol("invalid multibulk length"),
                }
            };
            while p.args.len() < p.argc {
                match p.bulk {
                    None => {
                        let Some(&first) = src.get(p.at) else { return Ok(None) };
                        if first != b'$' {
                            return protocol(format!("expected '$', got '{}'", first.escape_ascii()));
                        }
                        let Some((number, line)) =
                            read_header(src, &mut p.at, self.limits.max_line, "bulk count string")?
                        else {
                            return Ok(None);
                        };
                        let len = match number {
                            Some(n) if n >= 0 && n as u64 <= self.limits.max_bulk as u64 => n as usize,
                            _ => return protocol("invalid bulk length"),
                        };
                        p.bytes += line + 2 + len + 2;
                        if p.bytes > self.limits.max_request {
                            return protocol(format!(
                                "request larger than {} bytes",
                                self.limits.max_request
                            ));
                        }
                        p.bulk = Some(len);
                    }
                    Some(len) => {
                        let end = p.at + len;
                        if src.len() < end + 2 {
                            src.reserve(end + 2 - src.len());
                            return Ok(None);
                        }
                        if &src[end..end + 2] != b"\r\n" {
                            return protocol("bulk string not ended by CRLF");
                        }
                        p.args.push(p.at..end);
                        p.at = end + 2;
                        p.bulk = None;
                    }
                }
            }
            let p = self.partial.take().expect("a request is being read");
            let buf = src.split_to(p.at).freeze();
            return Ok(Some(Request { buf, args: p.args }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(codec: &mut RequestCodec, input: &[u8]) -> Result<Vec<Request>, RequestError> {
        let mut buf = BytesMut::from(input);
        let mut out = vec![];
        while let Some(request) = codec.decode(&mut buf)? {
            out.push(request);
        }
        Ok(out)
    }

    fn strings(requests: &[Request]) -> Vec<Vec<&str>> {
        requests.iter().map(|r| r.args(0).map(|a| std::str::from_utf8(a).unwrap()).collect()).collect()
    }

    #[test]
    fn arrays_and_inline_commands_are_framed() {
        let mut c = RequestCodec::new(Limits::default());
        let input = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n\r\n*0\r\n  set  a\tb \n*1\r\n$0\r\n\r\n";
        let got = decode_all(&mut c, input).unwrap();
        assert_eq!(strings(&got), vec![vec!["GET", "k"], vec!["PING"], vec!["set", "a", "b"], vec![""]]);
    }

    #[test]
    fn a_request_in_pieces_is_the_same_request() {
        let input = b"*3\r\n$3\r\nSET\r\n$5\r\nkey\r\n\r\n$4\r\nv\0\xffx\r\n*1\r\n$4\r\nPING\r\n";
        let whole = decode_all(&mut RequestCodec::new(Limits::default()), input).unwrap();
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[0].arg(1), b"key\r\n", "bulk strings are binary-safe");
        assert_eq!(whole[0].arg(2), b"v\0\xffx");
        for cut in 1..input.len() {
            let mut c = RequestCodec::new(Limits::default());
            let mut buf = BytesMut::new();
            let mut got = vec![];
            for part in [&input[..cut], &input[cut..]] {
                buf.extend_from_slice(part);
                while let Some(args) = c.decode(&mut buf).unwrap() {
                    got.push(args);
                }
            }
            assert_eq!(got, whole, "cut at {cut}");
            assert!(buf.is_empty(), "cut at {cut}: {buf:?} left");
        }
    }

    #[test]
    fn malformed_and_oversized_requests_are_refused() {
        let limits = Limits { max_bulk: 16, max_args: 4, max_request: 64, max_line: 32 };
        let cases: &[(&[u8], &str)] = &[
            (b"*x\r\n", "invalid multibulk length"),
            (b"*5\r\n", "invalid multibulk length"),
            (b"*1\r\n*1\r\n*1\r\n", "expected '$', got '*'"),
            (b"*1\r\n$-1\r\n", "invalid bulk length"),
            (b"*1\r\n$17\r\n", "invalid bulk length"),
            (b"*1\r\n$99999999999999999999999\r\n", "invalid bulk length"),
            (b"*1\r\n$2\r\nabcd", "bulk string not ended by CRLF"),
            (b"*4\r\n$16\r\n0123456789abcdef\r\n$16\r\n0123456789abcdef\r\n$16\r\n", "request larger"),
            (&[b'P'; 40], "too big inline request"),
            (b"*1\r\n$1111111111111111111111111111111111", "too big bulk count string"),
        ];
        for (input, want) in cases {
            let err = decode_all(&mut RequestCodec::new(limits), input).unwrap_err();
            assert!(err.to_string().contains(want), "{:?}: {err}", input.escape_ascii().to_string());
        }
    }

    /// Headers read in place take the numbers `str::parse::<i64>` takes, and refuse the rest.
    #[test]
    fn header_numbers_as_str_parse_reads_them() {
        let cases = [
            "*3",
            "$0",
            "*-1",
            "$+5",
            "*-",
            "*+",
            "*",
            "$12a",
            "$ 1",
            "*9223372036854775807",
            "*9223372036854775808",
            "*-9223372036854775808",
            "*-9223372036854775809",
            "$007",
            "$-0",
            "$١",
        ];
        for line in cases {
            let want = line.get(1..).and_then(|d| d.parse::<i64>().ok());
            assert_eq!(header_number(line.as_bytes()), want, "{line}");
        }
        assert_eq!(header_number(b""), None);
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let input = b"*1\r\n".repeat(200_000);
        let err = decode_all(&mut RequestCodec::new(Limits::default()), &input).unwrap_err();
        assert_eq!(err.to_string(), "Protocol error: expected '$', got '*'");
    }
}
