//! The trace parser: text in, statements out, and every syntax problem with its line and
//! column.
//!
//! Each line is parsed on its own, so one bad line does not hide the problems of the next:
//! the parser keeps going and returns every [`Diagnostic`] it found along with the
//! statements it could read. It never panics, whatever the bytes.

use super::format::{
    dtype_in_version, parse_device, parse_dtype, parse_stream_type, parse_type, AccessKind, Data,
    FailureKind, Line, Pos, Ref, Stmt, Trace, AFTER_VERSION, MAGIC, PARAMS_VERSION, STRIDES_VERSION, VERSION,
    VIEW_VERSION,
};
use super::progress::{Phase, Progress, STRIDE};
use super::{Diagnostic, TraceError};
use crate::framework::{Attrs, DType, Scalar};

/// One token: its text (quotes removed, escapes resolved) and its 1-based column.
#[derive(Debug, Clone)]
struct Tok {
    text: String,
    col: u32,
}

/// A problem on the current line: column and message.
type Problem = (u32, String);

/// The 1-based place (line or column) of the 0-based `n`th one, held at `u32::MAX` for an
/// input with more lines, or a line with more characters, than that.
pub(crate) fn place(n: usize) -> u32 {
    u32::try_from(n).map_or(u32::MAX, |n| n.saturating_add(1))
}

/// `n` as a count of columns, held at `u32::MAX`.
fn width(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Split a line into tokens at whitespace; `"..."` may appear inside a token and keeps its
/// spaces; `#` at the start of a token begins a comment.
fn tokenize(line: &str) -> Result<Vec<Tok>, Problem> {
    let mut toks = Vec::new();
    let mut chars = line.chars().enumerate().peekable();
    while let Some(&(i, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if c == '#' {
            break;
        }
        let col = place(i);
        let mut text = String::new();
        while let Some(&(j, c)) = chars.peek() {
            if c.is_whitespace() {
                break;
            }
            chars.next();
            if c != '"' {
                text.push(c);
                continue;
            }
            let open = place(j);
            loop {
                match chars.next() {
                    None => {
                        return Err((open, "unterminated string (a `\"` without its closing `\"`)".into()))
                    }
                    Some((_, '"')) => break,
                    Some((k, '\\')) => match chars.next() {
                        Some((_, 'n')) => text.push('\n'),
                        Some((_, 't')) => text.push('\t'),
                        Some((_, 'r')) => text.push('\r'),
                        Some((_, '"')) => text.push('"'),
                        Some((_, '\\')) => text.push('\\'),
                        Some((_, 'u')) => text.push(unicode_escape(&mut chars, place(k))?),
                        _ => {
                            return Err((
                                place(k),
                                "unknown escape (expected \\n, \\t, \\r, \\\", \\\\ or \\u{..})".into(),
                            ))
                        }
                    },
                    Some((_, c)) => text.push(c),
                }
            }
        }
        toks.push(Tok { text, col });
    }
    Ok(toks)
}

fn unicode_escape(
    chars: &mut std::iter::Peekable<impl Iterator<Item = (usize, char)>>,
    col: u32,
) -> Result<char, Problem> {
    let bad = || (col, "bad unicode escape (expected \\u{HEX})".to_string());
    if chars.next().map(|c| c.1) != Some('{') {
        return Err(bad());
    }
    let mut hex = String::new();
    loop {
        match chars.next() {
            Some((_, '}')) => break,
            Some((_, c)) if c.is_ascii_hexdigit() && hex.len() < 6 => hex.push(c),
            _ => return Err(bad()),
        }
    }
    u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).ok_or_else(bad)
}

/// Parse trace text. Returns the statements read and every problem found; the trace is
/// usable only if the list of problems is empty.
pub fn parse_str(file: &str, text: &str) -> (Trace, Vec<Diagnostic>) {
    // Cannot fail: nothing asks `none()` to stop.
    parse_str_with(file, text, super::progress::none()).unwrap_or_default()
}

/// [`parse_str`], counting the bytes parsed in `progress` ([`Phase::Parsing`]) and stopping
/// with [`TraceError::Interrupted`] once `progress` asks for a stop.
pub fn parse_str_with(
    file: &str,
    text: &str,
    progress: &Progress,
) -> Result<(Trace, Vec<Diagnostic>), TraceError> {
    progress.start(Phase::Parsing, text.len() as u64);
    let mut parsed = 0u64;
    let mut trace = Trace { file: file.to_string(), ..Trace::default() };
    let mut diags = Vec::new();
    let mut header = false;
    // The header's version (this build's where the header is missing or unreadable).
    let mut version = VERSION;
    for (n, raw) in text.split('\n').enumerate() {
        if n as u64 % STRIDE == 0 {
            progress.set_done(parsed);
            if progress.stop_requested() {
                return Err(TraceError::Interrupted);
            }
        }
        parsed += raw.len() as u64 + 1;
        let line = place(n);
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let mut problem = |col: u32, message: String| {
            diags.push(Diagnostic { file: file.to_string(), line, col, message });
        };
        let toks = match tokenize(raw) {
            Ok(t) => t,
            Err((col, m)) => {
                problem(col, m);
                continue;
            }
        };
        let Some(first) = toks.first() else { continue };
        if !header {
            header = true;
            if first.text == MAGIC {
                match toks.get(1).map(|t| (t, t.text.parse::<u32>())) {
                    Some((_, Ok(v @ 1..=VERSION))) if toks.len() == 2 => version = v,
                    Some((t, Ok(v))) if toks.len() == 2 => problem(
                        t.col,
                        format!("unsupported trace version {v}; this build reads versions 1 to {VERSION}"),
                    ),
                    _ => problem(first.col, format!("expected `{MAGIC} {VERSION}` as the first line")),
                }
                continue;
            }
            problem(1, format!("expected `{MAGIC} {VERSION}` as the first line, found `{}`", first.text));
        }
        match statement(&toks, version) {
            Ok(stmt) => trace.lines.push(Line { pos: Pos { line, col: first.col }, stmt }),
            Err((col, m)) => problem(col, m),
        }
    }
    if !header {
        diags.push(Diagnostic {
            file: file.to_string(),
            line: 1,
            col: 1,
            message: format!("empty trace: expected `{MAGIC} {VERSION}` as the first line"),
        });
    }
    progress.set_done(text.len() as u64);
    Ok((trace, diags))
}

/// Cursor over one line's tokens, and the version of the trace they are read under.
struct Cur<'a> {
    toks: &'a [Tok],
    i: usize,
    version: u32,
}

