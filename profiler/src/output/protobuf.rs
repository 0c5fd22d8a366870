//! The protobuf wire format, written by hand for the two protobuf outputs at the end of the
//! flow (pprof, `pprof.rs`; OTLP profiles, `otlp.rs`): varints, fixed64 and length-delimited
//! fields, and a string table. No code generator: the schemas are small and this is all of it.
use std::collections::HashMap;

/// A string table whose index 0 is "", as pprof and OTLP both require.
pub(crate) struct Strings {
    ids: HashMap<String, u64>,
    pub(crate) list: Vec<String>,
}

impl Default for Strings {
    fn default() -> Self {
        Self {
            ids: HashMap::from([(String::new(), 0)]),
            list: vec![String::new()],
        }
    }
}

impl Strings {
    pub(crate) fn id(&mut self, s: &str) -> u64 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.list.len() as u64;
        self.list.push(s.to_owned());
        self.ids.insert(s.to_owned(), id);
        id
    }
}

/// A protobuf message being written: varints (wire type 0), fixed64 (1) and
/// length-delimited fields (2).
#[derive(Default)]
pub(crate) struct Msg(pub(crate) Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    /// A varint field; zero is the default and is left out, as protobuf encoders do.
    pub(crate) fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.varint(u64::from(field) << 3);
            self.varint(v);
        }
    }

    /// A varint field written even when zero (a oneof member, whose presence is the value).
    pub(crate) fn uint_present(&mut self, field: u32, v: u64) {
        self.varint(u64::from(field) << 3);
        self.varint(v);
    }

    /// A fixed64 field (left out when zero).
    pub(crate) fn fixed64(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.varint(u64::from(field) << 3 | 1);
            self.0.extend_from_slice(&v.to_le_bytes());
        }
    }

    pub(crate) fn bytes(&mut self, field: u32, b: &[u8]) {
        self.varint(u64::from(field) << 3 | 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    pub(crate) fn msg(&mut self, field: u32, m: Msg) {
        self.bytes(field, &m.0);
    }

    /// A packed repeated varint field.
    pub(crate) fn packed(&mut self, field: u32, values: impl IntoIterator<Item = u64>) {
        let mut m = Msg::default();
        for v in values {
            m.varint(v);
        }
        if !m.0.is_empty() {
            self.msg(field, m);
        }
    }

    /// A packed repeated fixed64 field.
    pub(crate) fn packed_fixed64(&mut self, field: u32, values: impl IntoIterator<Item = u64>) {
        let mut m = Msg::default();
        for v in values {
            m.0.extend_from_slice(&v.to_le_bytes());
        }
        if !m.0.is_empty() {
            self.msg(field, m);
        }
    }
}
