//! The fuzz test's machinery: a counting global allocator (per thread, so tests run in
//! parallel), a fixed-seed mutator, and the loop that runs each parser on its cases and checks
//! no panic, the memory bound and one-line errors. The parsers and their seeds are in fuzz.rs.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    panic::AssertUnwindSafe,
};

/// Mutated inputs per parser.
pub(crate) const CASES: usize = 10_000;
/// The PRNG seed: the same inputs on every run and machine.
const SEED: u64 = 0x15_f022_5eed;
/// Largest mutated input (repeated chunks grow them).
const MAX_INPUT: usize = 256 << 10;

// --- memory accounting -------------------------------------------------------------------

/// Counts each thread's live heap bytes and their peak, so a case's allocations can be bounded
/// while the tests run in parallel (each on its own thread; a parser frees what it allocated on
/// the same thread).
struct Counting;

thread_local! {
    // Const-initialized and without a destructor: usable from inside the allocator.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn grew(by: usize) {
    LIVE.with(|live| {
        let now = live.get() + by as isize;
        live.set(now);
        PEAK.with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrank(by: usize) {
    LIVE.with(|live| live.set(live.get() - by as isize));
}

// SAFETY: every method forwards to the system allocator unchanged and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded; `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded; `ptr` came from this allocator with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`, returning its result and the peak heap bytes it added on this thread.
pub(crate) fn measured<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, (PEAK.with(Cell::get) - base).max(0) as usize)
}

// --- mutation ----------------------------------------------------------------------------

/// xorshift64*: small, fast, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Numbers that overflow or mislead parsers, as text and as LEB128 varints.
const HUGE: &[&[u8]] = &[
    b"18446744073709551615",
    b"18446744073709551616",
    b"340282366920938463463374607431768211456",
    b"-1",
    b"ffffffffffffffff",
    b"0x10000000000000000",
    b"4294967296",
    b"1e308",
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    &[
        0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
    ],
    &[0xff, 0xff, 0xff, 0xff, 0x0f],
];
/// Separators and bytes that end fields, lines or strings.
const SPECIAL: &[u8] = b"\n\r\t ;:,=-%+[]\"'\\#\0\xff\x80";

/// One mutated input from `seeds`: 1-4 mutations of a random seed.
fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], max_input: usize) -> Vec<u8> {
    let mut v = seeds[rng.below(seeds.len())].clone();
    for _ in 0..=rng.below(4) {
        let len = v.len();
        let at = rng.below(len + 1);
        match rng.below(10) {
            0 => {
                for _ in 0..=rng.below(8) {
                    if !v.is_empty() {
                        let i = rng.below(v.len());
                        v[i] ^= 1 << rng.below(8);
                    }
                }
            }
            1 => v.truncate(at),
            2 => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len() + 1);
                let to = from + rng.below(other.len() - from + 1);
                v.splice(at..at, other[from..to].iter().copied());
            }
            3 => {
                // A chunk repeated many times: long lines, many items, deep stacks.
                let n = 1 + rng.below(64.min(len - at.min(len)).max(1));
                let chunk: Vec<u8> = v[at.min(len)..(at + n).min(len)].to_vec();
                let most = if rng.below(8) == 0 { 4000 } else { 50 };
                let times = 2 + rng.below(most);
                let repeated = chunk.repeat(times);
                v.splice(at..at, repeated);
            }
            4 => {
                let huge = HUGE[rng.below(HUGE.len())];
                // Replace the digits around `at`, if any, else insert.
                let start = (0..at)
                    .rev()
                    .find(|&i| !v[i].is_ascii_digit())
                    .map_or(0, |i| i + 1);
                let end = (at..len).find(|&i| !v[i].is_ascii_digit()).unwrap_or(len);
                v.splice(start..end, huge.iter().copied());
            }
            5 => v.insert(at, SPECIAL[rng.below(SPECIAL.len())]),
            6 => {
                let end = (at + rng.below(32)).min(len);
                v.drain(at..end);
            }
            7 => v.insert(at, rng.next() as u8),
            _ => {
                // One byte replaced by an ASCII one: in a capture body, a one-byte varint, so
                // the structure mostly survives and the parser goes deeper.
                if !v.is_empty() {
                    let i = rng.below(v.len());
                    v[i] = (rng.next() % 0x80) as u8;
                }
            }
        }
    }
    v.truncate(max_input);
    v
}

/// Runs `CASES` mutated inputs through `check`, which parses one input, asserts on the result
/// and returns the memory bound for it. A panic or a broken bound names the case and input.
pub(crate) fn fuzz(name: &str, seeds: &[&[u8]], mut check: impl FnMut(&[u8]) -> usize) {
    let seeds: Vec<Vec<u8>> = seeds.iter().map(|s| s.to_vec()).collect();
    let mut rng = Rng(SEED
        ^ name
            .bytes()
            .fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b)));
    let mut worst = 0.0f64;
    let started = std::time::Instant::now();
    for case in 0..CASES {
        // The seeds themselves first: they must parse too.
        let input = if case < seeds.len() {
            seeds[case].clone()
        } else {
            mutate(&mut rng, &seeds, MAX_INPUT)
        };
        let (result, peak) =
            measured(|| std::panic::catch_unwind(AssertUnwindSafe(|| check(&input))));
        let shown = String::from_utf8_lossy(&input[..input.len().min(300)]).into_owned();
        let Ok(bound) = result else {
            panic!(
                "{name}: case {case} panicked on {} bytes: {shown:?}",
                input.len()
            )
        };
        assert!(
            peak <= bound,
            "{name}: case {case} allocated {peak} bytes (bound {bound}) for {} bytes: {shown:?}",
            input.len()
        );
        worst = worst.max(peak as f64 / (input.len().max(1)) as f64);
    }
    eprintln!(
        "{name}: {CASES} cases in {:.1} s, worst peak {worst:.0} bytes per input byte",
        started.elapsed().as_secs_f64()
    );
}

/// An error must be one line saying what is wrong.
pub(crate) fn one_line(what: &str, error: &str) {
    assert!(
        !error.is_empty() && !error.trim_end().contains('\n'),
        "{what}: error is not one line: {error:?}"
    );
}

/// A memory bound linear in the input: `per_byte` times its size plus `base`.
pub(crate) fn linear(input: &[u8], per_byte: usize, base: usize) -> usize {
    per_byte * input.len() + base
}
