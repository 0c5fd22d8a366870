//! `profiler query`: render a time range of the agent's store to any output format.
use crate::util::status;
use std::path::PathBuf;

use anyhow::{Context as _, bail};

use crate::{
    agent::time_ago,
    store::{Query, Store},
    util::unix_now_ns,
};

#[derive(Debug, clap::Args)]
pub struct QueryArgs {
    /// The agent's data dir.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/profiler")]
    pub data_dir: PathBuf,
    /// Start of the range: a duration ago (1h, 30m, 90s) or `now`.
    #[arg(long, value_name = "TIME", default_value = "1h")]
    pub since: String,
    /// End of the range (same forms as --since).
    #[arg(long, value_name = "TIME", default_value = "now")]
    pub until: String,
    /// Only threads with this comm (repeatable).
    #[arg(long = "comm", value_name = "NAME", value_parser = crate::util::parse_comm)]
    pub comms: Vec<String>,
    /// Only this cgroup v2 path and those below it, e.g. /system.slice.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    #[arg(
        short,
        long = "output",
        value_name = "FILE",
        required = true,
        help = crate::output::OUTPUT_HELP
    )]
    pub outputs: Vec<PathBuf>,
    /// Root frame of every stack in .folded and .svg outputs.
    #[arg(long, value_enum, default_value_t = crate::profile::GroupBy::Comm)]
    pub group_by: crate::profile::GroupBy,
}

pub(super) fn run(args: QueryArgs) -> anyhow::Result<()> {
    let now = unix_now_ns();
    let since = time_ago(&args.since, now).context("--since")?;
    let until = time_ago(&args.until, now).context("--until")?;
    if since >= until {
        bail!("--since must be before --until");
    }
    let outputs = super::parse_outputs(&args.outputs, args.group_by)?;
    for o in &outputs {
        o.check_writable()?;
    }
    let store = Store::open_read(&args.data_dir)?;
    let profile = store
        .read(&Query {
            since_unix_ns: since,
            until_unix_ns: until,
            comms: args.comms,
            cgroup: args.cgroup,
        })
        .context("reading the store")?;
    if profile.samples.is_empty() {
        bail!(
            "no samples stored between --since {} and --until {}",
            args.since,
            args.until
        );
    }
    let untimed_ns: u64 = profile.meta.untimed.iter().map(|(a, b)| b - a).sum();
    status!(
        "{} samples from {:.0} s of windows{}",
        profile.samples.len(),
        profile.meta.duration_ns as f64 / 1e9,
        if untimed_ns > 0 {
            format!(
                "; {:.0} s of them without exact times (older than the agent's --keep-times): \
                 heat maps and --cpus show those seconds as such",
                untimed_ns as f64 / 1e9
            )
        } else {
            String::new()
        }
    );
    super::write_outputs(&outputs, &profile)
}