impl<'a> Cur<'a> {
    /// Column just past the last token (where a missing token was expected).
    fn end_col(&self) -> u32 {
        self.toks.last().map_or(1, |t| t.col.saturating_add(width(t.text.chars().count())))
    }

    fn next(&mut self, what: &str) -> Result<&'a Tok, Problem> {
        let t = self.toks.get(self.i).ok_or_else(|| (self.end_col(), format!("expected {what}")))?;
        self.i += 1;
        Ok(t)
    }

    fn peek(&self) -> Option<&'a Tok> {
        self.toks.get(self.i)
    }

    fn done(&self) -> Result<(), Problem> {
        match self.peek() {
            None => Ok(()),
            Some(t) => Err((t.col, format!("unexpected `{}` at the end of the statement", t.text))),
        }
    }

    fn reference(&mut self, prefix: char, what: &str) -> Result<Ref, Problem> {
        let t = self.next(&format!("{what} (`{prefix}N`)"))?;
        parse_ref(&t.text, t.col, prefix, what)
    }

    fn stream(&mut self) -> Result<Ref, Problem> {
        self.reference('s', "a stream")
    }

    fn tensor(&mut self) -> Result<Ref, Problem> {
        self.reference('t', "a tensor")
    }

    /// Refuse `what`, at `col`, in a trace of a version before `since`.
    fn since(&self, since: u32, col: u32, what: &str) -> Result<(), Problem> {
        match self.version < since {
            true => Err((
                col,
                format!(
                    "{what} needs version {since} of the format; the header says version {}",
                    self.version
                ),
            )),
            false => Ok(()),
        }
    }

    /// Refuse `dtype`, at `col`, if this trace's version does not have it.
    fn dtype_here(&self, dtype: DType, col: u32) -> Result<(), Problem> {
        match dtype_in_version(dtype, self.version) {
            true => Ok(()),
            false => {
                self.since(VIEW_VERSION, col, &format!("dtype `{dtype}` (versions 1 and 2 have f32 and i64)"))
            }
        }
    }
}

