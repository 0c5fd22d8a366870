//! Table unwinding against the reference (issue 10): `perf record --call-graph dwarf` copies
//! the user stack at each sample and unwinds it afterwards with DWARF. Both record the same
//! fixture run at the same time; the distribution of the fixture's chains must agree frame
//! for frame. A chain is the stack root first with the fixture's own functions by name and
//! every other user frame (libc, ld.so) as `*`: frame names differ between the two
//! symbolizers (`__libc_start_main` / `__libc_start_main_impl`, `.part.0` suffixes), the
//! frames themselves must not. Kernel frames are left out of both. With `--unwind fp` the
//! same comparison fails (the negative control).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};

use profiler_tests::{
    TempDir, exclusive, expect_success, is_kernel, read_folded, record, require_bpf,
    spawn_fixture_args, tool, wait_timeout,
};

const FX_UNWIND: &str = env!("FIXTURE_FX_UNWIND");
const FX_EDGES: &str = env!("FIXTURE_FX_EDGES");
const FX_RUST_NOFP: &str = env!("FIXTURE_FX_RUST_NOFP");

/// Chain (frames root first, normalized) -> samples.
type Chains = BTreeMap<Vec<String>, u64>;

/// The fixture's own function names (its symbol table's text symbols, demangled as both
/// symbolizers print Rust's: no hash).
fn own_symbols(fixture: &str) -> HashSet<String> {
    let out = Command::new("nm")
        .args(["--defined-only", "-C", fixture])
        .output()
        .expect("running nm (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [_, "t" | "T", name] => Some(name.to_owned()),
            _ => None,
        })
        .collect()
}

fn normalize(frame: &str, own: &HashSet<String>) -> String {
    // A `[truncated: ...]` root is kept: never in perf's output, such a stack cannot agree.
    if own.contains(frame) || frame.starts_with("[truncated") {
        frame.to_owned()
    } else {
        "*".to_owned()
    }
}

/// perf script's samples of process `pid`: frames leaf first, `ip sym (dso)` each, a blank
/// line after each sample.
fn perf_chains(text: &str, pid: u32, fixture: &str, own: &HashSet<String>) -> Chains {
    let mut chains = Chains::new();
    for sample in text.split("\n\n") {
        let mut lines = sample.lines().filter(|l| !l.trim().is_empty());
        let Some(header) = lines.next() else {
            continue;
        };
        if header.split_whitespace().nth(1) != Some(&pid.to_string()) {
            continue;
        }
        let mut chain: Vec<String> = lines
            .filter_map(|l| {
                let (rest, dso) = l.trim().rsplit_once(" (")?;
                let dso = dso.trim_end_matches(')');
                if dso.starts_with("[kernel") || dso.contains("kallsyms") {
                    return None;
                }
                let sym = rest.split_once(' ').map_or("", |(_, s)| s);
                Some(if dso == fixture {
                    normalize(sym, own)
                } else {
                    "*".to_owned()
                })
            })
            .collect();
        chain.reverse();
        *chains.entry(chain).or_default() += 1;
    }
    chains
}

fn our_chains(out: &Path, comm: &str, own: &HashSet<String>) -> Chains {
    let (_, stacks) = read_folded(out);
    let mut chains = Chains::new();
    for (frames, count) in stacks.iter().filter(|(f, _)| f[0] == comm) {
        let chain = frames[1..]
            .iter()
            .filter(|f| !is_kernel(f))
            .map(|f| normalize(f, own))
            .collect();
        *chains.entry(chain).or_default() += count;
    }
    chains
}

/// Total variation distance between the two share distributions: half the sum of the share
/// differences, 0 when equal, 1 when disjoint.
fn distance(a: &Chains, b: &Chains) -> f64 {
    let (ta, tb) = (
        a.values().sum::<u64>() as f64,
        b.values().sum::<u64>() as f64,
    );
    let keys: HashSet<&Vec<String>> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .map(|k| {
            let pa = a.get(k).copied().unwrap_or(0) as f64 / ta;
            let pb = b.get(k).copied().unwrap_or(0) as f64 / tb;
            (pa - pb).abs()
        })
        .sum::<f64>()
        / 2.0
}

/// The distance two samplings of one distribution typically show (its expected value):
/// per chain, the mean absolute difference of two shares of `na` and `nb` samples,
/// sqrt(2/pi) x sqrt(p(1-p)(1/na + 1/nb)) with p the pooled share, summed and halved.
fn noise(a: &Chains, b: &Chains) -> f64 {
    let (na, nb) = (
        a.values().sum::<u64>() as f64,
        b.values().sum::<u64>() as f64,
    );
    let keys: HashSet<&Vec<String>> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .map(|k| {
            let both = a.get(k).copied().unwrap_or(0) + b.get(k).copied().unwrap_or(0);
            let p = both as f64 / (na + nb);
            (2.0 / std::f64::consts::PI).sqrt() * (p * (1.0 - p) * (1.0 / na + 1.0 / nb)).sqrt()
        })
        .sum::<f64>()
        / 2.0
}

