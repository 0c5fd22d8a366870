//! The `profiler` binary: parse the command line, call the library (which sets up logging).
use std::io::Write as _;

use clap::Parser as _;
use profiler::cli::{self, Cli};

fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // One line: what is wrong, with clap's details (the missing argument, the
            // possible values, a similar flag); the usage text is one `--help` away.
            // Written without `eprintln!`, which panics when stderr is a closed pipe.
            let _ = writeln!(
                std::io::stderr(),
                "{} (see --help)",
                clap_one_line(&e.render().to_string())
            );
            std::process::exit(2);
        }
        Err(e) => e.exit(), // --help, --version
    };
    cli::run(cli).unwrap_or_else(|e| {
        // `{:#}`: the error and its causes, `: `-separated. Each error names only its own
        // step and leaves its cause to `source()`, so nothing is said twice.
        let _ = writeln!(std::io::stderr(), "error: {e:#}");
        std::process::ExitCode::FAILURE
    })
}

/// clap's error text up to its usage block, on one line.
fn clap_one_line(text: &str) -> String {
    let line = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .collect::<Vec<_>>()
        .join(" ");
    if line.is_empty() {
        "error: invalid arguments".to_owned()
    } else {
        line
    }
}
