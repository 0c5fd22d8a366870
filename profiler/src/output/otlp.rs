//! OTLP profiles: a `Profile` (an agent window) as an `ExportProfilesServiceRequest` of the
//! OpenTelemetry profiles signal, `v1development` as of opentelemetry-proto v1.10.0 (what the
//! agent's `--otlp-endpoint` POSTs to `/v1development/profiles`; docs/agent.md).
//!
//! One `ResourceProfiles` per process: the resource says host, kernel, process and, when its
//! cgroup names them, container and pod. Its one `Profile` holds one sample per (stack,
//! thread comm) with every sample's exact time (`timestamps_unix_nano`, each worth one CPU
//! sample of `period` ns). Stacks, locations, functions, mappings (with GNU build ids) and
//! strings live once in the request's shared `ProfilesDictionary`, index 0 of every table
//! being the empty value the spec requires.
use std::collections::{BTreeMap, HashMap};

use super::protobuf::{Msg, Strings};
use crate::profile::{Process, Profile, attribution::owner};

/// Field numbers, by message (opentelemetry-proto v1.10.0).
mod field {
    pub(super) const REQUEST_RESOURCE_PROFILES: u32 = 1;
    pub(super) const REQUEST_DICTIONARY: u32 = 2;
    pub(super) const RESOURCE_PROFILES_RESOURCE: u32 = 1;
    pub(super) const RESOURCE_PROFILES_SCOPE_PROFILES: u32 = 2;
    pub(super) const RESOURCE_ATTRIBUTES: u32 = 1;
    pub(super) const SCOPE_PROFILES_SCOPE: u32 = 1;
    pub(super) const SCOPE_PROFILES_PROFILES: u32 = 2;
    pub(super) const PROFILE_SAMPLE_TYPE: u32 = 1;
    pub(super) const PROFILE_SAMPLES: u32 = 2;
    pub(super) const PROFILE_TIME_UNIX_NANO: u32 = 3;
    pub(super) const PROFILE_DURATION_NANO: u32 = 4;
    pub(super) const PROFILE_PERIOD_TYPE: u32 = 5;
    pub(super) const PROFILE_PERIOD: u32 = 6;
    pub(super) const PROFILE_ID: u32 = 7;
    pub(super) const SAMPLE_STACK_INDEX: u32 = 1;
    pub(super) const SAMPLE_ATTRIBUTE_INDICES: u32 = 2;
    pub(super) const SAMPLE_VALUES: u32 = 4;
    pub(super) const SAMPLE_TIMESTAMPS: u32 = 5;
    pub(super) const DICT_MAPPING: u32 = 1;
    pub(super) const DICT_LOCATION: u32 = 2;
    pub(super) const DICT_FUNCTION: u32 = 3;
    pub(super) const DICT_LINK: u32 = 4;
    pub(super) const DICT_STRING: u32 = 5;
    pub(super) const DICT_ATTRIBUTE: u32 = 6;
    pub(super) const DICT_STACK: u32 = 7;
}

/// The uncompressed protobuf body of one export request for `p`.
pub(crate) fn encode_otlp(p: &Profile) -> Vec<u8> {
    let mut d = Dictionary::of(p);
    let processes: HashMap<u32, &Process> = p.processes.iter().map(|q| (q.pid, q)).collect();
    let mut out = Msg::default();
    for (pid, groups) in samples_by_process(p) {
        let profile = process_profile(p, &mut d, pid, groups);
        let rp = resource_profiles(p, pid, processes.get(&pid).copied(), profile);
        out.msg(field::REQUEST_RESOURCE_PROFILES, rp);
    }
    out.msg(field::REQUEST_DICTIONARY, d.finish());
    out.0
}

/// A process's samples of one stack and thread comm: their times, and how many had none.
#[derive(Default)]
struct Group {
    times: Vec<u64>,
    untimed: u64,
}

/// (stack, comm)
type Key = (u32, u32);

/// Samples per process, then per (stack, comm); times are wall-clock ns.
fn samples_by_process(p: &Profile) -> BTreeMap<u32, BTreeMap<Key, Group>> {
    let mut per_pid: BTreeMap<u32, BTreeMap<Key, Group>> = BTreeMap::new();
    for s in &p.samples {
        let group = per_pid
            .entry(s.pid)
            .or_default()
            .entry((s.stack, s.comm))
            .or_default();
        if s.has_time() {
            group.times.push(p.meta.start_unix_ns + s.offset_ns);
        } else {
            group.untimed += 1;
        }
    }
    per_pid
}

