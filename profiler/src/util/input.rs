//! Why a value a user typed (a flag, a config key, a query parameter) was refused: the error
//! of the small parsers that clap's `value_parser`, the agent's config file and its HTTP API
//! share. Each is a leaf, one line naming the text and the form wanted: clap shows only an
//! error's own `Display`, so nothing here hides part of its message in a `source()`.

/// A value typed by a user that does not parse or is out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("`{0}` is not a duration; write e.g. 10s, 500ms, 2m, 1d")]
    NotDuration(String),
    #[error("`{text}`: unknown unit `{unit}`; use ms, s, m, h or d")]
    DurationUnit { text: String, unit: String },
    #[error("`{0}` must be a positive duration")]
    NotPositive(String),
    #[error("window `{0}` must be between 1s and 1h")]
    Window(String),
    #[error("`{0}` is not a size; write e.g. 1GiB, 500MiB")]
    NotSize(String),
    #[error(
        "`{text}`: unknown unit `{unit}`; use B, KiB (K), MiB (M), GiB (G), or KB, MB, GB (powers of 1000)"
    )]
    SizeUnit { text: String, unit: String },
    #[error("max size `{0}` is below 1MiB")]
    SizeBelowMiB(String),
    #[error("expected a size such as 64M, 512K or 1G (bytes, at most a few GiB), got `{0}`")]
    Bytes(String),
    #[error("frequency must be a whole number of Hz in 1..=10000, got `{0}`")]
    Frequency(String),
    #[error("frequency must be in 1..=1000 Hz for the agent, got {0}")]
    AgentFrequency(u32),
    #[error("`{0}` is not a whole number")]
    NotWholeNumber(String),
    #[error("listen address `{0}` is not IP:PORT (e.g. 127.0.0.1:7070)")]
    Listen(String),
}
