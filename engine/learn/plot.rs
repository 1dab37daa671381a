//! Plots as PNGs, with no plotting library (flate2 and crc32fast write the file):
//!
//! - [`chart_png`]: line charts with a title, axis labels, tick values and a legend;
//! - [`hbars_png`]: horizontal bars of values in [0, 1], one labelled row each;
//! - [`curves_png`]: bare learning curves in [0, 1] (no text; the studies' `curve.png`).
//!
//! Text is drawn in a built-in 3x5 pixel font at twice its size, capitals only (lower case
//! is drawn as upper case; a character the font lacks is drawn as `?`).

use std::io::Write;

/// Series colours (RGB), cycled.
pub const COLOURS: [[u8; 3]; 8] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [23, 190, 207],
];

const BLACK: [u8; 3] = [0, 0, 0];
const GREY: [u8; 3] = [210, 210, 210];
/// Pixels per font pixel.
const SCALE: usize = 2;
/// Width and height of a character cell, spacing included.
const CW: usize = 4 * SCALE;
const CH: usize = 6 * SCALE;

/// An RGB image being drawn.
struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Self {
        Self {
            w,
            h,
            px: vec![255; w * h * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if (0..self.w as i64).contains(&x) && (0..self.h as i64).contains(&y) {
            let i = (y as usize * self.w + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    fn fill(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, c: [u8; 3]) {
        for y in y0..y1 {
            for x in x0..x1 {
                self.set(x as i64, y as i64, c);
            }
        }
    }

    /// Bresenham's line, clipped to the image.
    fn line(&mut self, a: (usize, usize), b: (usize, usize), c: [u8; 3]) {
        let (mut x, mut y) = (a.0 as i64, a.1 as i64);
        let (x1, y1) = (b.0 as i64, b.1 as i64);
        let (dx, dy) = ((x1 - x).abs(), -(y1 - y).abs());
        let (sx, sy) = (if x < x1 { 1 } else { -1 }, if y < y1 { 1 } else { -1 });
        let mut err = dx + dy;
        loop {
            self.set(x, y, c);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// A two-pixel line through the finite `points`, mapped to pixels by `to_px`; the
    /// pixels, for markers.
    fn polyline(
        &mut self,
        points: &[(f64, f64)],
        to_px: &dyn Fn((f64, f64)) -> (usize, usize),
        c: [u8; 3],
    ) -> Vec<(usize, usize)> {
        let p: Vec<(usize, usize)> = points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&p| to_px(p))
            .collect();
        for w in p.windows(2) {
            self.line(w[0], w[1], c);
            self.line((w[0].0, w[0].1 + 1), (w[1].0, w[1].1 + 1), c);
        }
        p
    }

    /// `s` with its top-left corner at `(x, y)`.
    fn text(&mut self, x: usize, y: usize, s: &str, c: [u8; 3]) {
        for (k, ch) in s.chars().enumerate() {
            let rows = glyph(ch);
            for (r, bits) in rows.iter().enumerate() {
                for col in 0..3 {
                    if bits & (0b100 >> col) != 0 {
                        let (gx, gy) = (x + k * CW + col * SCALE, y + r * SCALE);
                        self.fill(gx, gy, gx + SCALE, gy + SCALE, c);
                    }
                }
            }
        }
    }

    fn png(&self) -> std::io::Result<Vec<u8>> {
        encode(self.w, self.h, &self.px)
    }
}

/// Pixel width of `s` in the font.
fn text_width(s: &str) -> usize {
    s.chars().count() * CW
}

/// The 3x5 glyph of `c` (rows top to bottom, bit 2 the left pixel).
fn glyph(c: char) -> [u8; 5] {
    match c.to_ascii_uppercase() {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 7, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 1, 1],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        'A' => [2, 5, 7, 5, 5],
        'B' => [6, 5, 6, 5, 6],
        'C' => [3, 4, 4, 4, 3],
        'D' => [6, 5, 5, 5, 6],
        'E' => [7, 4, 6, 4, 7],
        'F' => [7, 4, 6, 4, 4],
        'G' => [3, 4, 5, 5, 3],
        'H' => [5, 5, 7, 5, 5],
        'I' => [7, 2, 2, 2, 7],
        'J' => [1, 1, 1, 5, 2],
        'K' => [5, 5, 6, 5, 5],
        'L' => [4, 4, 4, 4, 7],
        'M' => [5, 7, 7, 5, 5],
        'N' => [6, 5, 5, 5, 5],
        'O' => [2, 5, 5, 5, 2],
        'P' => [6, 5, 6, 4, 4],
        'Q' => [2, 5, 5, 6, 3],
        'R' => [6, 5, 6, 5, 5],
        'S' => [3, 4, 2, 1, 6],
        'T' => [7, 2, 2, 2, 2],
        'U' => [5, 5, 5, 5, 7],
        'V' => [5, 5, 5, 5, 2],
        'W' => [5, 5, 7, 7, 5],
        'X' => [5, 5, 2, 5, 5],
        'Y' => [5, 5, 2, 2, 2],
        'Z' => [7, 1, 2, 4, 7],
        ' ' => [0, 0, 0, 0, 0],
        '.' => [0, 0, 0, 0, 2],
        ',' => [0, 0, 0, 2, 4],
        '-' => [0, 0, 7, 0, 0],
        '+' => [0, 2, 7, 2, 0],
        '=' => [0, 7, 0, 7, 0],
        '(' => [1, 2, 2, 2, 1],
        ')' => [4, 2, 2, 2, 4],
        '[' => [3, 2, 2, 2, 3],
        ']' => [6, 2, 2, 2, 6],
        ':' => [0, 2, 0, 2, 0],
        '/' => [1, 1, 2, 4, 4],
        '_' => [0, 0, 0, 0, 7],
        '%' => [5, 1, 2, 4, 5],
        '<' => [1, 2, 4, 2, 1],
        '>' => [4, 2, 1, 2, 4],
        _ => [7, 1, 2, 0, 2],
    }
}

/// A tick value: an integer when it is one, otherwise two decimals at most.
fn tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// The y axis' range; `None`: the points' range.
    pub y_range: Option<(f64, f64)>,
    pub series: Vec<Series>,
}

const CHART_W: usize = 760;
const CHART_H: usize = 420;

/// `chart` as a PNG: the title and the y axis' label above the plot, ticks on both axes,
/// the x axis' label below, the legend on the right. Non-finite points are skipped;
/// a series of one point is drawn as a dot.
pub fn chart_png(chart: &Chart) -> std::io::Result<Vec<u8>> {
    let mut cv = Canvas::new(CHART_W, CHART_H);
    let legend_w = chart
        .series
        .iter()
        .map(|s| text_width(&s.label))
        .max()
        .unwrap_or(0)
        .min(26 * CW)
        + 3 * CW;
    let (x0, y0) = (8 * CW, 3 * CH + 6);
    let (x1, y1) = (CHART_W - legend_w - 2 * CW, CHART_H - 3 * CH);
    cv.text(CW, 4, &chart.title, BLACK);
    cv.text(CW, 4 + CH + 4, &chart.y_label, [90, 90, 90]);
    let pts = || {
        chart
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|p| p.0.is_finite() && p.1.is_finite())
    };
    let xmax = pts().map(|p| p.0).fold(0.0f64, f64::max).max(1.0);
    let (mut lo, mut hi) = chart.y_range.unwrap_or_else(|| {
        pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.1), b.max(p.1))
        })
    });
    if !(lo.is_finite() && hi.is_finite()) {
        (lo, hi) = (0.0, 1.0);
    }
    if hi - lo < 1e-9 {
        (lo, hi) = (lo - 0.5, hi + 0.5);
    }
    for q in 0..=4 {
        let y = y1 - (y1 - y0) * q / 4;
        cv.line((x0, y), (x1, y), GREY);
        let label = tick(lo + (hi - lo) * q as f64 / 4.0);
        cv.text(
            x0.saturating_sub(text_width(&label) + CW),
            y - CH / 2 + 1,
            &label,
            BLACK,
        );
        let x = x0 + (x1 - x0) * q / 4;
        cv.line((x, y1), (x, y1 + 4), BLACK);
        let label = tick(xmax * q as f64 / 4.0);
        let lx = x.saturating_sub(text_width(&label) / 2);
        cv.text(lx, y1 + 7, &label, BLACK);
    }
    cv.line((x0, y0), (x0, y1), BLACK);
    cv.line((x0, y1), (x1, y1), BLACK);
    let xl = &chart.x_label;
    cv.text(
        (x0 + x1).saturating_sub(text_width(xl)) / 2,
        CHART_H - CH - 2,
        xl,
        BLACK,
    );
    let to_px = |(x, y): (f64, f64)| {
        let fx = x0 as f64 + (x / xmax) * (x1 - x0) as f64;
        let fy = y1 as f64 - ((y - lo) / (hi - lo)).clamp(0.0, 1.0) * (y1 - y0) as f64;
        (fx.round() as usize, fy.round() as usize)
    };
    for (i, s) in chart.series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let p = cv.polyline(&s.points, &to_px, c);
        for &(x, y) in &p {
            cv.fill(x.saturating_sub(2), y.saturating_sub(2), x + 3, y + 3, c);
        }
        let ly = y0 + i * (CH + 4);
        let lx = CHART_W - legend_w;
        cv.fill(lx, ly + 2, lx + 2 * CW - 4, ly + CH - 4, c);
        let label: String = s.label.chars().take(26).collect();
        cv.text(lx + 2 * CW, ly, &label, BLACK);
    }
    cv.png()
}

