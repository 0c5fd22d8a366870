//! Compiles the C fixtures (fixtures/*.c) with the system `cc` into OUT_DIR and tells the
//! tests where they are: fixtures/fx-chain.c -> env FIXTURE_FX_CHAIN=<OUT_DIR>/fx-chain.
//!
//! The flags (fixtures/cflags.txt) are the point of the fixtures: frame pointers everywhere (the
//! sampler walks user stacks by frame pointer) and no inlining or sibling calls, so the source's
//! call chain is exactly the chain on the stack.

use std::path::Path;
use std::process::Command;

/// fixtures/cflags.txt, one flag a line (`#` starts a comment): the kernel matrix in xtask
/// builds its static fx-chain with the same file.
fn cflags() -> Vec<String> {
    std::fs::read_to_string("fixtures/cflags.txt")
        .expect("read tests/fixtures/cflags.txt")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// fx-unwind is the opposite on purpose: built like distribution packages, without frame
/// pointers (only .eh_frame describes its frames), for the table-walk tests (unwind.rs).
/// Inlining and sibling calls stay off so the source's chain is the stack's.
const NO_FP_CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fomit-frame-pointer",
    "-fasynchronous-unwind-tables",
    "-fno-inline",
    "-fno-optimize-sibling-calls",
    "-Wall",
    "-Wextra",
];

