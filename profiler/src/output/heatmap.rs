//! The heat map page (`.html`): FlameScope's sub-second heat map, a per-CPU utilisation strip
//! and flame graphs of any selected time range, in ONE self-contained file (inline JS and CSS,
//! nothing loaded from the network) that works from a mail attachment or an air-gapped laptop.
//!
//! Raw samples are not embedded (an hour on 64 CPUs at 99 Hz is 23M samples): `data` aggregates
//! them into bounded tables, written here as one JSON script element. See docs/heatmap.md.
use std::io;

use crate::profile::Profile;

mod data;
pub(crate) use data::HeatmapData;
pub use data::heatmap_data;

const STYLE: &str = include_str!("heatmap/style.css");
const SCRIPT: &str = include_str!("heatmap/app.js");

impl HeatmapData {
    /// Streams the data as JSON, safe inside a `<script>` element (`<` is escaped): the records can be millions, so no intermediate strings for them.
    #[expect(
        clippy::many_single_char_names,
        reason = "the record fields are named by their one-letter JSON keys"
    )]
    pub(crate) fn write_json(&self, w: &mut impl io::Write) -> io::Result<()> {
        let list = |items: Vec<String>| format!("[{}]", items.join(","));
        let cpus = list(self.cpus.iter().map(u32::to_string).collect());
        let comms = list(self.comms.iter().map(|c| json_str(c)).collect());
        // As strings: cgroup ids can pass 2^53, where JS numbers lose digits.
        let cgroups = list(self.cgroups.iter().map(|g| format!("\"{g}\"")).collect());
        let frames = list(
            self.frames
                .iter()
                .map(|(n, k)| format!("[{},{}]", json_str(n), u8::from(*k)))
                .collect(),
        );
        let stacks = list(
            self.stacks
                .iter()
                .map(|s| list(s.iter().map(u32::to_string).collect()))
                .collect(),
        );
        // Straight into one string: the grid and the CPU strip reach millions of cells (a
        // `String` per number peaked at 240 MB for a day on 24 CPUs).
        let nums = |v: &[u64]| {
            use std::fmt::Write as _;
            let mut out = String::with_capacity(2 * v.len() + 2);
            out.push('[');
            for (i, n) in v.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{n}");
            }
            out.push(']');
            out
        };
        let (grid, busy, kernel) = (
            nums(&self.grid),
            nums(&self.cpu_busy),
            nums(&self.cpu_kernel),
        );
        // Bounded by MAX_RECORDS: fine as one string.
        let all: Vec<u64> = self.all_records.iter().flatten().copied().collect();
        let all = nums(&all);
        let untimed = nums(&self.untimed_cols);
        write!(
            w,
            r#"{{"first_s":{},"cols":{},"rows":{},"hz":{},"start_unix_ms":{},"untimed":{untimed},"untimed_n":{},"cpus":{cpus},"comms":{comms},"cgroups":{cgroups},"frames":{frames},"stacks":{stacks},"grid":{grid},"cpu_busy":{busy},"cpu_kernel":{kernel},"bucket":{},"all_bucket":{},"all_rec":{all},"rec":["#,
            self.span.first_s,
            self.span.cols,
            self.rows,
            self.frequency_hz,
            self.start_unix_ms,
            self.untimed_samples,
            self.bucket,
            self.all_bucket,
        )?;
        for (i, r) in self.records.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let [b, c, m, g, st, n] = r;
            write!(w, "{sep}{b},{c},{m},{g},{st},{n}")?;
        }
        w.write_all(b"]}")
    }
}

/// A JSON string literal; `<`, `>` and `&` as \u escapes so no name can close the script.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || matches!(c, '<' | '>' | '&') => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Writes the page: skeleton, inline CSS, the data as a JSON script element, inline JS.
/// A profile whose samples span too long for the page is `InvalidInput`, saying so.
pub(crate) fn write_heatmap(profile: &Profile, w: &mut impl io::Write) -> io::Result<()> {
    let data = heatmap_data(profile).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let title = format!(
        "CPU heat map: {}",
        if profile.meta.hostname.is_empty() {
            "profile"
        } else {
            &profile.meta.hostname
        }
    );
    let title = title.replace('&', "&amp;").replace('<', "&lt;");
    write!(
        w,
        concat!(
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>\n",
            "<style>{style}</style></head>\n<body>\n<h1>{title}</h1>\n",
            include_str!("heatmap/body.html"),
            "<script type=\"application/json\" id=\"data\">"
        ),
        title = title,
        style = STYLE,
    )?;
    data.write_json(w)?;
    write!(w, "</script>\n<script>{SCRIPT}</script>\n</body></html>\n")
}