/// One row of [`hbars_png`]: a label, a value in [0, 1] (NaN: no bar) and the text written
/// after the bar.
pub type Bar = (String, f64, String);

/// Horizontal bars of values in [0, 1] under a title, one labelled row each, with `x_label`
/// naming the axis.
pub fn hbars_png(title: &str, x_label: &str, bars: &[Bar]) -> std::io::Result<Vec<u8>> {
    let label_w = bars
        .iter()
        .map(|b| text_width(&b.0))
        .max()
        .unwrap_or(0)
        .min(30 * CW)
        + CW;
    let row = CH + 10;
    let h = 3 * CH + 12 + bars.len().max(1) * row + 3 * CH;
    let w = CHART_W;
    let mut cv = Canvas::new(w, h);
    cv.text(CW, 4, title, BLACK);
    let (x0, x1) = (CW + label_w, w - 12 * CW);
    let top = 3 * CH;
    for q in 0..=4 {
        let x = x0 + (x1 - x0) * q / 4;
        cv.line((x, top), (x, h - 3 * CH), GREY);
        let label = tick(q as f64 / 4.0);
        cv.text(
            x.saturating_sub(text_width(&label) / 2),
            h - 3 * CH + 4,
            &label,
            BLACK,
        );
    }
    cv.text(
        (x0 + x1).saturating_sub(text_width(x_label)) / 2,
        h - CH - 2,
        x_label,
        BLACK,
    );
    for (i, (label, v, note)) in bars.iter().enumerate() {
        let y = top + 6 + i * row;
        let label: String = label.chars().take(30).collect();
        cv.text(CW, y + 2, &label, BLACK);
        if v.is_finite() {
            let len = (v.clamp(0.0, 1.0) * (x1 - x0) as f64).round() as usize;
            cv.fill(x0, y, x0 + len.max(1), y + CH, COLOURS[i % COLOURS.len()]);
            cv.text(x0 + len + CW, y + 2, note, BLACK);
        } else {
            cv.text(x0 + CW, y + 2, note, BLACK);
        }
    }
    cv.line((x0, top), (x0, h - 3 * CH), BLACK);
    cv.png()
}

