//! Decodes our own pprof bytes with a minimal protobuf reader and checks the fields that
//! `go tool pprof` relies on (tests/tests/pprof.rs runs the real thing).
use std::io::Read as _;

use super::*;
use crate::profile::{Binary, Cgroup, Frame, FrameKind, Interner, Meta, Sample};

#[derive(Debug)]
enum Value {
    Int(u64),
    Bytes(Vec<u8>),
}

fn varint(b: &mut &[u8]) -> u64 {
    let mut v = 0;
    for shift in (0..64).step_by(7) {
        let byte = b[0];
        *b = &b[1..];
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    v
}

/// Every (field number, value) of one message, in order.
fn fields(mut b: &[u8]) -> Vec<(u32, Value)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b);
        let value = match key & 7 {
            0 => Value::Int(varint(&mut b)),
            2 => {
                let n = varint(&mut b) as usize;
                let (v, rest) = b.split_at(n);
                b = rest;
                Value::Bytes(v.to_vec())
            }
            t => panic!("wire type {t} we never write"),
        };
        out.push(((key >> 3) as u32, value));
    }
    out
}

fn all(b: &[u8], field: u32) -> Vec<Vec<u8>> {
    fields(b)
        .into_iter()
        .filter_map(|(f, v)| match v {
            Value::Bytes(v) if f == field => Some(v),
            _ => None,
        })
        .collect()
}

fn int(b: &[u8], field: u32) -> u64 {
    fields(b)
        .into_iter()
        .find_map(|(f, v)| match v {
            Value::Int(v) if f == field => Some(v),
            _ => None,
        })
        .unwrap_or(0)
}

fn packed(b: &[u8], field: u32) -> Vec<u64> {
    let mut out = Vec::new();
    for mut bytes in all(b, field).iter().map(Vec::as_slice) {
        while !bytes.is_empty() {
            out.push(varint(&mut bytes));
        }
    }
    out
}

fn profile() -> Profile {
    let mut i = Interner::new(Meta {
        start_unix_ns: 1_700_000_000_000_000_000,
        duration_ns: 2_000_000_000,
        frequency_hz: 100,
        ..Meta::default()
    });
    let exe = i.binary(Binary {
        path: "/usr/bin/app".into(),
        build_id: "abcdef0123".into(),
    });
    let kernel = i.binary(Binary {
        path: "[kernel.kallsyms]".into(),
        build_id: String::new(),
    });
    let (main, work, read) = (i.string("main"), i.string("work"), i.string("ksys_read"));
    let main = i.frame(Frame {
        name: main,
        addr: 0x1100,
        binary: exe,
        ..Frame::default()
    });
    let work = i.frame(Frame {
        name: work,
        addr: 0x1200,
        binary: exe,
        ..Frame::default()
    });
    let read = i.frame(Frame {
        name: read,
        kind: FrameKind::Kernel,
        addr: 0xffff_ffff_8100_0000,
        binary: kernel,
        ..Frame::default()
    });
    let stack = i.stack(vec![main, work, read]);
    let comm = i.string("app");
    for _ in 0..3 {
        i.sample(Sample {
            offset_ns: 0,
            cpu: 0,
            pid: 7,
            tid: 7,
            cgroup_id: 5,
            comm,
            stack,
        });
    }
    let id = "3f1c2b9a8d7e6f50413c2b1a0f9e8d7c6b5a49382716051a2b3c4d5e6f708192";
    i.cgroup(Cgroup {
        id: 5,
        path: format!("/system.slice/docker-{id}.scope"),
    });
    i.finish()
}

#[test]
fn encodes_what_pprof_reads() {
    let mut gz = Vec::new();
    write_pprof(&profile(), &mut gz).unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .read_to_end(&mut raw)
        .unwrap();
    let strings: Vec<String> = all(&raw, field::STRING_TABLE)
        .into_iter()
        .map(|s| String::from_utf8(s).unwrap())
        .collect();
    assert_eq!(strings[0], "");
    let s = |id: u64| strings[id as usize].as_str();

    let types: Vec<(&str, &str)> = all(&raw, field::SAMPLE_TYPE)
        .iter()
        .map(|t| (s(int(t, 1)), s(int(t, 2))))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    assert_eq!(int(&raw, field::PERIOD), 10_000_000);
    assert_eq!(int(&raw, field::TIME_NANOS), 1_700_000_000_000_000_000);
    assert_eq!(int(&raw, field::DURATION_NANOS), 2_000_000_000);

    let samples = all(&raw, field::SAMPLE);
    assert_eq!(samples.len(), 1, "three identical samples merge");
    assert_eq!(packed(&samples[0], 2), [3, 30_000_000]);
    let labels: Vec<(&str, &str, u64)> = all(&samples[0], 3)
        .iter()
        .map(|l| (s(int(l, 1)), s(int(l, 2)), int(l, 3)))
        .collect();
    assert!(labels.contains(&("pid", "", 7)));
    assert!(labels.contains(&("comm", "app", 0)));
    assert!(
        labels
            .iter()
            .any(|l| l.0 == "cgroup" && l.1.contains("docker-"))
    );
    assert!(
        labels
            .iter()
            .any(|l| l.0 == "container" && l.1.starts_with("3f1c"))
    );

    // Leaf first: ksys_read, work, main; each location names its function and mapping.
    let locations = all(&raw, field::LOCATION);
    let functions = all(&raw, field::FUNCTION);
    let mappings = all(&raw, field::MAPPING);
    let names: Vec<(&str, u64, &str)> = packed(&samples[0], 1)
        .into_iter()
        .map(|id| {
            let loc = locations.iter().find(|l| int(l, 1) == id).unwrap();
            let line = &all(loc, 4)[0];
            let f = functions
                .iter()
                .find(|f| int(f, 1) == int(line, 1))
                .unwrap();
            let m = mappings.iter().find(|m| int(m, 1) == int(loc, 2)).unwrap();
            (s(int(f, 2)), int(loc, 3), s(int(m, 5)))
        })
        .collect();
    assert_eq!(
        names,
        [
            ("ksys_read", 0xffff_ffff_8100_0000, "[kernel.kallsyms]"),
            ("work", 0x1200, "/usr/bin/app"),
            ("main", 0x1100, "/usr/bin/app")
        ]
    );
    let app = mappings
        .iter()
        .find(|m| s(int(m, 5)) == "/usr/bin/app")
        .unwrap();
    assert_eq!(s(int(app, 6)), "abcdef0123");
    assert_eq!(
        int(app, 3),
        0x1201,
        "the mapping covers every address in it"
    );
}
