//! The layering of docs/architecture.md holds for every import: its table "Layering" lists,
//! for each folder of profiler/src, the folders its product code may use, and this test reads
//! that table and every `crate::` path (and every `super::` path that climbs to the crate
//! root) in profiler/src. Test code is exempt (`tests.rs` files and `#[cfg(test)]` items): a
//! test may check a stage's result with a later stage. The table itself must have no cycle.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiler/src")
}

/// folder -> the folders it may import, from the doc's table.
fn rules() -> BTreeMap<String, BTreeSet<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md");
    let doc = std::fs::read_to_string(&path).expect("docs/architecture.md");
    let section = doc
        .split("\n## Layering\n")
        .nth(1)
        .expect("a '## Layering' section in docs/architecture.md");
    let names = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(|w| w.trim().trim_matches('`').to_owned())
            .filter(|w| !w.is_empty() && w != "nothing")
            .collect()
    };
    let mut rules = BTreeMap::new();
    for line in section.lines().take_while(|l| !l.starts_with("## ")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if let [_, folder, may, ..] = cells[..]
            && folder.starts_with('`')
        {
            rules.insert(folder.trim_matches('`').to_owned(), names(may));
        }
    }
    assert!(
        rules.len() > 10,
        "the Layering table was not read: {rules:?}"
    );
    rules
}

/// `text` without comments and without its `#[cfg(test)]` items.
fn product_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().map(|l| l.split("//").next().unwrap_or(""));
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        // Skip the item: to its `;` if it has no body, else to the brace that closes it.
        let mut depth = 0i32;
        for item in lines.by_ref() {
            depth += item.matches('{').count() as i32 - item.matches('}').count() as i32;
            if depth <= 0 && (item.trim_end().ends_with(';') || item.trim_end().ends_with('}')) {
                break;
            }
        }
    }
    out
}

/// The top-level folders (or root files) a file's product code names.
fn imports(module_depth: usize, code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::x, b}`: the first name of each top-level entry.
            let mut depth = 0;
            let mut entry_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => entry_start = true,
                    c if entry_start && !c.is_whitespace() => {
                        found.insert(ident(&group[i..]));
                        entry_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(rest));
        }
    }
    // `super::` as many times as the file is deep reaches the crate root.
    let climb = "super::".repeat(module_depth);
    if module_depth > 0 {
        for (at, _) in code.match_indices(&climb) {
            let before = code[..at].chars().last();
            if before.is_none_or(|c| !c.is_ascii_alphanumeric() && c != ':') {
                found.insert(ident(&code[at + climb.len()..]));
            }
        }
    }
    found.retain(|m| !m.is_empty() && m != "self");
    found
}

/// (folder, file, module depth) of every product source file below a folder.
fn files(dir: &Path, folder: &str, out: &mut Vec<(String, PathBuf, usize)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, folder, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            let rel = path.strip_prefix(src()).unwrap();
            let depth = rel.components().count() - usize::from(rel.ends_with("mod.rs"));
            out.push((folder.to_owned(), path, depth));
        }
    }
}

#[test]
fn every_import_follows_the_layering_in_the_architecture_doc() {
    let rules = rules();
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(src()).unwrap().flatten() {
        let path = entry.path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if ["lib", "main"].contains(&name.as_str()) {
            continue; // the module tree and the binary: they name every folder
        }
        assert!(
            rules.contains_key(&name),
            "profiler/src/{name} has no row in the Layering table of docs/architecture.md"
        );
        if path.is_dir() {
            files(&path, &name, &mut sources);
        } else {
            sources.push((name, path, 1));
        }
    }
    let mut broken = Vec::new();
    for (folder, path, depth) in &sources {
        let code = product_code(&std::fs::read_to_string(path).unwrap());
        for used in imports(*depth, &code) {
            if used != *folder && !rules[folder].contains(&used) {
                let rel = path.strip_prefix(src()).unwrap().display().to_string();
                broken.push(format!("{rel}: {folder} -> {used}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports the Layering table does not allow:\n{}",
        broken.join("\n")
    );
    eprintln!(
        "{} files checked against {} rules",
        sources.len(),
        rules.len()
    );
}

#[test]
fn the_layering_has_no_cycle() {
    let rules = rules();
    // Kahn's algorithm: repeatedly take the folders whose allowed imports are all taken.
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    let mut order = Vec::new();
    while placed.len() < rules.len() {
        let ready: Vec<&str> = rules
            .iter()
            .filter(|(f, may)| {
                !placed.contains(f.as_str()) && may.iter().all(|m| placed.contains(m.as_str()))
            })
            .map(|(f, _)| f.as_str())
            .collect();
        assert!(
            !ready.is_empty(),
            "a cycle (or an unknown folder) among {:?}",
            rules
                .keys()
                .filter(|f| !placed.contains(f.as_str()))
                .collect::<Vec<_>>()
        );
        placed.extend(&ready);
        order.push(ready.join(" "));
    }
    eprintln!("layers, bottom up: {}", order.join(" | "));
}

/// The checker sees what it must: grouped imports, paths in expressions, climbs to the root,
/// and not what it must not (comments, test items).
#[test]
fn the_checker_reads_imports_the_way_rust_does() {
    let code = product_code(
        "use crate::{a::X, b, c::{d, e}};\n\
         // crate::commented\n\
         fn f() { crate::g::h(); super::super::i::j(); }\n\
         #[cfg(test)]\n\
         mod tests {\n    use crate::tested;\n    fn t() { if x { crate::deep(); } }\n}\n\
         #[cfg(test)]\n\
         pub(crate) use crate::only_tests::X;\n\
         fn after() { crate::k::l(); }\n",
    );
    let found: Vec<String> = imports(2, &code).into_iter().collect();
    assert_eq!(found, ["a", "b", "c", "g", "i", "k"]);
    assert!(
        !imports(3, &code).contains("i"),
        "three levels deep, super::super is no climb"
    );
}