pub(super) const W: usize = 640;
pub(super) const H: usize = 360;
const MARGIN: usize = 24;

/// A `W x H` PNG of `series` (points `(x, y)`, y clamped to [0, 1]; NaN points skipped),
/// with no text.
pub fn curves_png(series: &[Vec<(f64, f64)>]) -> std::io::Result<Vec<u8>> {
    let mut cv = Canvas::new(W, H);
    let (x0, y0, x1, y1) = (MARGIN, MARGIN, W - MARGIN, H - MARGIN);
    let xmax = series
        .iter()
        .flatten()
        .map(|p| p.0)
        .filter(|x| x.is_finite())
        .fold(0.0f64, f64::max)
        .max(1.0);
    for q in 0..=4 {
        let y = y1 - (y1 - y0) * q / 4;
        cv.line((x0, y), (x1, y), [200, 200, 200]);
    }
    cv.line((x0, y0), (x0, y1), BLACK);
    cv.line((x0, y1), (x1, y1), BLACK);
    let to_px = |(x, y): (f64, f64)| {
        let fx = x0 as f64 + (x / xmax) * (x1 - x0) as f64;
        let fy = y1 as f64 - y.clamp(0.0, 1.0) * (y1 - y0) as f64;
        (fx.round() as usize, fy.round() as usize)
    };
    for (i, s) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        cv.polyline(s, &to_px, c);
    }
    cv.png()
}

