//! Learning curves as a PNG: one line per series over a shared x range, y from 0 to 1, grid
//! lines at quarters, no text (the report beside it names the axes and series). Written with
//! flate2 and crc32fast, no plotting library.

use std::io::Write;

/// Series colours (RGB), cycled.
pub const COLOURS: [[u8; 3]; 6] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
];

pub(super) const W: usize = 640;
pub(super) const H: usize = 360;
const MARGIN: usize = 24;

/// A `W x H` PNG of `series` (points `(x, y)`, y clamped to [0, 1]; NaN points skipped).
pub fn curves_png(series: &[Vec<(f64, f64)>]) -> std::io::Result<Vec<u8>> {
    let mut px = vec![255u8; W * H * 3];
    let (x0, y0, x1, y1) = (MARGIN, MARGIN, W - MARGIN, H - MARGIN);
    let xmax = series
        .iter()
        .flatten()
        .map(|p| p.0)
        .filter(|x| x.is_finite())
        .fold(0.0f64, f64::max)
        .max(1.0);
    let grey = [200, 200, 200];
    for q in 0..=4 {
        let y = y1 - (y1 - y0) * q / 4;
        line(&mut px, (x0, y), (x1, y), grey);
    }
    line(&mut px, (x0, y0), (x0, y1), [0, 0, 0]);
    line(&mut px, (x0, y1), (x1, y1), [0, 0, 0]);
    let to_px = |(x, y): (f64, f64)| {
        let fx = x0 as f64 + (x / xmax) * (x1 - x0) as f64;
        let fy = y1 as f64 - y.clamp(0.0, 1.0) * (y1 - y0) as f64;
        (fx.round() as usize, fy.round() as usize)
    };
    for (i, s) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let pts: Vec<(usize, usize)> = s
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&p| to_px(p))
            .collect();
        for w in pts.windows(2) {
            line(&mut px, w[0], w[1], c);
            line(&mut px, (w[0].0, w[0].1 + 1), (w[1].0, w[1].1 + 1), c);
        }
    }
    encode(&px)
}

/// Bresenham's line, clipped to the image.
fn line(px: &mut [u8], a: (usize, usize), b: (usize, usize), c: [u8; 3]) {
    let (mut x, mut y) = (a.0 as i64, a.1 as i64);
    let (x1, y1) = (b.0 as i64, b.1 as i64);
    let (dx, dy) = ((x1 - x).abs(), -(y1 - y).abs());
    let (sx, sy) = (if x < x1 { 1 } else { -1 }, if y < y1 { 1 } else { -1 });
    let mut err = dx + dy;
    loop {
        if (0..W as i64).contains(&x) && (0..H as i64).contains(&y) {
            let i = (y as usize * W + x as usize) * 3;
            px[i..i + 3].copy_from_slice(&c);
        }
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

/// An 8-bit RGB PNG of `W x H` pixels.
pub(super) fn encode(px: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::with_capacity(H * (W * 3 + 1));
    for row in px.chunks(W * 3) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&raw)?;
    let idat = z.finish()?;
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(W as u32).to_be_bytes());
    ihdr.extend_from_slice(&(H as u32).to_be_bytes());
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

    #[test]
    fn a_png_with_its_chunks_and_the_lines_drawn() {
        let png = curves_png(&[
            vec![(0.0, 0.0), (10.0, 1.0)],
            vec![(0.0, 0.5), (5.0, f64::NAN)],
        ])
        .unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(&png[png.len() - 8..png.len() - 4], b"IEND");
        // Decompress the pixels: the first series' colour is there, the last row is white.
        let idat_len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
        assert_eq!(&png[37..41], b"IDAT");
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::ZlibDecoder::new(&png[41..41 + idat_len]),
            &mut raw,
        )
        .unwrap();
        assert_eq!(raw.len(), H * (W * 3 + 1));
        let c = COLOURS[0];
        assert!(raw.windows(3).any(|w| w == c));
        assert!(raw[(H - 1) * (W * 3 + 1) + 1..].iter().all(|b| *b == 255));
    }
}
