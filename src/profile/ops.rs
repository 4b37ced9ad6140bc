//! The op table: per op and stream, how often it ran and how much of its stream's time it
//! took, after PyTorch's `key_averages().table()` and MXNet's `profiler.dumps()`.
//!
//! An instruction's *time* here is the time its stream spent on it alone: from its launch,
//! or the completion of the stream's work before it if that came later, to its completion.
//! On a synchronous stream (CPU) that is its run time. On an asynchronous stream the worker
//! launches ahead of the device, so an instruction's launch-to-done slice also covers the
//! time it waited in the device's queue behind earlier work; counting that wait again for
//! every instruction in the queue would give a stream more time than the run lasted. With
//! this definition the times of one stream's instructions add up to exactly its busy time
//! in [`Profile::summary`] (the length of the union of its slices), and the shares of all
//! rows add up to 100 %.

use std::fmt;
use std::time::Duration;

use super::Profile;
use crate::vm::StreamId;

/// One row of an [`OpTable`]: an op (or an instruction kind) on one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRow {
    /// The op name (`matmul`, `copy`) or the instruction kind (`RecordEvent`, `Access`).
    pub name: &'static str,
    /// The stream it ran on.
    pub stream: StreamId,
    /// The stream's name (`mock:0:compute`).
    pub stream_name: String,
    /// Instructions of this op on this stream.
    pub count: usize,
    /// Their summed time (see the module docs).
    pub total: Duration,
    /// The shortest time of one of them.
    pub min: Duration,
    /// The longest time of one of them.
    pub max: Duration,
    /// `total` as a share of the table's total (every stream's time), in percent.
    pub share: f64,
}

impl OpRow {
    /// The mean time of one instruction.
    pub fn mean(&self) -> Duration {
        // `count` is at least 1 for every row built; u32 covers 4·10⁹ instructions, and
        // beyond that the division is done in nanoseconds.
        match u32::try_from(self.count) {
            Ok(n) if n > 0 => self.total / n,
            _ => Duration::from_nanos((self.total.as_nanos() / self.count.max(1) as u128) as u64),
        }
    }
}

/// Per op and stream: count, total, mean, min and max time and the share of all streams'
/// time, sorted by total time, largest first. Build one with [`Profile::op_table`]; its
/// `Display` prints an aligned table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OpTable {
    /// The rows, largest total first (ties by op name, then stream).
    pub rows: Vec<OpRow>,
    /// The sum of every row's total: the summed busy time of all streams.
    pub total: Duration,
}

/// The time each instruction's stream spent on it alone (indexed as `p.instructions`).
pub(crate) fn exclusive_times(p: &Profile) -> Vec<Duration> {
    let mut per: Vec<Vec<usize>> = vec![Vec::new(); p.streams.len()];
    for (k, i) in p.instructions.iter().enumerate() {
        if let Some(v) = per.get_mut(i.stream.index()) {
            v.push(k);
        }
    }
    let mut out = vec![Duration::ZERO; p.instructions.len()];
    for mut ks in per {
        ks.sort_by_key(|&k| (p.instructions[k].launched, p.instructions[k].program));
        // The end of the union of the slices so far: sorted by start, each slice adds what
        // reaches past it, so the sum over a stream is the union's length.
        let mut reached = Duration::ZERO;
        for k in ks {
            let i = &p.instructions[k];
            out[k] = i.done.saturating_sub(i.launched.max(reached));
            reached = reached.max(i.done);
        }
    }
    out
}

pub(crate) fn build(p: &Profile) -> OpTable {
    let times = exclusive_times(p);
    let mut rows: Vec<OpRow> = Vec::new();
    // Rows keyed by (stream, name): few distinct ops, so a small map.
    let mut index: std::collections::HashMap<(u32, &'static str), usize> = std::collections::HashMap::new();
    for (i, &t) in p.instructions.iter().zip(&times) {
        let k = *index.entry((i.stream.0, i.name)).or_insert_with(|| {
            rows.push(OpRow {
                name: i.name,
                stream: i.stream,
                stream_name: p.streams.get(i.stream.index()).cloned().unwrap_or_else(|| "?".into()),
                count: 0,
                total: Duration::ZERO,
                min: Duration::MAX,
                max: Duration::ZERO,
                share: 0.0,
            });
            rows.len() - 1
        });
        let r = &mut rows[k];
        r.count += 1;
        r.total += t;
        r.min = r.min.min(t);
        r.max = r.max.max(t);
    }
    rows.sort_by(|a, b| b.total.cmp(&a.total).then(a.name.cmp(b.name)).then(a.stream.0.cmp(&b.stream.0)));
    let total: Duration = rows.iter().map(|r| r.total).sum();
    let all = total.as_secs_f64();
    for r in &mut rows {
        r.share = if all > 0.0 { 100.0 * r.total.as_secs_f64() / all } else { 0.0 };
    }
    OpTable { rows, total }
}

impl fmt::Display for OpTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name_w = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(2);
        let stream_w = self.rows.iter().map(|r| r.stream_name.len()).max().unwrap_or(0).max(6);
        writeln!(
            f,
            "{:<name_w$}  {:<stream_w$} {:>8} {:>10} {:>10} {:>10} {:>10} {:>7}",
            "op", "stream", "count", "total ms", "mean us", "min us", "max us", "share"
        )?;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        for r in &self.rows {
            writeln!(
                f,
                "{:<name_w$}  {:<stream_w$} {:>8} {:>10.3} {:>10.2} {:>10.2} {:>10.2} {:>6.1}%",
                r.name,
                r.stream_name,
                r.count,
                r.total.as_secs_f64() * 1e3,
                us(r.mean()),
                us(r.min),
                us(r.max),
                r.share
            )?;
        }
        let count: usize = self.rows.iter().map(|r| r.count).sum();
        write!(f, "total {:.3} ms of stream time over {count} instructions", self.total.as_secs_f64() * 1e3)
    }
}