/// An 8-bit RGB PNG of `w x h` pixels.
pub(super) fn encode(w: usize, h: usize, px: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::with_capacity(h * (w * 3 + 1));
    for row in px.chunks(w * 3) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&raw)?;
    let idat = z.finish()?;
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8 bits, RGB, deflate, no filter, no interlace
    for (kind, data) in [(b"IHDR", &ihdr), (b"IDAT", &idat), (b"IEND", &Vec::new())] {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(kind);
        crc.update(data);
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&crc.finalize().to_be_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pixels of a PNG written by [`encode`]: `(width, height, rows with their filter
    /// byte)`.
    fn pixels(png: &[u8]) -> (usize, usize, Vec<u8>) {
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(&png[png.len() - 8..png.len() - 4], b"IEND");
        let w = u32::from_be_bytes(png[16..20].try_into().unwrap()) as usize;
        let h = u32::from_be_bytes(png[20..24].try_into().unwrap()) as usize;
        let idat_len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
        assert_eq!(&png[37..41], b"IDAT");
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::ZlibDecoder::new(&png[41..41 + idat_len]),
            &mut raw,
        )
        .unwrap();
        assert_eq!(raw.len(), h * (w * 3 + 1));
        (w, h, raw)
    }

    #[test]
    fn a_png_with_its_chunks_and_the_lines_drawn() {
        let png = curves_png(&[
            vec![(0.0, 0.0), (10.0, 1.0)],
            vec![(0.0, 0.5), (5.0, f64::NAN)],
        ])
        .unwrap();
        let (w, h, raw) = pixels(&png);
        assert_eq!((w, h), (W, H));
        let c = COLOURS[0];
        assert!(raw.windows(3).any(|w| w == c));
        assert!(raw[(H - 1) * (W * 3 + 1) + 1..].iter().all(|b| *b == 255));
    }

    #[test]
    fn a_chart_draws_its_series_its_legend_and_its_text() {
        let series = |label: &str, pts: Vec<(f64, f64)>| Series {
            label: label.into(),
            points: pts,
        };
        let chart = Chart {
            title: "Adversary reward".into(),
            x_label: "protagonist updates".into(),
            y_label: "mean reward".into(),
            y_range: None,
            series: vec![
                series("seed 1 adversary 0", vec![(4.0, -1.0), (8.0, -0.5)]),
                series("seed 1 adversary 1", vec![(4.0, -10.0)]),
            ],
        };
        let (w, _, raw) = pixels(&chart_png(&chart).unwrap());
        assert_eq!(w, CHART_W);
        for c in &COLOURS[..2] {
            assert!(raw.windows(3).any(|p| p == c), "colour {c:?} missing");
        }
        // The title's first row of pixels is black text on white.
        let row = |y: usize| &raw[y * (w * 3 + 1) + 1..(y + 1) * (w * 3 + 1)];
        assert!(row(4).chunks(3).any(|p| p == BLACK));
        let blank = Chart {
            title: String::new(),
            series: Vec::new(),
            ..chart
        };
        let (_, _, raw) = pixels(&chart_png(&blank).unwrap());
        let row = |y: usize| &raw[y * (w * 3 + 1) + 1..(y + 1) * (w * 3 + 1)];
        assert!(row(4).chunks(3).all(|p| p == [255, 255, 255]));
    }

    #[test]
    fn bars_are_as_long_as_their_values() {
        let png = hbars_png(
            "success per fault family",
            "success",
            &[
                ("full".into(), 1.0, "4/4".into()),
                ("half".into(), 0.5, "2/4".into()),
                ("none".into(), f64::NAN, "0 played".into()),
            ],
        )
        .unwrap();
        let (w, _, raw) = pixels(&png);
        let count = |c: [u8; 3]| raw.chunks(3).filter(|p| *p == c).count();
        let (a, b) = (count(COLOURS[0]), count(COLOURS[1]));
        assert!(a > 0 && b > 0);
        let ratio = b as f64 / a as f64;
        assert!((0.45..0.55).contains(&ratio), "bar areas {a} and {b}");
        assert_eq!(count(COLOURS[2]), 0, "a NaN value drew a bar");
        assert_eq!(w, CHART_W);
    }

    #[test]
    fn every_printable_character_of_a_label_has_a_glyph() {
        for c in "abcdefghijklmnopqrstuvwxyz0123456789 .,-+=()[]:/_%<>".chars() {
            assert_ne!(glyph(c), glyph('\u{1}'), "{c}");
        }
    }
}
