//! docs/cli.md says it is generated from `--help`: each command's block there must be what the
//! binary prints. After changing a flag, `BLESS=1 cargo test -p profiler-tests --test
//! cli_docs` rewrites the blocks (the prose around them is kept); then review the diff.

use std::path::Path;
use std::time::Duration;

use profiler_tests::run_profiler_env;

const COMMANDS: [&str; 8] = [
    "", "record", "report", "doctor", "diff", "agent", "query", "check",
];

/// `profiler [command] --help`, at the width the reference is written for.
fn help(command: &str) -> String {
    let args: Vec<&str> = [command, "--help"]
        .into_iter()
        .filter(|a| !a.is_empty())
        .collect();
    let out = run_profiler_env(&args, &[("COLUMNS", "100")], Duration::from_secs(30));
    assert!(out.status.success(), "profiler {args:?} failed");
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The byte range of the fenced block under `## profiler [command]`, its fences excluded.
fn block(doc: &str, command: &str) -> Option<std::ops::Range<usize>> {
    let heading = if command.is_empty() {
        "\n## profiler\n".to_owned()
    } else {
        format!("\n## profiler {command}\n")
    };
    let at = doc.find(&heading)? + heading.len();
    let open = at + doc[at..].find("```\n")? + 4;
    let close = open + doc[open..].find("```\n")?;
    Some(open..close)
}

#[test]
fn each_commands_help_is_the_reference() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
    let mut doc = std::fs::read_to_string(&path).expect("reading docs/cli.md");
    let bless = std::env::var_os("BLESS").is_some();
    let mut stale = Vec::new();
    for command in COMMANDS {
        let help = help(command);
        let range = block(&doc, command);
        if bless {
            match range {
                Some(r) => doc.replace_range(r, &help),
                None => {
                    // A new command goes before the closing sections (errors).
                    let section = format!("\n## profiler {command}\n\n```\n{help}```\n");
                    let at = doc.find("\n## Errors").unwrap_or(doc.len());
                    doc.insert_str(at, &section);
                }
            }
        } else if range.is_none_or(|r| doc[r] != help) {
            stale.push(if command.is_empty() {
                "profiler"
            } else {
                command
            });
        }
    }
    if bless {
        std::fs::write(&path, doc).expect("writing docs/cli.md");
        return;
    }
    assert!(
        stale.is_empty(),
        "docs/cli.md differs from --help for {stale:?}: run `BLESS=1 cargo test -p \
         profiler-tests --test cli_docs` and review the diff"
    );
}
