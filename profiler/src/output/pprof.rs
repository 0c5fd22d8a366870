//! pprof: a gzipped profile.proto (github.com/google/pprof/blob/main/proto/profile.proto),
//! what `go tool pprof`, Pyroscope and most profile stores read. Encoded by hand: the schema is
//! small and stable, and a protobuf code generator would be a build step for seven messages.
//!
//! One pprof sample per (stack, pid, comm, cgroup), with values [samples, cpu ns]; one location
//! per frame (an address in a binary), one function per name, one mapping per binary.
use std::{
    collections::{BTreeMap, HashMap},
    io::{self, Write},
};

use flate2::{Compression, write::GzEncoder};

use super::protobuf::{Msg, Strings};

use crate::profile::{
    Process, Profile, Sample,
    attribution::{GroupBy, Grouper, owner},
};

/// Writes `profile` as gzipped pprof.
pub fn write_pprof(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let mut gz = GzEncoder::new(w, Compression::new(6));
    gz.write_all(&encode(profile))?;
    gz.finish()?.flush()
}

/// profile.proto field numbers, by message.
mod field {
    pub(super) const SAMPLE_TYPE: u32 = 1;
    pub(super) const SAMPLE: u32 = 2;
    pub(super) const MAPPING: u32 = 3;
    pub(super) const LOCATION: u32 = 4;
    pub(super) const FUNCTION: u32 = 5;
    pub(super) const STRING_TABLE: u32 = 6;
    pub(super) const TIME_NANOS: u32 = 9;
    pub(super) const DURATION_NANOS: u32 = 10;
    pub(super) const PERIOD_TYPE: u32 = 11;
    pub(super) const PERIOD: u32 = 12;
    pub(super) const DEFAULT_SAMPLE_TYPE: u32 = 14;
}

/// The uncompressed profile.proto bytes.
fn encode(p: &Profile) -> Vec<u8> {
    let mut strings = Strings::default();
    let mut out = Msg::default();
    let period_ns = 1_000_000_000 / u64::from(p.meta.frequency_hz.max(1));
    for (kind, unit) in [("samples", "count"), ("cpu", "nanoseconds")] {
        out.msg(field::SAMPLE_TYPE, value_type(&mut strings, kind, unit));
    }
    for s in samples(p) {
        let mut m = Msg::default();
        // Leaf first in pprof; root first in our stacks.
        let frames = &p.stacks[s.stack as usize].frames;
        m.packed(1, frames.iter().rev().map(|&f| u64::from(f) + 1));
        m.packed(2, [s.count, s.count * period_ns]);
        for (key, text, num) in s.labels {
            let mut label = Msg::default();
            label.uint(1, strings.id(key));
            label.uint(2, text.map_or(0, |t| strings.id(&t)));
            label.uint(3, num);
            m.msg(3, label);
        }
        out.msg(field::SAMPLE, m);
    }
    // Each binary's address range, from the frames in it (user: file offsets, mapped 1:1).
    let mut ranges: HashMap<u32, (u64, u64)> = HashMap::new();
    for f in &p.frames {
        let r = ranges.entry(f.binary).or_insert((f.addr, f.addr));
        *r = (r.0.min(f.addr), r.1.max(f.addr));
    }
    // pprof shows the first mapping as the profile's "File": user binaries before the kernel.
    let mut used: Vec<(bool, usize)> = (1..p.binaries.len())
        .filter(|&id| ranges.contains_key(&(id as u32)))
        .map(|id| (p.binaries[id].path.starts_with('['), id))
        .collect();
    used.sort_unstable();
    for (kernel, id) in used {
        let (lo, hi) = ranges[&(id as u32)];
        let b = &p.binaries[id];
        let mut m = Msg::default();
        m.uint(1, id as u64);
        m.uint(2, if kernel { lo } else { 0 });
        m.uint(3, hi + 1);
        m.uint(5, strings.id(&b.path));
        m.uint(6, strings.id(&b.build_id));
        m.uint(7, 1); // has_functions: every location is named, so pprof must not re-symbolize
        out.msg(field::MAPPING, m);
    }
    let mut functions: HashMap<u32, u64> = HashMap::new();
    for (i, f) in p.frames.iter().enumerate() {
        let next = functions.len() as u64 + 1;
        let function = *functions.entry(f.name).or_insert(next);
        let mut m = Msg::default();
        m.uint(1, i as u64 + 1);
        if (f.binary as usize) < p.binaries.len() {
            m.uint(2, f.binary.into());
        }
        m.uint(3, f.addr);
        let mut line = Msg::default();
        line.uint(1, function);
        m.msg(4, line);
        out.msg(field::LOCATION, m);
    }
    let mut by_id: Vec<(u64, u32)> = functions.into_iter().map(|(n, id)| (id, n)).collect();
    by_id.sort_unstable();
    for (id, name) in by_id {
        let name = strings.id(p.str(name));
        let mut m = Msg::default();
        m.uint(1, id);
        m.uint(2, name);
        m.uint(3, name);
        out.msg(field::FUNCTION, m);
    }
    out.uint(field::TIME_NANOS, p.meta.start_unix_ns);
    out.uint(field::DURATION_NANOS, p.meta.duration_ns);
    out.msg(
        field::PERIOD_TYPE,
        value_type(&mut strings, "cpu", "nanoseconds"),
    );
    out.uint(field::PERIOD, period_ns);
    out.uint(field::DEFAULT_SAMPLE_TYPE, strings.id("cpu"));
    // Written last, once every string is known; field order does not matter in protobuf.
    for s in &strings.list {
        out.bytes(field::STRING_TABLE, s.as_bytes());
    }
    out.0
}

fn value_type(strings: &mut Strings, kind: &str, unit: &str) -> Msg {
    let mut m = Msg::default();
    m.uint(1, strings.id(kind));
    m.uint(2, strings.id(unit));
    m
}

/// (key, string value, number value) of a pprof label.
type Label = (&'static str, Option<String>, u64);

struct PprofSample {
    stack: u32,
    count: u64,
    labels: Vec<Label>,
}

/// Samples merged per (stack, pid, comm, cgroup), in a stable order.
fn samples(p: &Profile) -> Vec<PprofSample> {
    let mut counts: BTreeMap<(u32, u32, u32, u64), u64> = BTreeMap::new();
    for s in &p.samples {
        *counts
            .entry((s.stack, s.pid, s.comm, s.cgroup_id))
            .or_default() += 1;
    }
    let grouper = Grouper::new(p, GroupBy::Cgroup);
    let processes: HashMap<u32, &Process> = p.processes.iter().map(|p| (p.pid, p)).collect();
    let mut out = Vec::with_capacity(counts.len());
    for ((stack, pid, comm, cgroup_id), count) in counts {
        // The cgroup path depends on the sample's cgroup id and its process only.
        let key = Sample {
            offset_ns: 0,
            cpu: 0,
            pid,
            tid: pid,
            cgroup_id,
            comm,
            stack,
        };
        let path = grouper.cgroup_path(&key, processes.get(&pid).copied());
        let o = owner(path);
        let mut labels: Vec<Label> = vec![
            ("pid", None, pid.into()),
            ("comm", Some(p.str(comm).to_owned()), 0),
            ("cgroup", Some(path.to_owned()), 0),
        ];
        labels.extend(o.container.map(|c| ("container", Some(c), 0)));
        labels.extend(o.pod.map(|c| ("pod", Some(c), 0)));
        out.push(PprofSample {
            stack,
            count,
            labels,
        });
    }
    out
}

#[cfg(test)]
mod tests;
