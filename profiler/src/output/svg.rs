//! Flame graph SVG through inferno, from the folded lines. Kernel frames (`_[k]`) are drawn
//! orange, apart from user code, by inferno's "java" palette (the perf convention).
use std::io;

use inferno::flamegraph::{
    self,
    color::{MultiPalette, Palette},
};

use crate::profile::{GroupBy, Profile};

pub(crate) fn write_svg(
    profile: &Profile,
    group: GroupBy,
    w: &mut impl io::Write,
) -> io::Result<()> {
    write_svg_lines(profile, &super::folded_lines_by(profile, group), w)
}

/// The flame graph of already folded `lines` (see `folded_lines_by`).
pub(crate) fn write_svg_lines(
    profile: &Profile,
    lines: &[String],
    w: &mut impl io::Write,
) -> io::Result<()> {
    let mut opts = flamegraph::Options::default();
    opts.colors = Palette::Multi(MultiPalette::Java);
    opts.count_name = "samples".into();
    opts.title = title(profile);
    opts.subtitle = Some(subtitle(profile));
    // Same input, same picture: colours from names rather than random.
    opts.hash = true;
    opts.deterministic = true;
    if lines.is_empty() {
        // inferno refuses empty input; an empty profile still deserves a readable file.
        return write!(
            w,
            r#"<?xml version="1.0" standalone="no"?><svg xmlns="http://www.w3.org/2000/svg" width="600" height="60"><text x="10" y="30">{}: no samples</text></svg>"#,
            opts.title
        );
    }
    flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), w)
}

fn title(p: &Profile) -> String {
    format!(
        "CPU flame graph: {}",
        if p.meta.hostname.is_empty() {
            "profile"
        } else {
            &p.meta.hostname
        }
    )
}

fn subtitle(p: &Profile) -> String {
    format!(
        "{} samples, {} at {} Hz on {} CPUs, {:.1} s",
        p.samples.len(),
        p.meta.event,
        p.meta.frequency_hz,
        p.meta.cpus.len(),
        p.meta.duration_ns as f64 / 1e9
    )
}
