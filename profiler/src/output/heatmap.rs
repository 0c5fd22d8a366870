//! The heat map page (`.html`): FlameScope's sub-second heat map, a per-CPU utilisation strip
//! and flame graphs of any selected time range, in ONE self-contained file (inline JS and CSS,
//! nothing loaded from the network) that works from a mail attachment or an air-gapped laptop.
//!
//! Raw samples are not embedded (an hour on 64 CPUs at 99 Hz is 23M samples): `data` aggregates
//! them into bounded tables, written here as one JSON script element. See docs/heatmap.md.
use std::io;

use serde::{Serialize, Serializer};

use crate::profile::Profile;

mod data;
pub(crate) use data::HeatmapData;
pub use data::heatmap_data;

const STYLE: &str = include_str!("heatmap/style.css");
const SCRIPT: &str = include_str!("heatmap/app.js");

impl HeatmapData {
    /// Streams the data as JSON, safe inside a `<script>` element (`ScriptSafe`): the records
    /// can be millions, so nothing is built in memory first.
    pub(crate) fn write_json(&self, w: &mut impl io::Write) -> io::Result<()> {
        let page = PageData {
            first_s: self.span.first_s,
            cols: self.span.cols,
            rows: self.rows,
            hz: self.frequency_hz,
            start_unix_ms: self.start_unix_ms,
            untimed: &self.untimed_cols,
            untimed_n: self.untimed_samples,
            cpus: &self.cpus,
            comms: &self.comms,
            cgroups: &self.cgroups,
            frames: &self.frames,
            stacks: &self.stacks,
            grid: &self.grid,
            cpu_busy: &self.cpu_busy,
            cpu_kernel: &self.cpu_kernel,
            bucket: self.bucket,
            all_bucket: self.all_bucket,
            all_rec: &self.all_records,
            rec: &self.records,
        };
        let mut json = serde_json::Serializer::with_formatter(w, ScriptSafe);
        page.serialize(&mut json).map_err(io::Error::from)
    }
}

/// The JSON the page reads (app.js: `D`), keys in this order (tests/tests/heatmap.rs matches
/// runs of them). Records are flat arrays of numbers (`rec`: 6 per record, `all_rec`: 5), read
/// by stride.
#[derive(Serialize)]
struct PageData<'a> {
    first_s: u64,
    cols: usize,
    rows: u32,
    hz: u32,
    start_unix_ms: u64,
    untimed: &'a [u64],
    untimed_n: u64,
    cpus: &'a [u32],
    comms: &'a [String],
    /// As strings: cgroup ids can pass 2^53, where JS numbers lose digits.
    #[serde(serialize_with = "as_strings")]
    cgroups: &'a [u64],
    /// `[name, 1 if kernel code else 0]`.
    #[serde(serialize_with = "kernel_as_number")]
    frames: &'a [(String, bool)],
    stacks: &'a [Vec<u32>],
    grid: &'a [u64],
    cpu_busy: &'a [u64],
    cpu_kernel: &'a [u64],
    bucket: u32,
    all_bucket: u32,
    #[serde(serialize_with = "flat")]
    all_rec: &'a [[u64; 5]],
    #[serde(serialize_with = "flat")]
    rec: &'a [[u64; 6]],
}

fn as_strings<S: Serializer>(ids: &&[u64], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(ids.iter().map(u64::to_string))
}

fn kernel_as_number<S: Serializer>(frames: &&[(String, bool)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(
        frames
            .iter()
            .map(|(name, kernel)| (name, u8::from(*kernel))),
    )
}

fn flat<S: Serializer, const N: usize>(rows: &&[[u64; N]], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(rows.iter().flatten())
}

/// serde_json's compact output, with `<`, `>` and `&` in strings as \u escapes so no name can
/// close the script element (or open a comment in it).
struct ScriptSafe;

impl serde_json::ser::Formatter for ScriptSafe {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some(at) = rest.find(['<', '>', '&']) {
            w.write_all(&rest.as_bytes()[..at])?;
            write!(w, "\\u{:04x}", u32::from(rest.as_bytes()[at]))?;
            rest = &rest[at + 1..];
        }
        w.write_all(rest.as_bytes())
    }
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

    /// Names are the profiled programs' (thread comms, symbols): none may close the script
    /// element, and each reads back as it was.
    #[test]
    fn names_are_escaped_for_the_script_element() {
        let mut d = heatmap_data(&profile::timeline_pattern()).unwrap();
        let name = "a</script><!--&\"\\\n\u{1}é";
        d.comms[0] = name.into();
        let mut json = Vec::new();
        d.write_json(&mut json).unwrap();
        let text = String::from_utf8(json).unwrap();
        assert!(!text.contains(['<', '>', '&']), "{text}");
        assert!(
            text.contains(r#""comms":["a\u003c/script\u003e\u003c!--\u0026\"\\\n\u0001é"]"#),
            "{text}"
        );
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["comms"][0], name);
        assert_eq!(back["cgroups"], serde_json::json!(["7"]));
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
