//! Rust fixture: main -> rust_outer -> rust_middle -> rust_inner, with the CPU time spent in a
//! loop inside rust_inner. The tests expect those three frames, in order, on nearly every
//! sample of the process `fixture-rust`.
//!
//! Frame pointers come from the workspace .cargo/config.toml; tests/build.rs builds this file
//! again without them, optimized, as `fx-rust-nofp` (the table walk's Rust fixture).
//! `#[inline(never)]` keeps each function a frame of its own, and each caller uses the
//! callee's result through black_box after the call, so no call is in tail position (a tail
//! call would drop the caller's frame even in a release build).
//!
//! Usage: fixture-rust [SECONDS]   (default 5; exits by itself after that)

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Iterations between clock reads, so reading the clock is a negligible share of samples.
const SPIN_ITERS: u64 = 1 << 20;

/// The hot loop. Its body is plain operators on purpose: in a debug build every method call
/// (`Range::next`, `wrapping_add`, `black_box`) is a real call, and a sample that lands in a
/// callee's prologue, before it pushes its frame pointer, loses rust_inner from the chain.
/// The shift-xor recurrence has no closed form, and black_box on each round's result keeps a
/// release build from deleting the loop.
#[inline(never)]
fn rust_inner(deadline: Instant) -> u64 {
    let mut acc = 0u64;
    loop {
        let mut i = 0u64;
        while i < SPIN_ITERS {
            acc = (acc >> 1) ^ i;
            i += 1;
        }
        acc = black_box(acc);
        if Instant::now() >= deadline {
            return acc;
        }
    }
}

#[inline(never)]
fn rust_middle(deadline: Instant) -> u64 {
    black_box(rust_inner(deadline)).wrapping_add(1)
}

#[inline(never)]
fn rust_outer(deadline: Instant) -> u64 {
    black_box(rust_middle(deadline)).wrapping_add(1)
}

fn main() {
    let secs: f64 = std::env::args().nth(1).map_or(5.0, |arg| {
        arg.parse().expect("usage: fixture-rust [SECONDS]")
    });
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    black_box(rust_outer(deadline));
}