fn parse_ref(s: &str, col: u32, prefix: char, what: &str) -> Result<Ref, Problem> {
    let bad = || (col, format!("expected {what} (`{prefix}N`), found `{s}`"));
    let digits = s.strip_prefix(prefix).ok_or_else(bad)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let id = digits.parse().map_err(|_| bad())?;
    Ok(Ref { id, col })
}

/// `key=a,b,c` lists of references; the column of each item is computed from the token's.
fn parse_ref_list(t: &Tok, value: &str, prefix: char, what: &str) -> Result<Vec<Ref>, Problem> {
    // `value` is the end of `t.text`, after `key=`.
    let mut col = t.col.saturating_add(width(t.text.len() - value.len()));
    let mut out = Vec::new();
    if value.is_empty() {
        return Ok(out);
    }
    for item in value.split(',') {
        out.push(parse_ref(item, col, prefix, what)?);
        col = col.saturating_add(width(item.chars().count())).saturating_add(1);
    }
    Ok(out)
}

fn statement(toks: &[Tok], version: u32) -> Result<Stmt, Problem> {
    let mut c = Cur { toks, i: 1, version };
    // Cannot fail: `parse_str` skips lines without tokens.
    let kw = &toks[0];
    let stmt = match kw.text.as_str() {
        "device" => {
            let t = c.next("a device like `mock:0`")?;
            Stmt::Device(parse_device(&t.text).map_err(|m| (t.col, m))?)
        }
        "stream" => {
            let id = c.stream()?;
            let t = c.next("the stream's device")?;
            let device = parse_device(&t.text).map_err(|m| (t.col, m))?;
            let t = c.next("the stream type (compute, h2d or d2h)")?;
            let ty = parse_stream_type(&t.text).map_err(|m| (t.col, m))?;
            Stmt::Stream { id, device, ty }
        }
        "comm" => {
            let t = c.next("the communicator's name")?;
            let name = t.text.clone();
            let t = c.next("the communicator's backend (mock, mpi or nccl)")?;
            let backend = t.text.clone();
            let t = c.next("the members' devices, like `mock:0,mock:1`")?;
            let mut members = Vec::new();
            for d in t.text.split(',') {
                members.push(parse_device(d).map_err(|m| (t.col, m))?);
            }
            Stmt::Comm { name, backend, members }
        }
        "tensor" => {
            let id = c.tensor()?;
            let t = c.next("the tensor's type, like `f32[2,3]`")?;
            let (dtype, shape) = parse_type(&t.text).map_err(|m| (t.col, m))?;
            c.dtype_here(dtype, t.col)?;
            let t = c.next("the tensor's device")?;
            let device = parse_device(&t.text).map_err(|m| (t.col, m))?;
            let strides = match c.peek() {
                Some(t) if t.text.starts_with("strides=") => {
                    c.since(STRIDES_VERSION, t.col, "`strides=` on a tensor")?;
                    Some(strides(&mut c)?)
                }
                _ => None,
            };
            Stmt::Tensor { id, dtype, shape, device, strides }
        }
        "view" => view(&mut c, kw.col)?,
        "call" => call(&mut c)?,
        "record" => {
            let stream = c.stream()?;
            let event = c.reference('e', "an event")?;
            let mut tensors = Vec::new();
            while c.peek().is_some() {
                tensors.push(c.tensor()?);
            }
            Stmt::Record { stream, event, tensors }
        }
        "wait" => Stmt::Wait { stream: c.stream()?, event: c.reference('e', "an event")? },
        "after" => {
            c.since(AFTER_VERSION, kw.col, "`after`")?;
            let (stream, source) = (c.stream()?, c.stream()?);
            let mut tensors = vec![c.tensor()?];
            while c.peek().is_some() {
                tensors.push(c.tensor()?);
            }
            Stmt::After { stream, source, tensors }
        }
        "barrier" => Stmt::Barrier { stream: c.stream()? },
        "release" => Stmt::Release { stream: c.stream()?, tensor: c.tensor()? },
        "access" => access(&mut c)?,
        "expect" => expect(&mut c)?,
        other => {
            return Err((
                kw.col,
                format!(
                    "unknown statement `{other}` (expected device, stream, comm, tensor, view, call, record, \
                     wait, after, barrier, release, access or expect)"
                ),
            ))
        }
    };
    c.done()?;
    Ok(stmt)
}

