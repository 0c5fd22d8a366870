//! `profiler diff BEFORE AFTER`: a differential flame graph and the biggest movers.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::{
    output::{
        self,
        diff::{Folded, format_top, parse_folded, top_changes, write_diff_svg},
    },
    profile,
};

#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// The baseline: a .capture or a .folded file.
    pub before: PathBuf,
    /// The profile to compare with it: a .capture or a .folded file.
    pub after: PathBuf,
    /// Differential flame graph (.svg).
    #[arg(short, long = "output", value_name = "FILE.svg")]
    pub output: Option<PathBuf>,
    /// Print the N functions (self and inclusive) and processes whose share changed most.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
}

pub fn run(args: DiffArgs) -> anyhow::Result<()> {
    if args.output.is_none() && args.top.is_none() {
        bail!("nothing to do: give -o FILE.svg and/or --top N");
    }
    let before = load(&args.before)?;
    let after = load(&args.after)?;
    if let Some(out) = &args.output {
        if out.extension().is_none_or(|e| e != "svg") {
            bail!("{}: the diff is written as .svg", out.display());
        }
        let mut w = std::io::BufWriter::new(
            std::fs::File::create(out)
                .with_context(|| format!("cannot write {}", out.display()))?,
        );
        write_diff_svg(&before, &after, &mut w)
            .and_then(|()| std::io::Write::flush(&mut w))
            .with_context(|| format!("cannot write {}", out.display()))?;
    }
    if let Some(n) = args.top {
        print!("{}", format_top(&top_changes(&before, &after, n)));
    }
    Ok(())
}

/// Folded counts of a capture (by comm) or a folded file, told apart by the capture magic.
fn load(path: &Path) -> anyhow::Result<Folded> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.starts_with(profile::MAGIC) {
        let p = profile::read_file(path).context("cannot read the capture")?;
        return Ok(parse_folded(&output::folded_lines(&p).join("\n")));
    }
    let folded = std::str::from_utf8(&bytes)
        .map(parse_folded)
        .unwrap_or_default();
    if folded.is_empty() && !bytes.iter().all(u8::is_ascii_whitespace) {
        bail!(
            "{}: neither a capture nor folded stacks (lines of `frame;frame COUNT`)",
            path.display()
        );
    }
    Ok(folded)
}
