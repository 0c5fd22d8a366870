//! Pictures our outputs become, checked by content rather than by existence: a flame-graph SVG
//! must parse as XML and name the frames, a browser screenshot must have the requested size
//! and show something other than one flat colour.

use std::io::Read;

use quick_xml::events::Event;

/// The `<title>` texts of an SVG (inferno's frames: `c (123 samples, 45.00%)`), after
/// parsing the whole document as XML: a malformed file is an Err saying where.
pub fn svg_titles(svg: &str) -> Result<Vec<String>, String> {
    let mut reader = quick_xml::Reader::from_str(svg);
    let (mut titles, mut depth, mut saw_svg) = (Vec::new(), 0i64, false);
    // The text of the <title> being read: text and entity references come as separate events.
    let mut title: Option<String> = None;
    loop {
        match reader.read_event() {
            Err(e) => return Err(format!("not XML at byte {}: {e}", reader.buffer_position())),
            Ok(Event::Eof) => break,
            Ok(Event::Start(e)) => {
                depth += 1;
                saw_svg |= e.name().as_ref() == b"svg";
                if e.name().as_ref() == b"title" {
                    title = Some(String::new());
                }
            }
            Ok(Event::End(_)) => {
                depth -= 1;
                titles.extend(title.take());
            }
            Ok(Event::Text(t)) => {
                if let Some(title) = &mut title {
                    title.push_str(&t.decode().map_err(|e| format!("bad text: {e}"))?);
                }
            }
            Ok(Event::GeneralRef(r)) => {
                if let Some(title) = &mut title {
                    let name = r.decode().map_err(|e| format!("bad reference: {e}"))?;
                    let c = match name.as_ref() {
                        "amp" => '&',
                        "lt" => '<',
                        "gt" => '>',
                        "quot" => '"',
                        "apos" => '\'',
                        _ => r
                            .resolve_char_ref()
                            .map_err(|e| format!("bad reference &{name};: {e}"))?
                            .ok_or_else(|| format!("unknown entity &{name};"))?,
                    };
                    title.push(c);
                }
            }
            Ok(_) => {}
        }
    }
    if depth != 0 {
        return Err(format!("{depth} elements left open"));
    }
    if !saw_svg {
        return Err("no <svg> element".into());
    }
    Ok(titles)
}

/// The frame names of an SVG flame graph: its titles without the `(N samples, P%)` tail.
pub fn svg_frames(svg: &str) -> Result<Vec<String>, String> {
    Ok(svg_titles(svg)?
        .into_iter()
        .filter_map(|t| Some(t.rsplit_once(" (")?.0.to_owned()))
        .collect())
}

/// A decoded PNG: its size and how many distinct RGB colours its pixels have.
#[derive(Debug)]
pub struct PngSummary {
    pub width: u32,
    pub height: u32,
    pub colors: usize,
    /// Share of the pixels that differ from the most common colour (the background).
    pub non_background: f64,
}

/// Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes); anything else is
/// an Err naming what it is.
pub fn png_summary(bytes: &[u8]) -> Result<PngSummary, String> {
    const MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";
    let mut rest = bytes.strip_prefix(MAGIC).ok_or("no PNG signature")?;
    let (mut width, mut height, mut channels) = (0u32, 0u32, 0usize);
    let mut idat = Vec::new();
    while rest.len() >= 12 {
        let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        let kind = &rest[4..8];
        let data = rest.get(8..8 + len).ok_or("truncated chunk")?;
        match kind {
            b"IHDR" => {
                width = u32::from_be_bytes(data[..4].try_into().unwrap());
                height = u32::from_be_bytes(data[4..8].try_into().unwrap());
                let (depth, color, interlace) = (data[8], data[9], data[12]);
                channels = match (depth, color, interlace) {
                    (8, 2, 0) => 3,
                    (8, 6, 0) => 4,
                    _ => {
                        return Err(format!(
                            "unsupported PNG: depth {depth}, colour type {color}, interlace {interlace}"
                        ));
                    }
                };
            }
            b"IDAT" => idat.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        rest = &rest[12 + len..];
    }
    if channels == 0 {
        return Err("no IHDR".into());
    }
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(idat.as_slice())
        .read_to_end(&mut raw)
        .map_err(|e| format!("IDAT does not inflate: {e}"))?;
    let stride = width as usize * channels;
    if raw.len() != (stride + 1) * height as usize {
        return Err(format!(
            "{} bytes of pixel data for {width}x{height}",
            raw.len()
        ));
    }
    // Undo the per-row filters (PNG spec, section 9).
    let mut prev = vec![0u8; stride];
    let mut counts: std::collections::HashMap<[u8; 3], usize> = std::collections::HashMap::new();
    for row in raw.chunks(stride + 1) {
        let (filter, line) = (row[0], &row[1..]);
        let mut cur = vec![0u8; stride];
        for i in 0..stride {
            let a = if i >= channels { cur[i - channels] } else { 0 };
            let b = prev[i];
            let c = if i >= channels { prev[i - channels] } else { 0 };
            let predictor = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => u16::midpoint(u16::from(a), u16::from(b)) as u8,
                4 => paeth(a, b, c),
                f => return Err(format!("bad filter {f}")),
            };
            cur[i] = line[i].wrapping_add(predictor);
        }
        for px in cur.chunks(channels) {
            *counts.entry([px[0], px[1], px[2]]).or_default() += 1;
        }
        prev = cur;
    }
    let total = (width as usize * height as usize).max(1);
    let background = counts.values().copied().max().unwrap_or(0);
    Ok(PngSummary {
        width,
        height,
        colors: counts.len(),
        non_background: (total - background) as f64 / total as f64,
    })
}

fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let p = i16::from(a) + i16::from(b) - i16::from(c);
    let (pa, pb, pc) = (
        (p - i16::from(a)).abs(),
        (p - i16::from(b)).abs(),
        (p - i16::from(c)).abs(),
    );
    if pa <= pb && pa <= pc {
        a
    } else if pb <= pc {
        b
    } else {
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_titles_and_frames() {
        let svg = r#"<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"><g><title>a &amp; b (3 samples, 50.00%)</title></g></svg>"#;
        assert_eq!(svg_frames(svg).unwrap(), ["a & b"]);
        assert!(svg_titles("<svg><g></svg>").is_err());
        assert!(svg_titles("<html></html>").is_err());
    }

    #[test]
    fn png_of_two_colours() {
        // A 2x1 RGB image, red then white, filter 0, stored (uncompressed) in zlib.
        let pixels = [0u8, 255, 0, 0, 255, 255, 255];
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::none());
        std::io::Write::write_all(&mut z, &pixels).unwrap();
        let idat = z.finish().unwrap();
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut chunk = |kind: &[u8], data: &[u8]| {
            png.extend((data.len() as u32).to_be_bytes());
            png.extend(kind);
            png.extend(data);
            png.extend([0; 4]); // CRC: not checked
        };
        chunk(b"IHDR", &[0, 0, 0, 2, 0, 0, 0, 1, 8, 2, 0, 0, 0]);
        chunk(b"IDAT", &idat);
        chunk(b"IEND", &[]);
        let s = png_summary(&png).unwrap();
        assert_eq!((s.width, s.height, s.colors), (2, 1, 2));
        assert!((s.non_background - 0.5).abs() < 1e-9);
    }
}