fn top(chains: &Chains, n: usize) -> String {
    let total = chains.values().sum::<u64>().max(1);
    let mut v: Vec<_> = chains.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .take(n)
        .map(|(c, n)| {
            format!(
                "  {:5.1}% {}",
                **n as f64 * 100.0 / total as f64,
                c.join(";")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Records `fixture args` with us (`--unwind unwind`) and perf at the same time; returns the
/// distance between the two chain distributions, the largest distance sampling noise
/// explains, and a description for messages.
fn side_by_side(fixture: &str, args: &[&str], unwind: &str) -> (f64, f64, String) {
    let perf = tool("perf", "linux-perf").expect("perf on PATH");
    let comm: String = Path::new(fixture)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .chars()
        .take(15)
        .collect();
    let own = own_symbols(fixture);
    assert!(own.contains("main"), "nm shows no main in {fixture}");
    let dir = TempDir::new(&format!("unwind-perf-{unwind}"));
    let process = spawn_fixture_args(Path::new(fixture), args);
    let pid = process.pid();
    let data = dir.file("perf.data");
    let mut perf_run = Command::new(&perf)
        .args([
            "record",
            "-q",
            "-e",
            "cpu-clock",
            "-F",
            "999",
            "--call-graph",
        ])
        .args([
            "dwarf",
            "-p",
            &pid.to_string(),
            "-o",
            &data,
            "--",
            "sleep",
            "4",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting perf record");
    let out = dir.file("ours.folded");
    let pid_arg = pid.to_string();
    let ours = ["-p", &pid_arg, "-F", "999", "-d", "4s", "--unwind", unwind];
    let output = record(&[&ours[..], &["-o", &out]].concat());
    expect_success(&output, &format!("profiler record {ours:?}"));
    let status = wait_timeout(&mut perf_run, std::time::Duration::from_secs(30))
        .expect("perf record finished");
    assert!(status.success(), "perf record failed: {status}");
    let script = Command::new(&perf)
        .args([
            "script",
            "-i",
            &data,
            "-F",
            "comm,pid,ip,sym,dso",
            "--no-inline",
        ])
        .output()
        .expect("running perf script");
    assert!(script.status.success(), "perf script failed");
    let theirs = perf_chains(&String::from_utf8_lossy(&script.stdout), pid, fixture, &own);
    let ours = our_chains(Path::new(&out), &comm, &own);
    let (n_ours, n_perf) = (ours.values().sum::<u64>(), theirs.values().sum::<u64>());
    assert!(
        n_ours >= 100 && n_perf >= 100,
        "too few samples: ours {n_ours}, perf {n_perf}"
    );
    let d = distance(&ours, &theirs);
    let limit = (NOISE_TIMES * noise(&ours, &theirs)).max(MIN_LIMIT);
    let text = format!(
        "--unwind {unwind}: distance {:.1}% (sampling noise explains up to {:.1}%); ours \
         ({n_ours} samples):\n{}\nperf --call-graph dwarf ({n_perf} samples):\n{}",
        d * 100.0,
        limit * 100.0,
        top(&ours, 8),
        top(&theirs, 8)
    );
    eprintln!("{text}");
    (d, limit, text)
}

/// How far the two distributions may be apart: three times the distance two samplings of
/// one distribution typically show (a few hundred samples each, spread over up to eight
/// chains of different depths in the qsort case), and at least 5%. A walk that loses or adds
/// a frame moves the whole share of the chains it does it in; frame pointers alone move all.
const NOISE_TIMES: f64 = 3.0;
const MIN_LIMIT: f64 = 0.05;

fn agrees_with_perf(fixture: &str, args: &[&str]) {
    if !require_bpf() {
        return;
    }
    let _serial = exclusive();
    let (d, limit, text) = side_by_side(fixture, args, "dwarf");
    assert!(d <= limit, "our chains do not agree with perf's:\n{text}");
    // Negative control: frame pointers alone on the same fixture.
    let (d, limit, text) = side_by_side(fixture, args, "fp");
    assert!(
        d > limit,
        "frame pointers alone agree with perf: the fixture does not test table unwinding\n{text}"
    );
}

/// main -> a -> b -> qsort -> msort (recursing 1..8 deep in libc) -> cmp: the depth of each
/// sample's libc recursion must be the same as perf's.
#[test]
fn qsort_chains_agree_with_perf_dwarf() {
    agrees_with_perf(FX_UNWIND, &["20", "qsort"]);
}

/// main -> a -> b -> memcpy: a leaf in libc's copy routine.
#[test]
fn memcpy_chains_agree_with_perf_dwarf() {
    agrees_with_perf(FX_UNWIND, &["20", "memcpy"]);
}

/// A busy signal handler: perf's unwinder crosses __restore_rt too.
#[test]
fn signal_handler_chains_agree_with_perf_dwarf() {
    agrees_with_perf(FX_EDGES, &["20", "signal"]);
}

/// Rust without frame pointers: std's runtime frames and the fixture's three.
#[test]
fn rust_chains_agree_with_perf_dwarf() {
    agrees_with_perf(FX_RUST_NOFP, &["20"]);
}
