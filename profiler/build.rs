//! Builds profiler-ebpf for bpfel-unknown-none and leaves the object in OUT_DIR, where
//! src/bpf embeds it. The eBPF crate is compiled by Debian's rustc-web (which ships a prebuilt
//! `core` for the BPF target) while the rest of the workspace uses the default toolchain;
//! `cargo xtask setup` installs it. See docs/toolchain.md.
use std::{env, path::PathBuf};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=PROFILER_EBPF_TOOLCHAIN");
    let toolchain = env::var("PROFILER_EBPF_TOOLCHAIN").unwrap_or_else(|_| "/usr".to_owned());
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.join("../profiler-ebpf");
    let root = root.to_str().expect("utf-8 path");
    // aya-ebpf needs one unstable feature (asm_experimental_arch); allowing it for that crate
    // alone keeps stable everywhere else and keeps aya-build from adding -Z build-std.
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { env::set_var("RUSTC_BOOTSTRAP", "aya_ebpf") };
    // aya-build relays the inner cargo's progress as build warnings; keep only real messages.
    // SAFETY: as above.
    unsafe { env::set_var("CARGO_TERM_QUIET", "true") };
    // The kernel matrix's deliberately broken sampler (feature matrix-broken) is the same
    // crate with its feature of that name.
    let features: &[&str] = if env::var_os("CARGO_FEATURE_MATRIX_BROKEN").is_some() {
        &["matrix-broken"]
    } else {
        &[]
    };
    println!(
        "cargo:rustc-env=PROFILER_EBPF_BUILT_BY={}",
        built_by(&toolchain)
    );
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "profiler-ebpf",
            root_dir: root,
            features,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
    .map_err(|e| {
        anyhow::anyhow!("building the eBPF programs failed ({e:#}); run `cargo xtask setup` first")
    })
}

/// The compiler and linker that build the object, as `profiler check` prints them: the
/// verifier's work depends on the code they emit (docs/kernels.md, "The same object").
fn built_by(toolchain: &str) -> String {
    let output = |program: &str, arg: &str| {
        std::process::Command::new(program)
            .arg(arg)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let rustc = output(&format!("{toolchain}/bin/rustc"), "-vV");
    let field = |name: &str| {
        rustc
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or("unknown", str::trim)
            .to_owned()
    };
    let linker = output("bpf-linker", "--version");
    format!(
        "rustc {} (LLVM {}), {}",
        field("release:"),
        field("LLVM version:"),
        linker.trim()
    )
}
