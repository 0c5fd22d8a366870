//! `profiler diff BEFORE AFTER`: a differential flame graph and the biggest movers.
use std::path::{Path, PathBuf};

use std::io::Read as _;

use anyhow::{Context as _, bail};

use crate::{
    output::{
        self,
        diff::{Folded, format_top, parse_folded, top_changes, write_diff_svg},
    },
    profile, util,
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

pub(super) fn run(args: DiffArgs) -> anyhow::Result<()> {
    if args.output.is_none() && args.top.is_none() {
        bail!("nothing to do: give -o FILE.svg and/or --top N");
    }
    let before = load(&args.before)?;
    let after = load(&args.after)?;
    if let Some(out) = &args.output {
        if out.extension().is_none_or(|e| e != "svg") {
            bail!("{}: the diff is written as .svg", out.display());
        }
        crate::util::write_atomic(out, |w| write_diff_svg(&before, &after, w))
            .with_context(|| format!("cannot write {}", out.display()))?;
    }
    if let Some(n) = args.top {
        let top = format_top(&top_changes(&before, &after, n));
        let _ = std::io::Write::write_all(&mut std::io::stdout(), top.as_bytes());
    }
    Ok(())
}

/// Most bytes read from a folded file. It holds one line per distinct stack, so even long
/// recordings of busy hosts stay far below; past this, the file is likely not folded stacks.
const MAX_FOLDED_FILE: u64 = 256 << 20;

/// Folded counts of a capture (by comm) or a folded file, told apart by the capture magic.
/// Only regular files are read (not `/dev/zero`, not a FIFO); empty inputs are errors, as a
/// diff against nothing would print a meaningless table.
fn load(path: &Path) -> anyhow::Result<Folded> {
    let cannot = || format!("cannot read {}", path.display());
    let mut head = Vec::with_capacity(8);
    util::open_regular(path)
        .and_then(|f| f.take(8).read_to_end(&mut head))
        .with_context(cannot)?;
    let folded = if head == profile::MAGIC {
        let p = profile::read_file(path).context("cannot read the capture")?;
        if p.samples.is_empty() {
            bail!("{}: the capture holds no samples", path.display());
        }
        parse_folded(&output::folded_lines(&p).join("\n"))
    } else {
        let bytes = util::read_regular(path, MAX_FOLDED_FILE).with_context(cannot)?;
        let text = std::str::from_utf8(&bytes).map_err(|_| {
            anyhow::anyhow!(
                "{}: neither a capture nor folded stacks (lines of `frame;frame COUNT`)",
                path.display()
            )
        })?;
        parse_folded(text)
    };
    folded.with_context(|| format!("{}: not usable folded stacks", path.display()))
}
