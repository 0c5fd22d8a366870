//! Last stage: render a profile to files. The kind of each output comes from its file name.
mod folded;
mod svg;

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
};

pub use folded::{folded_lines, write_folded};
pub use svg::write_svg;

use crate::profile::{self, Profile};

/// An output format, chosen by file extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `.capture`: the native, re-renderable capture.
    Capture,
    /// `.folded`: Brendan Gregg's folded stacks.
    Folded,
    /// `.svg`: an interactive flame graph (inferno).
    Svg,
}

/// Extensions we write, for error messages and --help.
pub const EXTENSIONS: &str = ".capture, .folded, .svg";

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{path}: unknown output format; use one of these extensions: {EXTENSIONS}")]
    UnknownFormat { path: String },
    #[error("cannot write {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error(transparent)]
    Capture(#[from] profile::CaptureError),
}

/// An output the user asked for.
#[derive(Clone, Debug)]
pub struct Output {
    pub path: PathBuf,
    pub format: Format,
}

impl Output {
    /// Recognizes the format from the path.
    pub fn parse(path: &Path) -> Result<Self, OutputError> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let format = match name.rsplit_once('.').map(|(_, ext)| ext) {
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
        })
    }

    /// Fails now if the file could not be written later, so no recording is wasted.
    /// Leaves an existing file as it is; removes the file if it made it.
    pub fn check_writable(&self) -> Result<(), OutputError> {
        let existed = self.path.exists();
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .map_err(|source| self.io_error(source))?;
        if !existed {
            let _ = std::fs::remove_file(&self.path);
        }
        Ok(())
    }

    /// Renders `profile` into this output.
    pub fn write(&self, profile: &Profile) -> Result<(), OutputError> {
        if self.format == Format::Capture {
            return Ok(profile::write_file(profile, &self.path)?);
        }
        let file = File::create(&self.path).map_err(|e| self.io_error(e))?;
        let mut w = BufWriter::new(file);
        match self.format {
            Format::Folded => write_folded(profile, &mut w),
            Format::Svg => write_svg(profile, &mut w),
            Format::Capture => unreachable!("handled above"),
        }
        .and_then(|()| w.flush())
        .map_err(|e| self.io_error(e))
    }

    fn io_error(&self, source: io::Error) -> OutputError {
        OutputError::Io {
            path: self.path.display().to_string(),
            source,
        }
    }
}
