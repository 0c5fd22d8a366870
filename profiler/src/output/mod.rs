//! Last stage: render a profile to files. The kind of each output comes from its file name.
pub(crate) mod diff;
mod folded;
mod heatmap;
mod otlp;
mod perf_text;
mod pprof;
mod protobuf;
mod runq;
mod svg;
mod top;

use std::{
    collections::HashMap,
    io::{self, Write},
    path::{Path, PathBuf},
};

pub use folded::folded_lines;
pub(crate) use folded::folded_lines_by;
pub use heatmap::heatmap_data;
pub(crate) use heatmap::write_heatmap;
pub(crate) use otlp::encode_otlp;
pub use perf_text::write_perf_text;
pub use pprof::write_pprof;
pub(crate) use runq::{runq_stats, runq_table};
pub(crate) use svg::{write_svg, write_svg_lines};
pub(crate) use top::top_table;

use crate::profile::{self, GroupBy, Profile};

/// An output format, chosen by file extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// `.capture`: the native, re-renderable capture.
    Capture,
    /// `.folded`: Brendan Gregg's folded stacks.
    Folded,
    /// `.svg`: an interactive flame graph (inferno).
    Svg,
    /// `.perf.txt`: `perf script` text (FlameScope, stackcollapse-perf, speedscope read it).
    PerfText,
    /// `.html`: the self-contained sub-second heat map page with time-range flame graphs.
    Html,
    /// `.pb.gz`: gzipped pprof (profile.proto), for `go tool pprof` and profile stores.
    Pprof,
}

/// Extensions we write, for error messages and --help.
pub(crate) const EXTENSIONS: &str = ".capture, .folded, .svg, .perf.txt, .html, .pb.gz";

/// `-o` help, the same for record, report and query.
macro_rules! output_help {
    () => {
        "Output file, by extension: .svg flame graph, .folded stacks, .html heat map (time \
         travel), .perf.txt (perf script text, for FlameScope), .pb.gz (pprof), .capture (re-render \
         with `profiler report`). Repeatable."
    };
}
pub(crate) const OUTPUT_HELP: &str = output_help!();
pub(crate) const RECORD_OUTPUT_HELP: &str = concat!(
    output_help!(),
    " Default: profile-YYYYMMDD-HHMMSS.capture and .svg (UTC) here, never an existing file."
);

#[derive(Debug, thiserror::Error)]
pub(crate) enum OutputError {
    #[error("{path}: unknown output format; use one of these extensions: {EXTENSIONS}")]
    UnknownFormat { path: String },
    #[error("cannot write {path}")]
    Io { path: String, source: io::Error },
    #[error(transparent)]
    Capture(#[from] profile::CaptureError),
}

/// An output the user asked for.
#[derive(Clone, Debug)]
pub(crate) struct Output {
    pub path: PathBuf,
    pub format: Format,
    /// Root frame of stacks in folded output and flame graphs.
    pub group_by: GroupBy,
}

impl Output {
    /// Recognizes the format from the path.
    pub(crate) fn parse(path: &Path) -> Result<Self, OutputError> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        // A double extension first: `x.perf.txt` is perf text, not some other `.txt`.
        let ext = if name.ends_with(".perf.txt") {
            Some("perf.txt")
        } else if name.ends_with(".pb.gz") {
            Some("pb.gz")
        } else {
            name.rsplit_once('.').map(|(_, ext)| ext)
        };
        let format = match ext {
            Some("perf.txt") => Format::PerfText,
            Some("html") => Format::Html,
            Some("pb.gz") => Format::Pprof,
            Some("capture") => Format::Capture,
            Some("folded") => Format::Folded,
            Some("svg") => Format::Svg,
            _ => {
                return Err(OutputError::UnknownFormat {
                    path: path.display().to_string(),
                });
            }
        };
        Ok(Self {
            path: path.to_owned(),
            format,
            group_by: GroupBy::default(),
        })
    }

    /// Fails now if the file could not be written later, so no recording is wasted (the
    /// directory must take the temporary file `write` renames). Leaves everything as it was.
    pub(crate) fn check_writable(&self) -> Result<(), OutputError> {
        crate::util::check_atomic_writable(&self.path).map_err(|source| self.io_error(source))
    }

    /// Renders `profile` into this output, reusing folded lines already built for this grouping (`.folded` and
    /// `.svg` of one profile need the same ones, and building them is most of the work).
    fn write_cached(
        &self,
        profile: &Profile,
        folded: &mut HashMap<GroupBy, Vec<String>>,
    ) -> Result<(), OutputError> {
        if self.format == Format::Capture {
            return Ok(profile::write_file(profile, &self.path)?);
        }
        let lines = match self.format {
            Format::Folded | Format::Svg => folded
                .entry(self.group_by)
                .or_insert_with(|| folded_lines_by(profile, self.group_by))
                .as_slice(),
            _ => &[],
        };
        // Through a temporary file: a render that fails leaves an older output intact.
        crate::util::write_atomic(&self.path, |w| match self.format {
            Format::Folded => lines.iter().try_for_each(|l| writeln!(w, "{l}")),
            Format::Svg => write_svg_lines(profile, lines, w),
            Format::PerfText => write_perf_text(profile, w),
            Format::Html => write_heatmap(profile, w),
            Format::Pprof => write_pprof(profile, w),
            Format::Capture => unreachable!("handled above"),
        })
        .map_err(|e| self.io_error(e))
    }

    fn io_error(&self, source: io::Error) -> OutputError {
        OutputError::Io {
            path: self.path.display().to_string(),
            source,
        }
    }
}

/// Writes every output of one profile, building shared intermediate data once.
pub(crate) fn write_all(outputs: &[Output], profile: &Profile) -> Result<(), OutputError> {
    let mut folded = HashMap::new();
    outputs
        .iter()
        .try_for_each(|o| o.write_cached(profile, &mut folded))
}