/// `strides=A,B,..`: one stride per dimension, none for a 0-d layout.
fn strides(c: &mut Cur<'_>) -> Result<Vec<isize>, Problem> {
    let t = c.next("`strides=` and the strides, one per dimension")?;
    let list = t
        .text
        .strip_prefix("strides=")
        .ok_or_else(|| (t.col, format!("expected `strides=`, found `{}`", t.text)))?;
    let mut strides = Vec::new();
    // A 0-d layout has no strides: `strides=` with nothing after it.
    if !list.is_empty() {
        let mut at = t.col.saturating_add(width("strides=".len()));
        for item in list.split(',') {
            strides
                .push(item.parse::<isize>().map_err(|_| (at, format!("stride `{item}` is not an integer")))?);
            at = at.saturating_add(width(item.chars().count())).saturating_add(1);
        }
    }
    Ok(strides)
}

/// `view tN tM TYPE strides=A,B,.. offset=K` (the keyword at `col`).
fn view(c: &mut Cur<'_>, col: u32) -> Result<Stmt, Problem> {
    c.since(VIEW_VERSION, col, "`view`")?;
    let id = c.tensor()?;
    let base = c.reference('t', "the tensor whose storage it views")?;
    let t = c.next("the view's type, like `f32[3,2]`")?;
    let (dtype, shape) = parse_type(&t.text).map_err(|m| (t.col, m))?;
    let type_col = t.col;
    let strides = strides(c)?;
    let t = c.next("`offset=` and the storage element the view starts at")?;
    let offset = t
        .text
        .strip_prefix("offset=")
        .ok_or_else(|| (t.col, format!("expected `offset=`, found `{}`", t.text)))?;
    let offset = offset
        .parse::<usize>()
        .map_err(|_| (t.col, format!("offset `{offset}` is not a non-negative integer")))?;
    Ok(Stmt::View { id, base, dtype, shape, strides, offset, type_col })
}

fn call(c: &mut Cur<'_>) -> Result<Stmt, Problem> {
    let stream = c.stream()?;
    let op = c.next("an op name")?;
    // Letters, digits, `_` and `.`, and a collective's `@communicator` (`all_reduce.sum@dp`).
    let name_ok = |s: &str| s.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '.');
    let ok = match op.text.split_once('@') {
        Some((name, comm)) => name_ok(name) && !comm.is_empty() && !comm.contains('@'),
        None => name_ok(&op.text),
    };
    if !ok || op.text.contains('=') {
        return Err((op.col, format!("expected an op name, found `{}`", op.text)));
    }
    let (mut inputs, mut outputs, mut scalar) = (None, None, None);
    let (mut transpose_a, mut transpose_b, mut dtype) = (None, None, None);
    let (mut ints, mut scalars): (Option<Vec<i64>>, Option<Vec<Scalar>>) = (None, None);
    let flag = |t: &Tok, v: &str| match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err((t.col, format!("`{v}` is not `true` or `false`"))),
    };
    while let Some(t) = c.peek() {
        c.i += 1;
        let (k, v) = t
            .text
            .split_once('=')
            .ok_or_else(|| (t.col, format!("expected `in=`, `out=` or an attribute, found `{}`", t.text)))?;
        let dup = || (t.col, format!("`{k}=` given twice"));
        match k {
            "in" if inputs.is_none() => inputs = Some(parse_ref_list(t, v, 't', "a tensor")?),
            "out" if outputs.is_none() => outputs = Some(parse_ref_list(t, v, 't', "a tensor")?),
            "scalar" if scalar.is_none() => {
                scalar = Some(Scalar::Float(
                    v.parse::<f64>().map_err(|_| (t.col, format!("`{v}` is not a number")))?,
                ))
            }
            "int" | "bool" | "dtype" if c.version < VIEW_VERSION => {
                c.since(VIEW_VERSION, t.col, &format!("the attribute `{k}=`"))?
            }
            "int" if scalar.is_none() => {
                scalar = Some(Scalar::Int(
                    v.parse::<i64>().map_err(|_| (t.col, format!("`{v}` is not a 64-bit integer")))?,
                ))
            }
            "bool" if scalar.is_none() => scalar = Some(Scalar::Bool(flag(t, v)?)),
            "ints" | "scalars" if c.version < PARAMS_VERSION => {
                c.since(PARAMS_VERSION, t.col, &format!("the attribute `{k}=`"))?
            }
            "ints" if ints.is_none() => {
                let list = v.split(',').filter(|s| !s.is_empty()).map(|s| s.parse::<i64>().ok());
                ints = Some(
                    list.collect::<Option<_>>()
                        .ok_or_else(|| (t.col, format!("`{v}` is not a list of 64-bit integers")))?,
                )
            }
            "scalars" if scalars.is_none() => {
                let list = v.split(',').filter(|s| !s.is_empty()).map(crate::vm::params::parse_scalar);
                scalars = Some(
                    list.collect::<Option<_>>()
                        .ok_or_else(|| (t.col, format!("`{v}` is not a list of numbers and booleans")))?,
                )
            }
            "dtype" if dtype.is_none() => dtype = Some(parse_dtype(v).map_err(|m| (t.col, m))?),
            "transpose_a" if transpose_a.is_none() => transpose_a = Some(flag(t, v)?),
            "transpose_b" if transpose_b.is_none() => transpose_b = Some(flag(t, v)?),
            "in" | "out" | "transpose_a" | "transpose_b" | "dtype" | "ints" | "scalars" => return Err(dup()),
            "scalar" | "int" | "bool" => {
                return Err((t.col, format!("`{k}`: a call takes one scalar (scalar=, int= or bool=)")))
            }
            _ => {
                return Err((
                    t.col,
                    format!(
                        "unknown attribute `{k}` (expected in, out, scalar, int, bool, dtype, transpose_a, transpose_b, ints or scalars)"
                    ),
                ))
            }
        }
    }
    Ok(Stmt::Call {
        stream,
        op: op.text.clone(),
        op_col: op.col,
        inputs: inputs.unwrap_or_default(),
        outputs: outputs.unwrap_or_default(),
        attrs: dtype
            .map_or(Attrs::default(), |d| Attrs::default().with_dtype(d))
            .with_value(scalar.unwrap_or(Scalar::Float(0.0)))
            .with_transpose_a(transpose_a.unwrap_or(false))
            .with_transpose_b(transpose_b.unwrap_or(false))
            .with_params(&ints.unwrap_or_default(), &scalars.unwrap_or_default())
            .map_err(|e| (op.col, e.to_string()))?,
    })
}

