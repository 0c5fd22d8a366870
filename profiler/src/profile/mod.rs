//! The profile model, fourth stage of the flow: interned strings, frames and stacks, and every
//! sample with its time. Outputs render from it; `capture` stores it on disk.
mod capture;
mod model;

pub use capture::{CAPTURE_VERSION, CaptureError, decode, encode, read_file, write_file};
pub use model::{
    Counters, Frame, FrameKind, Interner, Meta, Process, Profile, Sample, Stack, StrId,
};
