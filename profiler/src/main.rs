//! The `profiler` binary: parse the command line, set up logging, call the library.
use clap::Parser as _;
use profiler::cli::{self, Cli};

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // One line: what is wrong. The usage text is one `--help` away.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("error: invalid arguments");
            eprintln!("{first} (see --help)");
            std::process::exit(2);
        }
        Err(e) => e.exit(), // --help, --version
    };
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    if let Err(e) = cli::run(cli) {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(1);
    }
}

/// The error and its causes on one line. Library errors already name their cause in their own
/// message (`cannot write X: <io error>`), so a cause already said is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}