#[cfg(test)]
mod tests {
    use super::{data::heatmap_data_bounded, *};
    use crate::profile;

    #[test]
    fn aggregates_the_pattern_per_cell() {
        let p = profile::timeline_pattern();
        let d = heatmap_data(&p).unwrap();
        assert_eq!((d.span.cols, d.rows, d.cpus.clone()), (3, 50, vec![0, 1]));
        assert_eq!(
            (d.comms.clone(), d.cgroups.clone(), d.bucket),
            (vec!["busy".into()], vec![7], 1)
        );
        // Slices 0..10 of each second (the first 200 ms) hold 2 samples each.
        let cell = |i: usize| if i % 50 < 10 { 2 } else { 0 };
        assert_eq!(d.grid, (0..150).map(cell).collect::<Vec<_>>());
        assert_eq!(d.cpu_busy, [0, 0, 0, 20, 20, 20]);
        assert_eq!(d.cpu_kernel, [0, 0, 0, 10, 10, 10]);
        // Per slice one user and one kernel sample: 2 records of 1, all on CPU 1.
        assert_eq!(d.records.len(), 60);
        for r in &d.records {
            assert!(r[0] % 50 < 10 && r[1] == 1 && r[5] == 1, "{r:?}");
        }
        assert_eq!(d.stacks.len(), 2);
        // All CPUs together: the same here, as only CPU 1 is busy.
        let strip = |r: &[u64; 6]| [r[0], r[2], r[3], r[4], r[5]];
        assert_eq!(
            d.all_records,
            d.records.iter().map(strip).collect::<Vec<_>>()
        );
        assert_eq!(
            json_str("a</script>\"\n"),
            r#""a\u003c/script\u003e\"\u000a""#
        );
    }

    #[test]
    fn coarsens_buckets_past_the_bound_and_keeps_the_grid_exact() {
        let p = profile::timeline_pattern();
        let fine = heatmap_data(&p).unwrap();
        // 100 ms buckets would still be 12 records; 500 ms ones are 3 s x 2 stacks.
        let d = heatmap_data_bounded(&p, 10).unwrap();
        assert_eq!((d.bucket, d.records.len()), (25, 6));
        assert!(
            d.records.iter().all(|r| r[0] == r[0] / 2 * 2 && r[5] == 10),
            "{:?}",
            d.records
        );
        assert_eq!(d.records.iter().map(|r| r[5]).sum::<u64>(), 60);
        assert_eq!((d.all_bucket, d.all_records.len()), (25, 6));
        assert_eq!((d.grid, d.cpu_busy), (fine.grid, fine.cpu_busy));
    }

    /// Samples without times (old stored windows) are in no cell: their seconds are listed
    /// as untimed, for the page to mark, and counted.
    #[test]
    fn untimed_seconds_are_marked_not_drawn() {
        let mut p = profile::timeline_pattern();
        let fine = heatmap_data(&p).unwrap();
        p.meta.untimed = vec![(1_000_000_000, 2_000_000_000)];
        let mut moved = 0;
        for s in p
            .samples
            .iter_mut()
            .filter(|s| s.offset_ns / 1_000_000_000 == 1)
        {
            (s.offset_ns, s.cpu) = (1_000_000_000, profile::NO_CPU);
            moved += u64::from(s.pid != 0);
        }
        let d = heatmap_data(&p).unwrap();
        assert_eq!(
            (d.untimed_cols.clone(), d.untimed_samples),
            (vec![1], moved)
        );
        assert_eq!(d.cpus, fine.cpus, "no CPU is made up for them");
        assert!(d.grid[50..100].iter().all(|&n| n == 0));
        assert_eq!(
            (&d.grid[..50], &d.grid[100..]),
            (&fine.grid[..50], &fine.grid[100..])
        );
        let mut json = Vec::new();
        d.write_json(&mut json).unwrap();
        let json = String::from_utf8(json).unwrap();
        assert!(json.contains(r#""untimed":[1],"untimed_n":20,"#), "{json}");
    }

    #[test]
    fn page_is_self_contained() {
        let mut out = Vec::new();
        write_heatmap(&profile::timeline_pattern(), &mut out).unwrap();
        let html = String::from_utf8(out).unwrap();
        assert!(!html.contains("http://") && !html.contains("https://"));
        assert!(html.contains(r#""bucket":1,"all_bucket":1,"all_rec":[0,0,0,0,1,"#));
        assert!(html.contains(r#""rec":[0,1,0,0,0,1,"#));
    }
}