fn access(c: &mut Cur<'_>) -> Result<Stmt, Problem> {
    let stream = c.stream()?;
    let what = c.next("read, wait or write")?;
    let tensor = c.tensor()?;
    let kind = match what.text.as_str() {
        "read" => AccessKind::Read,
        "wait" => AccessKind::Wait,
        "write" => AccessKind::Write(data(c)?),
        other => return Err((what.col, format!("expected read, wait or write, found `{other}`"))),
    };
    Ok(Stmt::Access { stream, tensor, kind })
}

fn data(c: &mut Cur<'_>) -> Result<Data, Problem> {
    let t = c.next("the data: a dtype and values, or `file=\"...\"`")?;
    if let Some(path) = t.text.strip_prefix("file=") {
        let path = path.to_string();
        let (mut offset, mut bytes, mut sum) = (None, None, None);
        while let Some(t) = c.peek() {
            c.i += 1;
            let (k, v) = t.text.split_once('=').ok_or_else(|| (t.col, format!("unexpected `{}`", t.text)))?;
            let num = |v: &str| v.parse::<u64>().map_err(|_| (t.col, format!("`{v}` is not a byte count")));
            match k {
                "offset" => offset = Some(num(v)?),
                "bytes" => bytes = Some(num(v)?),
                "fnv1a64" => sum = Some(parse_checksum(v).map_err(|m| (t.col, m))?),
                _ => return Err((t.col, format!("unknown key `{k}` (expected offset, bytes or fnv1a64)"))),
            }
        }
        let end = c.end_col();
        let need = |v: Option<u64>, k: &str| v.ok_or_else(|| (end, format!("expected `{k}=`")));
        return Ok(Data::File {
            path,
            offset: need(offset, "offset")?,
            bytes: need(bytes, "bytes")?,
            checksum: need(sum, "fnv1a64")?,
        });
    }
    let dtype = parse_dtype(&t.text).map_err(|m| (t.col, m))?;
    c.dtype_here(dtype, t.col)?;
    let mut bytes = Vec::new();
    while let Some(t) = c.peek() {
        c.i += 1;
        if let Some(h) = t.text.strip_prefix("0x") {
            // A float's raw bits (NaN payloads), as many hex digits as the element has.
            let bits = (dtype.is_floating() && h.len() == 2 * dtype.size())
                .then(|| u64::from_str_radix(h, 16).ok())
                .flatten()
                .ok_or_else(|| {
                    (
                        t.col,
                        format!(
                            "`{}` is not 0x + {} hex digits of a {dtype}'s bits",
                            t.text,
                            2 * dtype.size()
                        ),
                    )
                })?;
            let le = bits.to_le_bytes();
            let mut b = le[..dtype.size()].to_vec();
            if cfg!(target_endian = "big") {
                b.reverse();
            }
            bytes.extend_from_slice(&b);
            continue;
        }
        let value = |t: &str| -> Option<Scalar> {
            match dtype {
                DType::Bool => match t {
                    "0" | "false" => Some(Scalar::Bool(false)),
                    "1" | "true" => Some(Scalar::Bool(true)),
                    _ => None,
                },
                DType::U8 => t.parse::<u8>().ok().map(|v| Scalar::Int(i64::from(v))),
                DType::I32 => t.parse::<i32>().ok().map(|v| Scalar::Int(i64::from(v))),
                DType::I64 => t.parse::<i64>().ok().map(Scalar::Int),
                DType::F64 => t.parse::<f64>().ok().map(Scalar::Float),
                // f32 and narrower: parsed as an f32, which the narrower types round from
                // exactly as from the decimal (their values are f32 values).
                _ => t.parse::<f32>().ok().map(|v| Scalar::Float(f64::from(v))),
            }
        };
        let v = value(&t.text).ok_or_else(|| {
            (
                t.col,
                format!(
                    "`{}` is not a {dtype} value (or 0x + {} hex digits of a float's bits)",
                    t.text,
                    2 * dtype.size()
                ),
            )
        })?;
        crate::vm::write_element(dtype, v, &mut bytes);
    }
    Ok(Data::Inline(dtype, bytes))
}