fn main() {
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    // The whole directory, so a new fixture or a change to common.h rebuilds them all.
    println!("cargo:rerun-if-changed=fixtures");
    println!("cargo:rerun-if-changed=src/bin/fixture_rust.rs");
    println!("cargo:rerun-if-changed=build.rs");

    let mut sources: Vec<_> = std::fs::read_dir("fixtures")
        .expect("read tests/fixtures")
        .map(|entry| entry.expect("read tests/fixtures entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "c"))
        .collect();
    sources.sort();

    for source in sources {
        let name = source
            .file_stem()
            .unwrap()
            .to_str()
            .expect("UTF-8 fixture name");
        // The binary name becomes the process comm, which the kernel cuts at 15 bytes.
        assert!(
            name.len() <= 15,
            "fixture name {name:?} is longer than a comm (15 bytes)"
        );
        let output = Path::new(&out_dir).join(name);
        if name == "fx-unwind" {
            compile_flags(&source, &output, NO_FP_CFLAGS, &[]);
        } else if name == "fx-edges" {
            edges(Path::new(&out_dir), &source, &output);
        } else if name == "fx-debug-frame" {
            debug_frame(Path::new(&out_dir), &source, &output);
        } else if name == "fx-big" {
            big(Path::new(&out_dir), &source, &output);
        } else {
            compile(&source, &output);
        }
        let var = format!("FIXTURE_{}", name.to_uppercase().replace('-', "_"));
        println!("cargo:rustc-env={var}={}", output.display());
    }
    stripped(Path::new(&out_dir));
    rust_no_fp(Path::new(&out_dir));
}

/// fx-edges (the edge cases of table unwinding, tests/tests/unwind_edges.rs), without frame
/// pointers like fx-unwind: linked to libfx-tiny.so (fixtures/edges/tiny.c, found through
/// its rpath) so that its plt mode calls through the PLT; and fx-static (env
/// FIXTURE_FX_STATIC), the same source linked statically with tiny.c compiled in.
fn edges(out_dir: &Path, source: &Path, output: &Path) {
    let tiny = Path::new("fixtures/edges/tiny.c");
    let lib = out_dir.join("libfx-tiny.so");
    compile_flags(tiny, &lib, NO_FP_CFLAGS, &["-shared", "-fPIC"]);
    no_fp_linked_to(out_dir, source, output, "fx-tiny");
    let statik = out_dir.join("fx-static");
    let flags: Vec<&str> = NO_FP_CFLAGS.iter().copied().chain(["-static"]).collect();
    compile_flags(
        source,
        &statik,
        &flags,
        &["-Ifixtures", tiny.to_str().unwrap()],
    );
    println!("cargo:rustc-env=FIXTURE_FX_STATIC={}", statik.display());
}

/// fx-debug-frame without frame pointers and with its CFI in .debug_frame only (gcc puts it
/// there with -g when unwind tables are off); and fx-dframe-strip (env
/// FIXTURE_FX_DFRAME_STRIP, FIXTURE_FX_DFRAME_STRIP_DEBUG), the same binary stripped, its
/// .debug_frame and symbols in a separate debug file.
fn debug_frame(out_dir: &Path, source: &Path, output: &Path) {
    let flags: Vec<&str> = NO_FP_CFLAGS
        .iter()
        .copied()
        .filter(|f| *f != "-fasynchronous-unwind-tables")
        .chain([
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-Wl,--build-id",
        ])
        .collect();
    compile_flags(source, output, &flags, &["-Ifixtures"]);
    let (bin, debug) = (
        out_dir.join("fx-dframe-strip"),
        out_dir.join("fx-dframe-strip.debug"),
    );
    compile_flags(source, &bin, &flags, &["-Ifixtures"]);
    split_debug(&bin, &debug);
    println!("cargo:rustc-env=FIXTURE_FX_DFRAME_STRIP={}", bin.display());
    println!(
        "cargo:rustc-env=FIXTURE_FX_DFRAME_STRIP_DEBUG={}",
        debug.display()
    );
}

/// `source` built without frame pointers into `output`, linked to OUT_DIR's lib`lib`.so
/// (found through its rpath).
fn no_fp_linked_to(out_dir: &Path, source: &Path, output: &Path, lib: &str) {
    let rpath = format!("-Wl,-rpath,{}", out_dir.display());
    let link = format!("-L{}", out_dir.display());
    let lib = format!("-l{lib}");
    compile_flags(
        source,
        output,
        NO_FP_CFLAGS,
        &["-Ifixtures", &link, &rpath, &lib],
    );
}

/// fx-big (the compile-pool test in tests/tests/unwind_budget.rs), without frame pointers,
/// linked to libfx-big.so: fixtures/big/big.s assembled into a library with 8 MiB of
/// .eh_frame, whose table takes seconds to compile.
fn big(out_dir: &Path, source: &Path, output: &Path) {
    let lib = out_dir.join("libfx-big.so");
    compile_flags(
        Path::new("fixtures/big/big.s"),
        &lib,
        &["-shared", "-nostdlib"],
        &[],
    );
    no_fp_linked_to(out_dir, source, output, "fx-big");
}

/// fx-rust-nofp (env FIXTURE_FX_RUST_NOFP): the Rust fixture (src/bin/fixture_rust.rs) built
/// again by rustc the way `cargo build --release` builds by default, optimized and WITHOUT
/// frame pointers (the workspace's force-frame-pointers flag is not passed): only .eh_frame
/// describes its frames, so only the table walk gets its chain whole.
fn rust_no_fp(out_dir: &Path) {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = out_dir.join("fx-rust-nofp");
    let result = Command::new(rustc)
        .args([
            "--edition",
            "2024",
            // The tests look for fx_rust_nofp::rust_outer and its callees.
            "--crate-name",
            "fx_rust_nofp",
            "-O",
            "-C",
            "force-frame-pointers=no",
            "-C",
        ])
        .arg("debuginfo=1")
        .arg("-o")
        .arg(&output)
        .arg("src/bin/fixture_rust.rs")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .unwrap_or_else(|e| panic!("running rustc for fx-rust-nofp: {e}"));
    assert!(
        result.status.success(),
        "rustc failed on src/bin/fixture_rust.rs (fx-rust-nofp):\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    println!("cargo:rustc-env=FIXTURE_FX_RUST_NOFP={}", output.display());
}

/// fx-stripped: the chain fixture with a build id, stripped of every symbol, and its debug
/// file (env FIXTURE_FX_STRIPPED, FIXTURE_FX_STRIPPED_DEBUG) for tests/tests/stripped.rs.
/// No .gnu_debuglink is added: the debug file must be found by build id alone.
fn stripped(out_dir: &Path) {
    let (bin, debug) = (
        out_dir.join("fx-stripped"),
        out_dir.join("fx-stripped.debug"),
    );
    compile_with(Path::new("fixtures/fx-chain.c"), &bin, &["-Wl,--build-id"]);
    split_debug(&bin, &debug);
    println!("cargo:rustc-env=FIXTURE_FX_STRIPPED={}", bin.display());
    println!(
        "cargo:rustc-env=FIXTURE_FX_STRIPPED_DEBUG={}",
        debug.display()
    );
}

/// Moves `bin`'s symbols and debug sections to `debug` (`objcopy --only-keep-debug`), and
/// strips `bin` of every symbol. No .gnu_debuglink is added: found by build id alone.
fn split_debug(bin: &Path, debug: &Path) {
    let objcopy = |args: &[&std::ffi::OsStr]| {
        let status = Command::new("objcopy")
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("running objcopy: {e} (is binutils installed?)"));
        assert!(status.success(), "objcopy {args:?} failed");
    };
    objcopy(&["--only-keep-debug".as_ref(), bin.as_ref(), debug.as_ref()]);
    objcopy(&["--strip-all".as_ref(), bin.as_ref()]);
}

fn compile(source: &Path, output: &Path) {
    compile_with(source, output, &[]);
}

fn compile_with(source: &Path, output: &Path, extra: &[&str]) {
    compile_flags(source, output, &cflags(), extra);
}

fn compile_flags(
    source: &Path,
    output: &Path,
    flags: &[impl AsRef<std::ffi::OsStr>],
    extra: &[&str],
) {
    let result = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(output)
        .arg(source)
        // After the source: libraries (-l) resolve only symbols used by what precedes them.
        .args(extra)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running `cc` for {}: {e} (is gcc installed?)",
                source.display()
            )
        });
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        result.status.success(),
        "cc failed on {}:\n{stderr}",
        source.display()
    );
    for line in stderr.lines() {
        println!("cargo:warning={line}");
    }
}