/// The `Profile` message of one process: its samples, the window and the sampling period.
fn process_profile(p: &Profile, d: &mut Dictionary, pid: u32, groups: BTreeMap<Key, Group>) -> Msg {
    let mut profile = Msg::default();
    profile.msg(
        field::PROFILE_SAMPLE_TYPE,
        value_type(&mut d.strings, "samples", "count"),
    );
    for ((stack, comm), group) in groups {
        let mut m = Msg::default();
        m.uint(field::SAMPLE_STACK_INDEX, u64::from(stack) + 1);
        let attr = d.attribute("thread.name", p.str(comm));
        m.packed(field::SAMPLE_ATTRIBUTE_INDICES, [attr]);
        let Group { mut times, untimed } = group;
        if untimed == 0 {
            // One event per timestamp, each worth 1 (the spec's reading without values).
            times.sort_unstable();
            m.packed_fixed64(field::SAMPLE_TIMESTAMPS, times);
        } else {
            // Some times unknown (old stored windows): the count alone.
            m.packed(field::SAMPLE_VALUES, [untimed + times.len() as u64]);
        }
        profile.msg(field::PROFILE_SAMPLES, m);
    }
    let period_ns = 1_000_000_000 / u64::from(p.meta.frequency_hz.max(1));
    profile.fixed64(field::PROFILE_TIME_UNIX_NANO, p.meta.start_unix_ns);
    profile.uint(field::PROFILE_DURATION_NANO, p.meta.duration_ns);
    profile.msg(
        field::PROFILE_PERIOD_TYPE,
        value_type(&mut d.strings, "cpu", "nanoseconds"),
    );
    profile.uint(field::PROFILE_PERIOD, period_ns);
    profile.bytes(field::PROFILE_ID, &profile_id(p, pid));
    profile
}

/// One process's `ResourceProfiles`: its resource, and `profile` under this profiler's scope.
fn resource_profiles(p: &Profile, pid: u32, process: Option<&Process>, profile: Msg) -> Msg {
    let mut scope = Msg::default();
    scope.bytes(1, b"profiler");
    scope.bytes(2, env!("CARGO_PKG_VERSION").as_bytes());
    let mut scope_profiles = Msg::default();
    scope_profiles.msg(field::SCOPE_PROFILES_SCOPE, scope);
    scope_profiles.msg(field::SCOPE_PROFILES_PROFILES, profile);
    let mut resource = Msg::default();
    for kv in resource_attributes(p, pid, process) {
        resource.msg(field::RESOURCE_ATTRIBUTES, kv);
    }
    let mut rp = Msg::default();
    rp.msg(field::RESOURCE_PROFILES_RESOURCE, resource);
    rp.msg(field::RESOURCE_PROFILES_SCOPE_PROFILES, scope_profiles);
    rp
}

/// The request's shared tables, each starting with its zero value.
#[derive(Default)]
struct Dictionary {
    strings: Strings,
    mappings: Vec<Msg>,
    locations: Vec<Msg>,
    functions: Vec<Msg>,
    stacks: Vec<Msg>,
    attributes: Vec<Msg>,
    attribute_ids: HashMap<(String, String), u64>,
}

impl Dictionary {
    /// The mappings, locations, functions and stacks of `p`; strings and attributes grow as
    /// the samples are added.
    fn of(p: &Profile) -> Self {
        let mut d = Dictionary::default();
        let mapping_of = d.add_mappings(p);
        d.add_locations(p, &mapping_of);
        // Leaf first here, root first in ours; location i + 1 is frame i.
        for s in &p.stacks {
            let mut m = Msg::default();
            m.packed(1, s.frames.iter().rev().map(|&f| u64::from(f) + 1));
            d.stacks.push(m);
        }
        d
    }

    /// One mapping per binary a frame points into, with its address range (user frames are
    /// file offsets, so a user mapping starts at 0) and its build id as an attribute. Returns
    /// the mapping index of each binary id.
    fn add_mappings(&mut self, p: &Profile) -> HashMap<u32, u64> {
        let mut ranges: HashMap<u32, (u64, u64)> = HashMap::new();
        for f in &p.frames {
            let r = ranges.entry(f.binary).or_insert((f.addr, f.addr));
            *r = (r.0.min(f.addr), r.1.max(f.addr));
        }
        let mut mapping_of: HashMap<u32, u64> = HashMap::new();
        for (id, b) in p.binaries.iter().enumerate().skip(1) {
            let Some(&(lo, hi)) = ranges.get(&(id as u32)) else {
                continue;
            };
            let mut m = Msg::default();
            m.uint(1, if b.path.starts_with('[') { lo } else { 0 });
            m.uint(2, hi + 1);
            m.uint(4, self.strings.id(&b.path));
            if !b.build_id.is_empty() {
                let attr = self.attribute("process.executable.build_id.gnu", &b.build_id);
                m.packed(5, [attr]);
            }
            self.mappings.push(m);
            mapping_of.insert(id as u32, self.mappings.len() as u64);
        }
        mapping_of
    }