fn parse_checksum(v: &str) -> Result<u64, String> {
    let h = v.strip_prefix("0x").ok_or_else(|| format!("checksum `{v}` must be 0x + 16 hex digits"))?;
    if h.len() != 16 {
        return Err(format!("checksum `{v}` must be 0x + 16 hex digits"));
    }
    u64::from_str_radix(h, 16).map_err(|_| format!("checksum `{v}` must be 0x + 16 hex digits"))
}

fn expect(c: &mut Cur<'_>) -> Result<Stmt, Problem> {
    let t = c.next("a tensor (`tN`) or `error`")?;
    if t.text != "error" {
        let tensor = parse_ref(&t.text, t.col, 't', "a tensor or `error`")?;
        let s = c.next("`fnv1a64=0x...`")?;
        let v = s
            .text
            .strip_prefix("fnv1a64=")
            .ok_or_else(|| (s.col, format!("expected `fnv1a64=0x...`, found `{}`", s.text)))?;
        let checksum = parse_checksum(v).map_err(|m| (s.col, m))?;
        return Ok(Stmt::Expect { tensor, checksum });
    }
    let k = c.next("kernel or panic")?;
    let kind = match k.text.as_str() {
        "kernel" => FailureKind::Kernel,
        "panic" => FailureKind::Panic,
        other => return Err((k.col, format!("expected kernel or panic, found `{other}`"))),
    };
    let (mut op, mut message) = (None, None);
    while let Some(t) = c.peek() {
        c.i += 1;
        match t.text.split_once('=') {
            Some(("op", v)) => op = Some(v.to_string()),
            Some(("message", v)) => message = Some(v.to_string()),
            _ => return Err((t.col, format!("expected `op=` or `message=`, found `{}`", t.text))),
        }
    }
    let end = c.end_col();
    Ok(Stmt::ExpectError {
        kind,
        op: op.ok_or_else(|| (end, "expected `op=`".to_string()))?,
        message: message.ok_or_else(|| (end, "expected `message=`".to_string()))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_round_trips() {
        let text = "eagervm-trace 5\n\
            device cpu:0\n\
            device mock:0\n\
            stream s0 cpu:0 compute\n\
            stream s1 mock:0 h2d\n\
            tensor t0 f32[2,3] cpu:0\n\
            tensor t1 i64[] mock:0\n\
            tensor t4 f32[2,3] cpu:0 strides=1,2\n\
            view t2 t0 f32[3,2] strides=1,3 offset=0\n\
            view t3 t0 f32[] strides= offset=5\n\
            call s0 fill out=t1 int=-3 dtype=bf16\n\
            call s0 fill out=t2 bool=false\n\
            access s0 write t0 f32 1 -2.5 0x7fc00001 inf -0 3\n\
            access s0 write t1 file=\"x y.bin\" offset=8 bytes=16 fnv1a64=0x00000000000000ff\n\
            call s1 copy in=t0 out=t1 scalar=-0.5\n\
            call s1 fill out=t1\n\
            call s0 matmul in=t0,t0 out=t1 transpose_a=true\n\
            call s0 matmul in=t0,t0 out=t1 scalar=2.0 transpose_b=true\n\
            call s0 sum in=t0 out=t1 ints=0,-1,1\n\
            call s0 clamp in=t0 out=t0 scalar=1.5 ints= scalars=-1,0.5,NaN,true\n\
            record s1 e3 t0 t1\n\
            wait s1 e3\n\
            after s0 s1 t1 t0\n\
            barrier s0\n\
            release s1 t1\n\
            access s0 read t0\n\
            access s0 wait t0\n\
            expect t0 fnv1a64=0x0123456789abcdef\n\
            expect error kernel op=fail message=\"fail \\\"op\\\": 7\\n\"\n";
        let (trace, diags) = parse_str("x", text);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(trace.lines.len(), 28);
        // An empty list is the default and is not written back.
        assert_eq!(trace.to_text(), text.replace(" ints= ", " "));
        let (again, d2) = parse_str("x", &trace.to_text());
        assert!(d2.is_empty());
        assert_eq!(again, trace);
    }

    #[test]
    fn call_attributes_are_named_and_typed() {
        let (t, d) = parse_str(
            "f",
            "eagervm-trace 2\ncall s0 matmul in=t0,t1 out=t2 transpose_b=false transpose_a=true\n",
        );
        assert!(d.is_empty(), "{d:?}");
        match &t.lines[0].stmt {
            Stmt::Call { attrs, .. } => assert_eq!(*attrs, Attrs::transposed(true, false)),
            other => panic!("{other:?}"),
        }
        // Written back with only what differs from the defaults.
        assert_eq!(t.to_text(), "eagervm-trace 5\ncall s0 matmul in=t0,t1 out=t2 transpose_a=true\n");
        let (_, d) = parse_str("f", "eagervm-trace 2\ncall s0 matmul in=t0,t1 out=t2 transpose_a=yes\n");
        assert_eq!((d[0].line, d[0].col), (2, 32), "{d:?}");
        assert!(d[0].message.contains("`yes` is not `true` or `false`"), "{d:?}");
        let (_, d) = parse_str("f", "eagervm-trace 2\ncall s0 matmul transpose_a=true transpose_a=true\n");
        assert!(d[0].message.contains("given twice"), "{d:?}");
        let (_, d) = parse_str("f", "eagervm-trace 2\ncall s0 matmul axis=1\n");
        assert!(d[0].message.contains("unknown attribute `axis`"), "{d:?}");
        // Parameter lists: version 4, typed, once each.
        let (t, d) = parse_str("f", "eagervm-trace 4\ncall s0 sum in=t0 out=t1 ints=1,2 scalars=1,2.0\n");
        assert!(d.is_empty(), "{d:?}");
        match &t.lines[0].stmt {
            Stmt::Call { attrs, .. } => {
                assert_eq!(attrs.params().ints(), &[1, 2]);
                assert_eq!(attrs.params().scalars(), &[Scalar::Int(1), Scalar::Float(2.0)]);
            }
            other => panic!("{other:?}"),
        }
        let (_, d) = parse_str("f", "eagervm-trace 3\ncall s0 sum in=t0 out=t1 ints=1\n");
        assert!(d[0].message.contains("needs version 4"), "{d:?}");
        let (_, d) = parse_str("f", "eagervm-trace 4\ncall s0 sum in=t0 out=t1 ints=1,x\n");
        assert!(d[0].message.contains("not a list of 64-bit integers"), "{d:?}");
        let (_, d) = parse_str("f", "eagervm-trace 4\ncall s0 sum in=t0 out=t1 scalars=1,yes\n");
        assert!(d[0].message.contains("not a list of numbers"), "{d:?}");
        let (_, d) = parse_str("f", "eagervm-trace 4\ncall s0 sum ints=1 ints=2\n");
        assert!(d[0].message.contains("given twice"), "{d:?}");
        // A tensor's own strides: version 5, written back as read.
        let text = "eagervm-trace 5\ntensor t0 f32[4,3] cpu:0 strides=1,4\ntensor t1 f32[2] cpu:0\n";
        let (t, d) = parse_str("f", text);
        assert!(d.is_empty(), "{d:?}");
        match &t.lines[0].stmt {
            Stmt::Tensor { strides, .. } => assert_eq!(strides.as_deref(), Some(&[1, 4][..])),
            other => panic!("{other:?}"),
        }
        assert_eq!(t.to_text(), text);
        let (_, d) = parse_str("f", "eagervm-trace 4\ntensor t0 f32[4,3] cpu:0 strides=1,4\n");
        assert!(d[0].message.contains("needs version 5"), "{d:?}");
        let (_, d) = parse_str("f", "eagervm-trace 5\ntensor t0 f32[4,3] cpu:0 strides=1,x\n");
        assert!(d[0].message.contains("stride `x` is not an integer"), "{d:?}");
    }

    #[test]
    fn problems_name_line_and_column() {
        let text = "eagervm-trace 1\ncall s0 add in=t1,x2 out=t3\nstream s0 cpu:0 sideways\nfoo\n";
        let (_, d) = parse_str("f.trace", text);
        let at: Vec<(u32, u32)> = d.iter().map(|d| (d.line, d.col)).collect();
        assert_eq!(at, [(2, 19), (3, 17), (4, 1)], "{d:?}");
        assert!(d[0].message.contains("`x2`"));
        assert_eq!(d[0].to_string().split(": ").next(), Some("f.trace:2:19"));
    }

    #[test]
    fn header_is_required_and_versioned() {
        assert_eq!(parse_str("f", "").1.len(), 1);
        let (_, d) = parse_str("f", "eagervm-trace 9\n");
        assert!(d[0].message.contains("version 9"), "{d:?}");
        let (t, d) = parse_str("f", "device cpu:0\n");
        assert_eq!(d.len(), 1);
        assert_eq!(t.lines.len(), 1, "the statement is still read");
    }

    #[test]
    fn older_versions_are_read_without_the_statements_of_later_ones() {
        let body = "device cpu:0\nstream s0 cpu:0 compute\ntensor t0 f32[] cpu:0\n";
        let (t, d) = parse_str("f", &format!("eagervm-trace 1\n{body}"));
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(t.lines.len(), 3);
        let (_, d) = parse_str("f", &format!("eagervm-trace 1\n{body}after s0 s1 t0\n"));
        let at: Vec<(u32, u32)> = d.iter().map(|d| (d.line, d.col)).collect();
        assert_eq!(at, [(5, 1)], "{d:?}");
        assert!(d[0].message.contains("version 2"), "{d:?}");
        let (t, d) = parse_str("f", &format!("eagervm-trace 2\n{body}after s0 s1 t0\n"));
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(t.lines.len(), 4);
        // Nor those of version 3, each refused at its column.
        let (_, d) = parse_str("f", &format!("eagervm-trace 2\n{body}view t1 t0 f32[] strides= offset=0\n"));
        assert_eq!((d[0].line, d[0].col), (5, 1), "{d:?}");
        assert!(d[0].message.contains("`view` needs version 3"), "{d:?}");
        let (_, d) =
            parse_str("f", "eagervm-trace 1\ntensor t0 f64[] cpu:0\ncall s0 fill out=t0 bool=true\n");
        let at: Vec<(u32, u32)> = d.iter().map(|d| (d.line, d.col)).collect();
        assert_eq!(at, [(2, 11), (3, 21)], "{d:?}");
        // `after` names two streams and at least one tensor.
        let (_, d) = parse_str("f", "eagervm-trace 2\nafter s0 s1\nafter s0 t1\n");
        assert_eq!(d.len(), 2, "{d:?}");
    }
}
