//! A matrix of rates in [0, 1] as a PNG heatmap (the cross-play matrix of a tournament, the
//! points of a sweep): one cell per entry, red (0) through yellow to green (1), grey for a
//! cell without a rate, white lines between cells, no text (the report beside it names the
//! rows and columns, in the same order: row 0 at the top).

use super::plot::{encode, H, W};

const MARGIN: usize = 8;

/// The colour of rate `v` (NaN: grey).
fn colour(v: f64) -> [u8; 3] {
    if !v.is_finite() {
        return [190, 190, 190];
    }
    let v = v.clamp(0.0, 1.0);
    let (red, yellow, green) = (
        [214.0, 39.0, 40.0],
        [255.0, 221.0, 87.0],
        [44.0, 160.0, 44.0],
    );
    let (a, b, t) = if v < 0.5 {
        (red, yellow, v * 2.0)
    } else {
        (yellow, green, v * 2.0 - 1.0)
    };
    let mix = |k: usize| (a[k] + (b[k] - a[k]) * t) as u8;
    [mix(0), mix(1), mix(2)]
}

/// The most rows and columns a heatmap draws: every cell at least one white pixel and one
/// coloured.
pub const MAX_ROWS: usize = (H - 2 * MARGIN) / 2;
pub const MAX_COLS: usize = (W - 2 * MARGIN) / 2;

/// A PNG of `rows` (each a row of rates; ragged rows are padded with grey). More than
/// [`MAX_ROWS`] rows or [`MAX_COLS`] columns is an error (`InvalidInput`): the cells would
/// have no pixels.
pub fn heatmap_png(rows: &[Vec<f64>]) -> std::io::Result<Vec<u8>> {
    let mut px = vec![255u8; W * H * 3];
    let m = rows.len().max(1);
    let n = rows.iter().map(Vec::len).max().unwrap_or(0).max(1);
    if m > MAX_ROWS || n > MAX_COLS {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{m} rows x {n} columns: a heatmap draws at most {MAX_ROWS} x {MAX_COLS}"),
        ));
    }
    let (cw, ch) = ((W - 2 * MARGIN) / n, (H - 2 * MARGIN) / m);
    for y in 0..H {
        for x in 0..W {
            let (Some(cx), Some(cy)) = (x.checked_sub(MARGIN), y.checked_sub(MARGIN)) else {
                continue;
            };
            let (j, i) = (cx / cw.max(1), cy / ch.max(1));
            // One pixel of white between cells.
            if i >= m || j >= n || cx % cw.max(1) == 0 || cy % ch.max(1) == 0 {
                continue;
            }
            let v = rows[i].get(j).copied().unwrap_or(f64::NAN);
            let k = (y * W + x) * 3;
            px[k..k + 3].copy_from_slice(&colour(v));
        }
    }
    encode(W, H, &px)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_take_the_colour_of_their_rate() {
        assert_eq!(colour(0.0), [214, 39, 40]);
        assert_eq!(colour(1.0), [44, 160, 44]);
        assert_eq!(colour(f64::NAN), [190, 190, 190]);
        let png = heatmap_png(&[vec![0.0, 1.0], vec![f64::NAN]]).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let idat_len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::ZlibDecoder::new(&png[41..41 + idat_len]),
            &mut raw,
        )
        .unwrap();
        // The centre of the top-left cell is red, of the top-right green.
        let at = |x: usize, y: usize| {
            let k = y * (W * 3 + 1) + 1 + x * 3;
            [raw[k], raw[k + 1], raw[k + 2]]
        };
        assert_eq!(at(W / 4, H / 4), colour(0.0));
        assert_eq!(at(3 * W / 4, H / 4), colour(1.0));
        assert_eq!(at(3 * W / 4, 3 * H / 4), colour(f64::NAN));
        // The most that fit still draws every cell; one more is refused, not drawn blank.
        assert!(heatmap_png(&vec![vec![0.0; MAX_COLS]; MAX_ROWS]).is_ok());
        let e = heatmap_png(&[vec![0.0; MAX_COLS + 1]]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(heatmap_png(&vec![vec![0.0]; MAX_ROWS + 1]).is_err());
    }
}