    /// One location per frame, in frame order; one function per name.
    fn add_locations(&mut self, p: &Profile, mapping_of: &HashMap<u32, u64>) {
        let mut functions: HashMap<u32, u64> = HashMap::new();
        for f in &p.frames {
            let function = *functions.entry(f.name).or_insert_with(|| {
                let name = self.strings.id(p.str(f.name));
                let mut m = Msg::default();
                m.uint(1, name);
                m.uint(2, name);
                self.functions.push(m);
                self.functions.len() as u64
            });
            let mut line = Msg::default();
            line.uint(1, function);
            let mut m = Msg::default();
            m.uint(1, mapping_of.get(&f.binary).copied().unwrap_or(0));
            m.uint(2, f.addr);
            m.msg(3, line);
            self.locations.push(m);
        }
    }

    /// The index of the string attribute `key = value` in the attribute table.
    fn attribute(&mut self, key: &str, value: &str) -> u64 {
        let k = (key.to_owned(), value.to_owned());
        if let Some(&id) = self.attribute_ids.get(&k) {
            return id;
        }
        let mut m = Msg::default();
        m.uint(1, self.strings.id(key));
        m.msg(2, string_value(value));
        self.attributes.push(m);
        let id = self.attributes.len() as u64;
        self.attribute_ids.insert(k, id);
        id
    }

    fn finish(self) -> Msg {
        let mut m = Msg::default();
        let tables = [
            (field::DICT_MAPPING, self.mappings),
            (field::DICT_LOCATION, self.locations),
            (field::DICT_FUNCTION, self.functions),
            (field::DICT_LINK, Vec::new()),
            (field::DICT_ATTRIBUTE, self.attributes),
            (field::DICT_STACK, self.stacks),
        ];
        for (f, table) in tables {
            m.msg(f, Msg::default()); // the zero value at index 0
            for item in table {
                m.msg(f, item);
            }
        }
        for s in &self.strings.list {
            m.bytes(field::DICT_STRING, s.as_bytes());
        }
        m
    }
}

fn value_type(strings: &mut Strings, kind: &str, unit: &str) -> Msg {
    let mut m = Msg::default();
    m.uint(1, strings.id(kind));
    m.uint(2, strings.id(unit));
    m
}

/// An `AnyValue` holding a string (field 1, present even when empty).
fn string_value(s: &str) -> Msg {
    let mut m = Msg::default();
    m.bytes(1, s.as_bytes());
    m
}

/// A `KeyValue` of the resource: key, then a string or an int value.
fn key_value(key: &str, value: Result<&str, i64>) -> Msg {
    let mut m = Msg::default();
    m.bytes(1, key.as_bytes());
    let v = match value {
        Ok(s) => string_value(s),
        Err(n) => {
            let mut v = Msg::default();
            v.uint_present(3, n as u64);
            v
        }
    };
    m.msg(2, v);
    m
}

/// OpenTelemetry semantic-convention attributes of one process's resource.
fn resource_attributes(p: &Profile, pid: u32, process: Option<&Process>) -> Vec<Msg> {
    let mut kv = vec![
        key_value("host.name", Ok(&p.meta.hostname)),
        key_value("os.type", Ok("linux")),
        key_value("os.version", Ok(&p.meta.kernel_release)),
        key_value("process.pid", Err(i64::from(pid))),
    ];
    if let Some(q) = process {
        let name = q.exe.rsplit('/').next().filter(|n| !n.is_empty());
        kv.push(key_value(
            "process.executable.name",
            Ok(name.unwrap_or(&q.comm)),
        ));
        if !q.exe.is_empty() {
            kv.push(key_value("process.executable.path", Ok(&q.exe)));
        }
        let o = owner(&q.cgroup);
        if let Some(c) = &o.container {
            kv.push(key_value("container.id", Ok(c)));
        }
        if let Some(uid) = &o.pod {
            kv.push(key_value("k8s.pod.uid", Ok(uid)));
        }
    }
    kv
}

/// 16 bytes naming one process's profile of one window (never all zeros: the spec's invalid
/// id): the window's start, the pid, and a hash of the host name.
fn profile_id(p: &Profile, pid: u32) -> [u8; 16] {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.meta.hostname.hash(&mut h);
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&p.meta.start_unix_ns.to_le_bytes());
    id[8..12].copy_from_slice(&pid.to_le_bytes());
    id[12..].copy_from_slice(&(h.finish() as u32 | 1).to_le_bytes());
    id
}
